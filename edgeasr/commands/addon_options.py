"""The Home Assistant add-on's options (the form the Supervisor shows, saved as
/data/options.json) mapped onto edgeasr's configuration keys.

Each option is one key of config/edgeasr.yaml, with that key's default and limits: the add-on's
config.yaml declares them again in the Supervisor's schema language, and tests/test_addon.py
keeps the two in step. `home_names` alone is no key: on, it points `homeassistant.url` at the
Supervisor's websocket proxy with the add-on's own token. What the add-on fixes is in FIXED.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgeasr.errors import ConfigError, EdgeAsrError, MissingInputError

DATA_DIR = Path("/data")  # the add-on's persistent folder (models, state)
OPTIONS_FILE = DATA_DIR / "options.json"
WYOMING_PORT = 10300  # config.yaml's ports: 10300/tcp
# option -> edgeasr's dotted config key
KEYS = {
    "model": "model.path",
    "language": "model.language",
    "encoder": "encoder.backend",
    "endpoint_ms": "wyoming.endpoint_ms",
    "log_level": "log.level",
}
HOME_NAMES = "home_names"
OPTIONS = (*KEYS, HOME_NAMES)
# what every add-on start runs: no microphone, the Wyoming server on the add-on's port, the
# models and the outbox under /data
FIXED = {
    "state_dir": str(DATA_DIR),
    "input.source": "none",
    "wyoming.uri": f"tcp://0.0.0.0:{WYOMING_PORT}",
}


def read_options(path: Path) -> dict[str, Any]:
    """options.json as a mapping of known options (an unknown one is a ConfigError naming it).
    None there (a Docker user's new volume) is no option set: every key at edgeasr's default."""
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise MissingInputError(f"{path}: cannot read ({exc})") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the options must be a JSON object")
    for name in data:
        if name not in OPTIONS:
            raise ConfigError(f"{path}: {name}: unknown option (allowed: {', '.join(OPTIONS)})")
    return data


def config_keys(options: Mapping[str, Any], names_url: str | None, token_file: Path | None) -> dict[str, Any]:
    """edgeasr's dotted config keys for these options: FIXED, each option present, and Home
    Assistant's names through `names_url` with `token_file` when `home_names` is on and a
    Supervisor is there to give them (both not None)."""
    keys: dict[str, Any] = dict(FIXED)
    # an optional field the form left empty is the key's default (null)
    keys.update({KEYS[name]: value for name, value in options.items() if name in KEYS and value not in ("", None)})
    if options.get(HOME_NAMES) is True and names_url is not None and token_file is not None:
        keys.update({"homeassistant.url": names_url, "homeassistant.token_file": str(token_file)})
    return keys


def nested(keys: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys as the nested mapping a YAML configuration file holds."""
    tree: dict[str, Any] = {}
    for key, value in keys.items():
        *parents, leaf = key.split(".")
        node = tree
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return tree


def named_by_option(exc: EdgeAsrError, path: Path) -> EdgeAsrError:
    """`exc` (from loading the configuration) retold with the option that set the key it names,
    the same class and so the same exit code; unchanged when no option set it."""
    message = str(exc)
    for name, key in KEYS.items():
        if message.startswith(key + ":"):
            retold = type(exc)(f"{path}: {name}{message[len(key):]}")
            retold.__cause__ = exc
            return retold
    return exc
