"""The home's vocabulary from the config: the home file `vocabulary.home` names, and the
`vocabulary.names` and `vocabulary.terms` lists.

The home file is YAML (docs/vocabulary.md):

    language: en                       # optional
    areas:    [{name: Living Room, aliases: [Lounge]}, Kitchen]
    floors:   [{name: Upstairs}]
    entities: [{name: Reading Lamp, domain: light, aliases: [Big light]}]

An area or a floor may be given as its name alone. A bad file is refused with one line naming
the key, the file, where in it and what is wrong (ConfigError, exit 78); a file that is not
there, a directory or a device, MissingInputError (66). Names are trimmed, their inner runs of
white space made one space; the same name twice in a list (case folded), or an alias equal to
its name, is kept once, the first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from edgeasr.config import (
    CONTROL_CHARACTER,
    VOCABULARY_CHARS,
    VOCABULARY_ITEMS,
    VocabularyConfig,
    parse_yaml,
    special_file,
)
from edgeasr.errors import ConfigError, MissingInputError
from edgeasr.stages import HomeName, Vocabulary

MAX_FILE_BYTES = 1 << 20  # a home of a thousand entities with aliases is well under 200 KiB
MAX_ALIASES = 100  # per area, floor or entity
LISTS = {"areas": "area", "floors": "floor", "entities": "entity"}  # the file's lists -> HomeName.kind
ITEM_KEYS = {"areas": ("name", "aliases"), "floors": ("name", "aliases"),
             "entities": ("name", "domain", "aliases")}
TOP_KEYS = ("language", *LISTS)
# Home Assistant's domains: lowercase words joined by single underscores (light, media_player)
DOMAIN = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
LANGUAGE = re.compile(r"[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{1,8}){0,3}")  # en, en-GB, zh-Hant-TW


def spoken(text: Any) -> str | None:
    """`text` as a name to hear (trimmed, inner white space one space), or None when it is not a
    string, is empty, longer than VOCABULARY_CHARS or holds control characters."""
    if not isinstance(text, str) or CONTROL_CHARACTER.search(text):
        return None
    text = " ".join(text.split())
    return text if 0 < len(text) <= VOCABULARY_CHARS else None


def home_name(name: str, kind: str, domain: str | None = None, aliases: Iterable[str] = ()) -> HomeName:
    """A HomeName whose aliases are each said once and differ from its name (case folded)."""
    seen = {name.casefold()}
    kept = []
    for alias in aliases:
        if alias.casefold() not in seen:
            seen.add(alias.casefold())
            kept.append(alias)
    return HomeName(name, kind, domain, tuple(kept))


def unique_names(names: Iterable[HomeName]) -> tuple[HomeName, ...]:
    """The first of each (kind, case-folded name), in order: Vocabulary.merged's rule."""
    kept: dict[tuple[str, str], HomeName] = {}
    for n in names:
        kept.setdefault((n.kind, n.name.casefold()), n)
    return tuple(kept.values())


def unique_terms(terms: Iterable[str]) -> tuple[str, ...]:
    kept: dict[str, str] = {}
    for t in terms:
        kept.setdefault(t.casefold(), t)
    return tuple(kept.values())


def vocabulary_from_config(section: VocabularyConfig) -> Vocabulary:
    """The config's vocabulary: the home file's names, then `names` (kind "name"), and `terms`."""
    home = load_home(section.home) if section.home is not None else Vocabulary()
    names = (HomeName(n, "name") for n in map(spoken, section.names) if n is not None)
    terms = (t for t in map(spoken, section.terms) if t is not None)
    return Vocabulary(unique_names((*home.names, *names)), unique_terms(terms), home.language)


