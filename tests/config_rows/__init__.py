"""One row per config key (tests/test_config_keys.py), by section."""

from __future__ import annotations

from config_rows import audio, engine, home, mqtt, serving
from config_rows.lab import Row

ROWS: dict[str, Row] = {}
for section in (audio, engine, serving, mqtt, home):
    assert not ROWS.keys() & section.rows.rows.keys()
    ROWS.update(section.rows.rows)
