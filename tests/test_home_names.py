"""The home's vocabulary from the config: the home file (`vocabulary.home`), `vocabulary.names` and
`vocabulary.terms`; every kind of bad file refused in one line naming the key, the file and the
place; the config's keys; SIGHUP's re-read through VocabularySource."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from edgeasr.config import VocabularyConfig, load_config
from edgeasr.errors import ConfigError, MissingInputError
from edgeasr.home.names import load_home, vocabulary_from_config
from edgeasr.home.source import VocabularySource
from edgeasr.stages import HomeName, Vocabulary

HOME = """\
language: en
areas:
  - name: Living Room
    aliases: [Lounge, front room]
  - Kitchen                        # an area by its name alone
floors:
  - name: Upstairs
entities:
  - name: Zentrix Thermo-X
    domain: climate
    aliases: [the thermostat]
  - name: "  Reading   Lamp "      # trimmed, inner space made one
    domain: light
"""


def write(tmp_path: Path, text: str, name: str = "home.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_home_file_gives_areas_floors_and_entities(tmp_path):
    vocabulary = load_home(write(tmp_path, HOME))
    assert vocabulary == Vocabulary(
        names=(HomeName("Living Room", "area", None, ("Lounge", "front room")),
               HomeName("Kitchen", "area"),
               HomeName("Upstairs", "floor"),
               HomeName("Zentrix Thermo-X", "entity", "climate", ("the thermostat",)),
               HomeName("Reading Lamp", "entity", "light")),
        terms=(), language="en")


def test_the_config_section_adds_names_and_terms_after_the_home_file(tmp_path):
    section = VocabularyConfig(home=write(tmp_path, HOME), names=("Grandma's Radio", "kitchen"),
                               terms=("Zigbee", "zigbee", "Hue"))
    vocabulary = vocabulary_from_config(section)
    assert [(n.name, n.kind) for n in vocabulary.names] == [
        ("Living Room", "area"), ("Kitchen", "area"), ("Upstairs", "floor"), ("Zentrix Thermo-X", "entity"),
        ("Reading Lamp", "entity"), ("Grandma's Radio", "name"), ("kitchen", "name")]  # another kind: kept
    assert vocabulary.terms == ("Zigbee", "Hue")  # case folded: the first kept
    assert vocabulary.language == "en"
    assert vocabulary_from_config(VocabularyConfig()) == Vocabulary() and not Vocabulary()


def test_names_said_twice_are_kept_once_the_first(tmp_path):
    path = write(tmp_path, "areas:\n  - name: Kitchen\n    aliases: [kitchen, Cookery, COOKERY]\n"
                           "  - name: KITCHEN\n    aliases: [Galley]\n  - Hall\n"
                           "entities:\n  - {name: Kitchen, domain: light}\n")
    assert load_home(path).names == (HomeName("Kitchen", "area", None, ("Cookery",)), HomeName("Hall", "area"),
                                     HomeName("Kitchen", "entity", "light"))


def test_an_empty_home_file_is_an_empty_vocabulary(tmp_path):
    assert load_home(write(tmp_path, "# nothing yet\n")) == Vocabulary()
    assert load_home(write(tmp_path, "areas: []\nentities:\n")) == Vocabulary()


BAD = [
    ("- Kitchen\n", "the top level must be a mapping of language, areas, floors, entities, not a list"),
    ("rooms: [Kitchen]\n", "unknown key 'rooms' (allowed: language, areas, floors, entities)"),
    ("language: 42\n", "language: 42 is not a language code (en, de, pt-BR)"),
    ("language: english please\n", "language: 'english please' is not a language code (en, de, pt-BR)"),
    ("areas: Kitchen\n", "areas: a list of areas is expected, not a string"),
    ("areas:\n  - [Kitchen]\n", "areas[0]: a mapping of name, aliases is expected, not a list"),
    ("entities:\n  - {name: A, domain: light}\n  - {name: B, domain: light}\n  - {name: C, domain: light}\n"
     "  - {domain: light, aliases: [D]}\n", "entities[3]: no name"),
    ("entities:\n  - Reading Lamp\n", "entities[0]: a mapping of name, domain, aliases is expected, not a string"),
    ("floors:\n  - name: 3\n", "floors[0].name: 3 is not a string"),
    ("areas:\n  - name: '   '\n", "areas[0].name: '   ' is not allowed (1..200 characters, no control characters)"),
    (f"areas:\n  - name: {'x' * 201}\n", "areas[0].name: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... "
     "(203 characters) is not allowed (1..200 characters, no control characters)"),
    ('areas:\n  - name: "Hall\\x00"\n', "areas[0].name: 'Hall\\x00' is not allowed (1..200 characters, no control "
     "characters)"),
    ("areas:\n  - {name: Hall, aliases: Corridor}\n", "areas[0].aliases: a list of names is expected, not a string"),
    ("areas:\n  - {name: Hall, aliases: [Corridor, 7]}\n", "areas[0].aliases[1]: 7 is not a string"),
    ("areas:\n  - {name: Hall, alias: [Corridor]}\n", "areas[0]: unknown key 'alias' (allowed: name, aliases)"),
    ("entities:\n  - {name: Lamp, domain: Light}\n", "entities[0].domain: 'Light' is not a domain (lowercase "
     "letters, digits and _, as light or media_player)"),
    ("entities:\n  - {name: Lamp, domain: [light]}\n", "entities[0].domain: ['light'] is not a domain (lowercase "
     "letters, digits and _, as light or media_player)"),
    ("areas: [" + ", ".join(f"A{i}" for i in range(1001)) + "]\n", "areas: 1001 areas, at most 1000"),
    ("areas:\n  - name: Hall\n    aliases: [" + ", ".join(f"H{i}" for i in range(101)) + "]\n",
     "areas[0].aliases: 101 aliases, at most 100"),
]


@pytest.mark.parametrize("text, message", BAD, ids=[m.split(":")[0] + "-" + str(i) for i, (_, m) in enumerate(BAD)])
def test_a_bad_home_file_is_one_line_naming_key_file_and_place(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_home(path)
    assert str(info.value) == f"vocabulary.home: {path}: {message}"
    assert info.value.exit_code == 78


def test_invalid_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "areas:\n  - name: Hall\n  - name: [Kitchen\n")
    with pytest.raises(ConfigError) as info:
        load_home(path)
    assert str(info.value).startswith(f"vocabulary.home: {path}:4: invalid YAML (")
    assert "\n" not in str(info.value) and info.value.exit_code == 78


def test_a_file_that_is_not_text_or_too_large_is_refused(tmp_path):
    path = tmp_path / "home.yaml"
    path.write_bytes(b"areas: [K\xfcche]\n")
    with pytest.raises(ConfigError, match=r"^vocabulary.home: .*home.yaml: not UTF-8 text \(byte 9\)$"):
        load_home(path)
    path.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match=r"^vocabulary.home: .*home.yaml: larger than 1024 KiB$") as info:
        load_home(path)
    assert info.value.exit_code == 78


def test_a_missing_file_a_directory_or_a_fifo_is_missing_input(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    cases = [(tmp_path / "absent.yaml", "does not exist"), (tmp_path, "is a directory, not a home file"),
             (tmp_path / "fifo", "is a FIFO (named pipe), not a home file")]
    for path, what in cases:
        with pytest.raises(MissingInputError) as info:
            load_home(path)
        assert str(info.value) == f"vocabulary.home: {path} {what}"
        assert info.value.exit_code == 66


def test_the_config_keys_take_lists_and_a_path_relative_to_the_config_file(tmp_path):
    write(tmp_path, HOME)
    config = write(tmp_path, yaml.safe_dump({"vocabulary": {"home": "home.yaml", "names": ["Grandma's Radio"],
                                                            "terms": ["Zigbee"]}}), "edgeasr.yaml")
    cfg = load_config(config)
    assert cfg.vocabulary == VocabularyConfig(tmp_path / "home.yaml", ("Grandma's Radio",), ("Zigbee",))
    assert vocabulary_from_config(cfg.vocabulary).names[-1] == HomeName("Grandma's Radio", "name")
    # --set vocabulary.home=FILE: relative to the working directory, as every path on the command line
    assert load_config(None, {"vocabulary.home": "h.yaml"}).vocabulary.home == Path.cwd() / "h.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(None, {"vocabulary.names": [f"n{i}" for i in range(1001)]})
    assert str(info.value).startswith("vocabulary.names: ['n0', 'n1',") and info.value.exit_code == 78


def test_the_home_assistant_keys_go_together(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(None, {"homeassistant.url": "ws://ha.lan:8123"})
    assert str(info.value) == ("homeassistant.token_file: required when homeassistant.url is set (a long-lived "
                               "access token)")
    with pytest.raises(ConfigError) as info:
        load_config(None, {"homeassistant.token_file": "token"})
    assert str(info.value) == "homeassistant.token_file: set, but homeassistant.url is not"
    cfg = load_config(None, {"homeassistant.url": "https://ha.lan", "homeassistant.token_file": "token"})
    assert cfg.homeassistant.url == "https://ha.lan" and cfg.homeassistant.refresh_s == 300.0
    with pytest.raises(ConfigError, match=r"^homeassistant.url: 'ws://user:pw@ha.lan:8123' is not allowed"):
        load_config(None, {"homeassistant.url": "ws://user:pw@ha.lan:8123"})


def test_sighup_reads_the_home_file_again_and_a_bad_one_keeps_the_running_vocabulary(tmp_path):
    path = write(tmp_path, HOME)
    section = VocabularyConfig(home=path, terms=("Zigbee",))
    source = VocabularySource(section, load_config(None).homeassistant)
    try:
        before = source.current()
        assert before == vocabulary_from_config(section) and source.homeassistant is None
        assert source.reload(section) is False  # the same file: nothing changed
        path.write_text(HOME.replace("Kitchen", "Scullery"))
        assert source.reload(section) is True
        assert HomeName("Scullery", "area") in source.current().names
        renamed = source.current()
        path.write_text(HOME + "  - {domain: light}\n")
        with pytest.raises(ConfigError, match=r"^vocabulary.home: .*: entities\[2\]: no name$"):
            source.reload(section)
        path.unlink()
        with pytest.raises(MissingInputError):
            source.reload(section)
        assert source.current() == renamed  # the last good vocabulary runs on
        assert source.reload(VocabularyConfig(names=("Radio",))) is True
        assert source.current() == Vocabulary((HomeName("Radio", "name"),))
    finally:
        source.close()
