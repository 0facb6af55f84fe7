"""A command set's clips split, once and for all, into a part to choose on and a part to report
on (`edgeasr bench-commands --split FILE`).

A value chosen while looking at a clip flatters that clip, and every clip like it: the same
command said of the same entity. So the split is by command and entity, not by clip: the
clips whose expected intent has the same name and the same names, areas and floors (or, with
no intent, the same first word) fall in one part, drawn by a hash of that key with a fixed
seed, so that the split does not move when clips are added.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Iterable
from pathlib import Path

from edgeasr.errors import MissingInputError, UsageError
from edgeasr.stages import Intent

CHOOSE, REPORT = "choose", "report"
PARTS = (CHOOSE, REPORT)
# a new seed is a new split: every figure chosen on the old one is void. The first seed of
# commands-split-1, -2, ... that gave each of dev-commands-multi's languages 40-60 % of its clips
# to choose on (picked before any clip was decoded)
SEED = "commands-split-4"
CHOOSE_SHARE = 0.5  # of the keys: half to choose on, half to report on
KEYED_SLOTS = ("name", "area", "floor")  # what a command is said of (the rest: its values)
SPLIT_COLUMNS = ("id", "language", "part")
_HASH_SPAN = float(1 << 64)  # a hash's first 8 bytes, read as a share of [0, 1)


def split_key(reference: str, expected: Intent | None) -> str:
    """What keeps clips together: the command and what it is said of."""
    if expected is None:
        return "none:" + (reference.split() or [""])[0].casefold()
    said_of = sorted((slot, value.casefold()) for slot, value in expected.slots if slot in KEYED_SLOTS)
    return expected.name + ":" + ",".join(f"{slot}={value}" for slot, value in said_of)


def part_of(key: str, seed: str = SEED, share: float = CHOOSE_SHARE) -> str:
    """The part a key falls in."""
    digest = hashlib.sha256(f"{seed}\n{key}".encode()).digest()
    return CHOOSE if int.from_bytes(digest[:8], "big") / _HASH_SPAN < share else REPORT


def write_split(path: Path, rows: Iterable[tuple[str, str, str]]) -> None:
    """(id, language, part) rows as a TSV file."""
    with path.open("w", newline="") as f:
        out = csv.writer(f, delimiter="\t", lineterminator="\n")
        out.writerow(SPLIT_COLUMNS)
        out.writerows(rows)


def read_split(path: Path) -> dict[str, str]:
    """A split file: clip id -> part."""
    if not path.is_file():
        raise MissingInputError(f"--split: {path} does not exist")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    bad = [r.get("id") for r in rows if r.get("part") not in PARTS]
    if bad:
        raise UsageError(f"--split: {path}: clips {', '.join(map(str, bad[:3]))} have no part "
                         f"({' or '.join(PARTS)})")
    return {r["id"]: r["part"] for r in rows}
