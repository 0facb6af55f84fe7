"""Spoken commands, heard with and without the home's names, judged by Home Assistant's own
matcher (`edgeasr bench-commands`).

One process: every utterance is transcribed by every row in turn, the order rotating from one
utterance to the next, so that a busy spell of a shared machine slows them alike. The rows:
edgeasr without a vocabulary, edgeasr with the home's (and, asked for, with each of its means alone:
the prompt, the boost, the grammar), faster-whisper greedy, and faster-whisper
beam 5 with the home's names as `initial_prompt` (what wyoming-faster-whisper does with Home
Assistant's names; the text is asr/vocabulary.py's `prompt_text`, the one edgeasr's prompt is
cut from). faster-whisper reads the CTranslate2 model the bundle was imported from.

Per group of each set (its manifest's `group` column; a set without one is one group named
after the set) and over all of them:
- sentence accuracy: the hypothesis equals the reference after Whisper's normalizer, word for
  word (the basic normalizer of other languages than English leaves a space where a mark was;
  outside English numbers said in words count as their digits and "%" as the word said for it,
  scoring.sentence_normalizer: "à 55%" is "à 55 pourcent" said);
- intent accuracy: the intent Home Assistant's matcher (edgeasr.home.sentences) finds in the
  hypothesis equals the expected one: the same intent and the same slots with the same values
  (free text compared case folded; an area or entity said by one of its aliases is the area or
  entity itself, which Home Assistant acts on either way); for speech that is not a command the expected is none, so a
  command found there is wrong, and also counted apart;
- wrong actions: Home Assistant would do something other than what was said (another intent,
  another slot value, or a command where none was said); no intent found is no action, not a
  wrong one;
- empty transcripts; latency median (ms per utterance).
The expected intent is the manifest's `intent` column (JSON, `models command-set` writes it),
or, for a set without one, what the matcher finds in the reference with the set's home.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgeasr.asr.commands.vocabulary import MEANS
from edgeasr.errors import UsageError
from edgeasr.lab.evaluation.runs import faster_whisper, row_config
from edgeasr.stages import Intent, Vocabulary

if TYPE_CHECKING:
    from edgeasr.home.sentences import HomeSentences

ROWS = {
    "edgeasr": "edgeasr",
    "edgeasr-vocabulary": "edgeasr + the home's vocabulary",
    "edgeasr-vocabulary-unbudgeted": "edgeasr + the home's vocabulary, the reading's time unbounded",
    "faster-whisper": "faster-whisper greedy",
    "faster-whisper-beam5-names": "faster-whisper beam 5 + names prompt",
}
UNBUDGETED = "edgeasr-vocabulary-unbudgeted"  # what the reading's budget cuts: asked for by --rows
DEFAULT_ROWS = tuple(r for r in ROWS if r != UNBUDGETED)
# the vocabulary heard by some of its means only (asr/vocabulary.MEANS), run when --rows names
# them: edgeasr-prompt, edgeasr-boost+grammar, ...
MEANS_ROW = "edgeasr-"


def means_of(row: str) -> frozenset[str] | None:
    """The means a row hears the vocabulary with ("edgeasr-boost+grammar"), None if it is not such a row."""
    means = row.removeprefix(MEANS_ROW).split("+") if row.startswith(MEANS_ROW) else []
    return frozenset(means) if means and set(means) <= set(MEANS) else None


def row_title(row: str) -> str:
    means = means_of(row)
    return ROWS.get(row) or f"edgeasr + the home's {' + '.join(m for m in MEANS if m in (means or ()))} only"


FW_BEAM = 5
ALL = "all"


@dataclass(frozen=True)
class Home:
    """A set's home: its names, its sentences (Home Assistant's matcher) and its language."""

    vocabulary: Vocabulary
    sentences: HomeSentences
    language: str

    @functools.cached_property
    def aliases(self) -> dict[tuple[str, str], str]:
        return alias_targets(self.vocabulary)


@dataclass(frozen=True)
class Item:
    id: str
    path: Path
    reference: str
    group: str
    expected: Intent | None  # None: not a command
    home: Home


# the slot Home Assistant's matcher puts a name of each kind in, where an alias stands for it
ALIASED_SLOTS = {"entity": "name", "area": "area"}


def alias_targets(vocabulary: Vocabulary) -> dict[tuple[str, str], str]:
    """(slot, an alias case folded) -> the name of the entity or area it stands for: Home
    Assistant's matcher fills the slot with the alias said, and acts on the same entity or area
    as for its name (a floor's alias is already filled in as the floor's name)."""
    return {(ALIASED_SLOTS[n.kind], alias.casefold()): n.name
            for n in vocabulary.names if n.kind in ALIASED_SLOTS for alias in n.aliases}


def same_intent(got: Intent | None, expected: Intent | None,
                aliases: Mapping[tuple[str, str], str] | None = None) -> bool:
    """The same intent with the same slots and values (case folded: free text such as a search
    query keeps the transcript's case), an alias the same as the name it stands for (`aliases`:
    alias_targets of the home)."""
    if got is None or expected is None:
        return got is expected
    targets = aliases or {}

    def folded(intent: Intent) -> tuple:
        return intent.name, tuple(sorted((slot, targets.get((slot, value.casefold()), value).casefold())
                                         for slot, value in intent.slots))

    return folded(got) == folded(expected)


def read_items(set_dirs: list[Path], homes: list[Path], split: Mapping[str, str] | None = None) -> list[Item]:
    """The sets' utterances, each with its home. A set whose manifest has a `language` column
    (several languages in one set) gives each home the rows in its language, grouped as
    SET-LANGUAGE; with `split` (command_split.read_split), each group is cut in its parts
    (SET-LANGUAGE choose, ... report)."""
    from edgeasr.home.names import load_home
    from edgeasr.home.sentences import HomeSentences
    from edgeasr.lab.evaluation.command_set import HOME_FILE, intent_from_json
    from edgeasr.lab.evaluation.scoring import read_manifest

    if len(homes) not in (0, 1, len(set_dirs)):
        raise UsageError(f"--home: {len(homes)} given for {len(set_dirs)} --dataset: give one, or one per --dataset")
    items = []
    for k, set_dir in enumerate(set_dirs):
        path = homes[k if len(homes) > 1 else 0] if homes else set_dir / HOME_FILE
        vocabulary = load_home(path, key="--home")
        language = vocabulary.language or "en"
        home = Home(vocabulary, HomeSentences(vocabulary, language), language)
        for row in read_manifest(set_dir):
            if row.get("language", language) != language:
                continue  # another home's language
            expected = (intent_from_json(row["intent"]) if "intent" in row
                        else home.sentences.recognize(row["reference"]))
            group = row.get("group") or (f"{set_dir.name}-{language}" if "language" in row else set_dir.name)
            if split is not None:
                if row["id"] not in split:
                    raise UsageError(f"--split: {set_dir}: clip {row['id']} is in no part")
                group = f"{group} {split[row['id']]}"
            items.append(Item(row["id"], set_dir / row["file"], row["reference"], group, expected, home))
    return items


def row_runners(args, bundle, rows: list[str], homes: Sequence[Home] = ()) -> dict[str, Callable[[np.ndarray, Home], str]]:
    """Each row's function (audio, home) -> text. What reading each of `homes` needs is built
    first, as the daemon builds it when it loads a vocabulary (Transcriber.prepare)."""
    from edgeasr.asr.commands.budget import UNLIMITED
    from edgeasr.asr.commands.vocabulary import prompt_text
    from edgeasr.daemon import engine_for

    cfg = row_config(args, {"encoder.backend": "onnx"})
    engine = engine_for(cfg, bundle)  # heard as the daemon hears: the home's sentences too
    for home in homes:
        engine.prepare(home.vocabulary, home.language)
    runners: dict[str, Callable[[np.ndarray, Home], str]] = {
        "edgeasr": lambda audio, home: engine.transcribe(audio, language=home.language).text,
        "edgeasr-vocabulary": lambda audio, home: engine.transcribe(
            audio, language=home.language, vocabulary=home.vocabulary).text,
    }

    def hearing_by(means: frozenset[str]) -> Callable[[np.ndarray, Home], str]:
        heard = engine.variant(replace(engine.options, vocabulary_means=means))  # on the engine's sessions
        return lambda audio, home: heard.transcribe(audio, language=home.language, vocabulary=home.vocabulary).text

    runners.update({r: hearing_by(m) for r in rows if r not in runners and (m := means_of(r)) is not None})
    if UNBUDGETED in rows:
        unbounded = engine.variant(replace(engine.options, reading=UNLIMITED))
        runners[UNBUDGETED] = lambda audio, home: unbounded.transcribe(
            audio, language=home.language, vocabulary=home.vocabulary).text
    if any(r.startswith("faster-whisper") for r in rows):
        model = faster_whisper(bundle, args.threads)
        if model is None:
            raise UsageError(f"{bundle.root}: faster-whisper needs the CTranslate2 weights the bundle came from")
        logging.getLogger("faster_whisper").setLevel(logging.WARNING)  # not a line per utterance

        def whisper(audio: np.ndarray, home: Home, beam: int, prompt: bool) -> str:
            segments, _ = model.transcribe(audio, beam_size=beam, vad_filter=False,
                                           language=home.language if bundle.multilingual else "en",
                                           initial_prompt=prompt_text(home.vocabulary) if prompt else None)
            return "".join(s.text for s in segments)

        runners["faster-whisper"] = lambda audio, home: whisper(audio, home, 1, False)
        runners["faster-whisper-beam5-names"] = lambda audio, home: whisper(audio, home, FW_BEAM, True)
    return {r: runners[r] for r in rows}


def run(args) -> dict:
    """Every row on every utterance, interleaved; the results per row, in the items' order."""
    from edgeasr.asr.engine import single_threaded_blas
    from edgeasr.audio.files import load_audio
    from edgeasr.lab.evaluation.command_split import read_split
    from edgeasr.models.default import open_bundle

    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS and means_of(r) is None]
    if unknown:
        raise UsageError(f"--rows: unknown {', '.join(unknown)} (known: {', '.join(ROWS)}, {MEANS_ROW}MEANS)")
    single_threaded_blas()  # every row, faster-whisper's too (its features use numpy as well)
    split = read_split(args.split) if args.split else None
    if args.part and split is None:
        raise UsageError("--part: give the --split the part is of")
    items = [i for i in read_items(args.set_dirs, args.homes, split)
             if split is None or args.part in (None, split[i.id])]
    if not items:
        raise UsageError(f"--dataset: no utterances in {', '.join(map(str, args.set_dirs))}")
    bundle = open_bundle(row_config(args, {}))
    runners = row_runners(args, bundle, rows, list({id(i.home): i.home for i in items}.values()))
    results: dict[str, list[dict]] = {r: [] for r in rows}
    for k, item in enumerate([items[0], *items]):  # the first one twice: a warm-up, not counted
        audio = load_audio(item.path, bundle.audio.sample_rate)
        for row in rows[k % len(rows):] + rows[: k % len(rows)]:
            t0 = time.monotonic()
            text = runners[row](audio, item.home)
            ms = (time.monotonic() - t0) * 1e3
            if k:
                results[row].append({"id": item.id, "text": text, "ms": round(ms, 1)})
        print(f"bench-commands: {k}/{len(items)}", file=sys.stderr, end="\r")
    print(file=sys.stderr)
    return {"date": dt.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "threads": args.threads, "model": bundle.name, "utterances": len(items),
            "datasets": [str(d) for d in args.set_dirs], "rows": summarize(items, results), "results": results}


