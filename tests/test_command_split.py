"""A command set's clips split into a part to choose on and a part to report on, by command and
entity, with a fixed seed; dev-commands-multi's split is recorded in the repository."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from edgeasr.errors import UsageError
from edgeasr.lab.evaluation.command_split import CHOOSE, PARTS, REPORT, part_of, read_split, split_key, write_split
from edgeasr.lab.evaluation.voice_commands import read_items
from edgeasr.stages import Intent

DATA = Path(__file__).parent / "data"
MULTI = Path(__file__).resolve().parents[1].parent / "shared" / "eval" / "dev-commands-multi"
LANGUAGES = ("fr", "nl", "es", "it")


def test_clips_of_one_command_said_of_one_entity_fall_in_one_part():
    lamp = Intent("HassLightSet", (("brightness", "50"), ("name", "Lampe")))
    same = Intent("HassLightSet", (("brightness", "80"), ("name", "lampe")))
    assert split_key("règle la Lampe à 50 pourcent", lamp) == split_key("règle la lampe à 80 pourcent", same)
    assert split_key("x", lamp) != split_key("x", Intent("HassLightSet", (("name", "Plafond"),)))
    assert split_key("hervat muziek", None) == split_key("Hervat alles", None)
    parts = Counter(part_of(f"HassTurnOn:name=lamp {i}") for i in range(400))
    assert set(parts) == set(PARTS) and 150 < parts[CHOOSE] < 250  # about half each
    assert part_of("HassTurnOn:name=lamp") == part_of("HassTurnOn:name=lamp")  # a fixed seed


def test_the_recorded_split_of_dev_commands_multi_is_the_one_the_seed_draws():
    """Each language's clips, read with its home (the names its references contain), in the
    part their command and entity draw; each language has clips in both parts."""
    split = read_split(DATA / "dev-commands-multi-split.tsv")
    items = read_items([MULTI] * len(LANGUAGES), [DATA / f"dev-commands-multi-home-{lang}.yaml" for lang in LANGUAGES],
                       split)
    assert len(items) == len(split) == 283
    for item in items:
        assert split[item.id] == part_of(split_key(item.reference, item.expected)), item.id
        assert item.group == f"dev-commands-multi-{item.home.language} {split[item.id]}"
    groups = Counter(item.group for item in items)
    assert all(groups[f"dev-commands-multi-{lang} {part}"] >= 9 for lang in LANGUAGES for part in PARTS)
    # the references are Home Assistant's sentences with the homes' names, but for a few the
    # intents of this release no longer read (said to the old templates)
    assert sum(item.expected is None for item in items) <= 4


def test_a_split_must_hold_every_clip_in_a_known_part(tmp_path):
    path = tmp_path / "split.tsv"
    write_split(path, [("a", "fr", CHOOSE), ("b", "fr", "later")])
    with pytest.raises(UsageError, match="no part"):
        read_split(path)
    write_split(path, [("a", "fr", REPORT)])
    with pytest.raises(UsageError, match="in no part"):
        read_items([MULTI], [DATA / "dev-commands-multi-home-it.yaml"], read_split(path))
