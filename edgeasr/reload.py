"""What a SIGHUP puts into effect: the config fields marked `live` (config.opt(..., live=True)).

The running configuration is the startup one with the live keys of every reload applied; a
reload is compared with *that*, so a repeated or reverted file is reported as it is, and the
keys that still need a restart are named again until the restart happens.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from edgeasr.config import Config, as_dict


def live_keys() -> tuple[str, ...]:
    """Dotted keys a running daemon applies on SIGHUP (fields marked `live`)."""
    return tuple(key for key, f in _leaves(Config) if f.metadata.get("live"))


def _leaves(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field]]:
    hints = typing.get_type_hints(cls)
    out: list[tuple[str, dataclasses.Field]] = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += _leaves(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", f))
    return out


def changed_keys(old: Any, new: Any) -> list[str]:
    """Dotted keys whose values differ, in key-tree order."""
    a, b = flatten(as_dict(old)), flatten(as_dict(new))
    return [k for k in b if a.get(k) != b[k]]


def with_live(running: Any, new: Any) -> Any:
    """`running` with its live fields taken from `new`: what a SIGHUP puts into effect."""
    changes = {}
    for f in dataclasses.fields(running):
        old, value = getattr(running, f.name), getattr(new, f.name)
        if dataclasses.is_dataclass(old):
            changes[f.name] = with_live(old, value)
        elif f.metadata.get("live"):
            changes[f.name] = value
    return dataclasses.replace(running, **changes)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