def summarize(items: list[Item], results: dict[str, list[dict]]) -> dict[str, dict[str, dict]]:
    """Per row, per group (and ALL): the accuracies, the counts and the latency median."""
    from edgeasr.lab.evaluation.scoring import sentence_normalizer

    normalizers = {lang: sentence_normalizer(lang) for lang in {i.home.language for i in items}}
    groups = [ALL, *dict.fromkeys(i.group for i in items)]
    table: dict[str, dict[str, dict]] = {}
    for row, res in results.items():
        judged = []
        for item, r in zip(items, res):
            norm = normalizers[item.home.language]
            got = item.home.sentences.recognize(r["text"])
            r["intent"] = None if got is None else {"name": got.name, "slots": [list(s) for s in got.slots]}
            right = same_intent(got, item.expected, item.home.aliases)
            judged.append((item, {"sentence": norm(r["text"]).split() == norm(item.reference).split(),
                                  "intent": right,
                                  "not_command": item.expected is None,
                                  "became_command": item.expected is None and got is not None,
                                  "wrong_action": got is not None and not right,
                                  "empty": not r["text"].strip(), "ms": r["ms"]}))
        table[row] = {}
        for group in groups:
            marks = [m for item, m in judged if group in (ALL, item.group)]
            table[row][group] = {
                "utterances": len(marks),
                "sentence_accuracy": round(sum(m["sentence"] for m in marks) / len(marks), 4),
                "intent_accuracy": round(sum(m["intent"] for m in marks) / len(marks), 4),
                "not_commands": sum(m["not_command"] for m in marks),
                "not_commands_as_command": sum(m["became_command"] for m in marks),
                "wrong_actions": sum(m["wrong_action"] for m in marks),
                "empty": sum(m["empty"] for m in marks),
                "latency_ms_median": round(statistics.median(m["ms"] for m in marks), 1),
            }
    return table