class _Bad(Exception):
    """Where in the home file (`entities[3]`), and what is wrong there."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}" if where else what)


def load_home(path: Path, key: str = "vocabulary.home") -> Vocabulary:
    """The home file at `path` as a Vocabulary; errors name `key` and `path`."""
    data = _read(path, key)
    try:
        return _home(data)
    except _Bad as exc:
        raise ConfigError(f"{key}: {path}: {exc}") from None


def _read(path: Path, key: str) -> Any:
    kind = special_file(path)
    if kind is not None:  # a FIFO would block the reader, a device read forever
        raise MissingInputError(f"{key}: {path} is {kind}, not a home file")
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise MissingInputError(f"{key}: {path} does not exist") from None
    except IsADirectoryError:
        raise MissingInputError(f"{key}: {path} is a directory, not a home file") from None
    except OSError as exc:
        raise MissingInputError(f"{key}: {path} cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{key}: {path}: larger than {MAX_FILE_BYTES // 1024} KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{key}: {path}: not UTF-8 text (byte {exc.start})") from None
    return parse_yaml(text, path, f"{key}:")


def _home(data: Any) -> Vocabulary:
    if data is None:
        return Vocabulary()
    if not isinstance(data, dict):
        raise _Bad("", f"the top level must be a mapping of {', '.join(TOP_KEYS)}, not {_kind(data)}")
    _known_keys(data, TOP_KEYS, "")
    language = data.get("language")
    if language is not None and (not isinstance(language, str) or not LANGUAGE.fullmatch(language)):
        raise _Bad("language", f"{_shown(language)} is not a language code (en, de, pt-BR)")
    names: list[HomeName] = []
    for key, kind in LISTS.items():
        items = data.get(key)
        if items is None:
            continue
        if not isinstance(items, list):
            raise _Bad(key, f"a list of {key} is expected, not {_kind(items)}")
        if len(items) > VOCABULARY_ITEMS:
            raise _Bad(key, f"{len(items)} {key}, at most {VOCABULARY_ITEMS}")
        names += (_item(item, key, kind, f"{key}[{i}]") for i, item in enumerate(items))
    return Vocabulary(unique_names(names), (), language)


def _item(item: Any, key: str, kind: str, where: str) -> HomeName:
    if isinstance(item, str) and kind != "entity":  # an area or a floor by its name alone
        item = {"name": item}
    if not isinstance(item, dict):
        raise _Bad(where, f"a mapping of {', '.join(ITEM_KEYS[key])} is expected, not {_kind(item)}")
    _known_keys(item, ITEM_KEYS[key], where)
    if item.get("name") is None:
        raise _Bad(where, "no name")
    name = _text(item["name"], f"{where}.name")
    domain = item.get("domain")
    if domain is not None and (not isinstance(domain, str) or not DOMAIN.fullmatch(domain)):
        raise _Bad(f"{where}.domain", f"{_shown(domain)} is not a domain (lowercase letters, digits and _, "
                   "as light or media_player)")
    aliases = item.get("aliases")
    if aliases is None:
        aliases = []
    if not isinstance(aliases, list):
        raise _Bad(f"{where}.aliases", f"a list of names is expected, not {_kind(aliases)}")
    if len(aliases) > MAX_ALIASES:
        raise _Bad(f"{where}.aliases", f"{len(aliases)} aliases, at most {MAX_ALIASES}")
    return home_name(name, kind, domain, [_text(a, f"{where}.aliases[{i}]") for i, a in enumerate(aliases)])


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _Bad(where, f"{_shown(value)} is not a string")
    text = spoken(value)
    if text is None:
        raise _Bad(where, f"{_shown(value)} is not allowed (1..{VOCABULARY_CHARS} characters, no control "
                   "characters)")
    return text


def _known_keys(data: dict, allowed: tuple[str, ...], where: str) -> None:
    for name in data:
        if name not in allowed:
            raise _Bad(where, f"unknown key {_shown(name)} (allowed: {', '.join(allowed)})")


def _kind(value: Any) -> str:
    kinds: dict[type, str] = {dict: "a mapping", list: "a list", str: "a string"}
    return kinds.get(type(value), _shown(value))


def _shown(value: Any, limit: int = 60) -> str:
    """repr(value), cut short: the error stays one readable line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
