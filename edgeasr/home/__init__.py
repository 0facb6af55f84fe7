"""The home a command speaks of: its names (areas, floors, entities and their aliases) and other
terms, read from the config's `vocabulary` section, the home file it names and Home Assistant's
websocket API, and merged into one frozen `stages.Vocabulary` that a request carries.

`names.py` reads the home file and the config's lists; `homeassistant.py` fetches the names
Home Assistant exposes to Assist (the only module importing `websockets`) and keeps them fresh
on a thread of its own; `source.py` is what the daemon holds: the two merged, the config's
first, and re-read on SIGHUP.
"""
