"""An evaluation pool and its scores: several sets read as one, cut into folds by speaker.

Every decision about decoding (a calibrated value, a rule) is judged on the pool as a whole
and on each fold: a fold holds whole speakers (or whole sources, where a source does not
name its speakers), so a value that only fits the voices it was chosen on shows as a loss on
the folds that do not hold them. The folds are balanced by duration and fixed by the pool's
content, not by chance: the same pool always gives the same folds. Each utterance's source
(the corpus it comes from: LibriSpeech, VCTK, FLEURS...) is kept too: a value chosen on the
other sources can be scored on one held out, since a win on one corpus's recording and
reading style is a fit too.

Scores are corpus-level after Whisper's English normalizer (the one faster-whisper's and
openai's papers use), with the substitutions, deletions and insertions counted apart: a rule
that drops words shows as deletions even where the WER hides it.
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from edgeasr.errors import MissingInputError

FOLDS = 5
# An utterance id names its speaker in the pool's corpora: LibriSpeech's reader
# (ls_<subset>_<reader>-<chapter>-<n>), VCTK's and CMU ARCTIC's speaker (vctk_p225_001,
# arctic_aew_a0001); any other id is one source with one voice, named by its prefix
# (ljs_..., cathy_..., fleurs_...). A manifest column `speaker` overrides this.
SPEAKER_IN_ID = (
    re.compile(r"^(ls)_[^_]+_(\d+)-"),
    re.compile(r"^(vctk|arctic)_([a-z]*\d*[a-z]*)_"),
)
# The corpora of the pool by id prefix; any other prefix is one of the small ones, pooled
SOURCES = {"ls": "LibriSpeech", "vctk": "VCTK", "fleurs": "FLEURS", "ljs": "LJ Speech", "cathy": "Cathy"}
OTHER_SOURCES = "other"


@dataclass(frozen=True)
class Utterance:
    id: str
    audio: np.ndarray  # float32 mono at the bundle's rate
    reference: str
    duration_s: float
    speaker: str
    set_name: str


def speaker_of(utterance_id: str) -> str:
    for pattern in SPEAKER_IN_ID:
        m = pattern.match(utterance_id)
        if m:
            return f"{m.group(1)}:{m.group(2)}"
    return utterance_id.split("_", 1)[0]


def source_of(utterance_id: str) -> str:
    """The corpus an utterance comes from, by its id's prefix."""
    return SOURCES.get(utterance_id.split("_", 1)[0], OTHER_SOURCES)


def manifest_of(dataset: Path) -> Path:
    """A set's manifest: DIR/manifest.tsv, or a .tsv file of the same columns (the dev set's
    longform/streams.tsv), its files relative to its folder."""
    return dataset if dataset.suffix == ".tsv" else dataset / "manifest.tsv"


def read_manifest(set_dir: Path) -> list[dict[str, str]]:
    manifest = manifest_of(set_dir)
    if not manifest.is_file():
        raise MissingInputError(f"{manifest}: no manifest.tsv in the evaluation set")
    with manifest.open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


@dataclass(frozen=True)
class Entry:
    """A manifest row of a pool, its audio not read."""

    id: str
    path: Path
    reference: str
    duration_s: float
    speaker: str
    set_name: str


def read_entries(set_dirs: Sequence[Path], limit: int = 0) -> list[Entry]:
    """Every row of the sets' manifests, in order (`limit`: the first N of each set)."""
    entries = []
    for set_dir in set_dirs:
        rows = read_manifest(set_dir)
        for r in rows[:limit] if limit else rows:
            entries.append(Entry(r["id"], manifest_of(set_dir).parent / r["file"], r["reference"],
                                 float(r["duration_s"]), r.get("speaker") or speaker_of(r["id"]),
                                 set_dir.stem if set_dir.suffix == ".tsv" else set_dir.name))
    return entries


def read_pool(set_dirs: Sequence[Path], sample_rate: int, limit: int = 0) -> list[Utterance]:
    """Every utterance of the sets, in order, its audio read (`limit`: the first N of each set)."""
    from edgeasr.audio.files import load_audio

    return [Utterance(e.id, load_audio(e.path, sample_rate), e.reference, e.duration_s, e.speaker, e.set_name)
            for e in read_entries(set_dirs, limit)]


def folds(pool: Sequence[Labelled], k: int = FOLDS) -> list[int]:
    """Each utterance's fold: speakers, longest first, go to the fold with the least audio."""
    seconds: dict[str, float] = {}
    for u in pool:
        seconds[u.speaker] = seconds.get(u.speaker, 0.0) + u.duration_s
    load = [0.0] * k
    fold_of: dict[str, int] = {}
    for spk, s in sorted(seconds.items(), key=lambda item: (-item[1], item[0])):
        fold_of[spk] = int(np.argmin(load))
        load[fold_of[spk]] += s
    return [fold_of[u.speaker] for u in pool]


@dataclass(frozen=True)
class Score:
    wer: float  # corpus WER, 0..1
    cer: float
    substitutions: int
    deletions: int
    insertions: int
    words: int  # reference words
    empty: int  # utterances with speech and no text

    def row(self) -> str:
        return (f"WER {self.wer:.2%} CER {self.cer:.2%} S/D/I {self.substitutions}/{self.deletions}/"
                f"{self.insertions} of {self.words} words, {self.empty} empty")


class Labelled(Protocol):
    """What scoring reads of an utterance (an `Utterance`, or a manifest row without its audio)."""

    @property
    def id(self) -> str: ...

    @property
    def reference(self) -> str: ...

    @property
    def duration_s(self) -> float: ...

    @property
    def speaker(self) -> str: ...

    @property
    def set_name(self) -> str: ...


class Scorer:
    """Scores of hypotheses for a pool: whole, per group, per fold."""

    def __init__(self, pool: Sequence[Labelled], window_s: float, k: int = FOLDS, language: str = "en") -> None:
        self.normalize = normalizer(language)
        self.refs = [self.normalize(u.reference) for u in pool]
        self.fold = folds(pool, k)
        self.k = k
        self.source = [source_of(u.id) for u in pool]
        self.long = frozenset(i for i, u in enumerate(pool) if u.duration_s > window_s)
        self.groups: dict[str, list[int]] = {
            f"up to {window_s:g} s": [i for i, u in enumerate(pool) if u.duration_s <= window_s],
            f"over {window_s:g} s": [i for i, u in enumerate(pool) if u.duration_s > window_s],
        }
        for name in dict.fromkeys(u.set_name for u in pool):
            self.groups[name] = [i for i, u in enumerate(pool) if u.set_name == name]

    def fold_indexes(self, fold: int, without: str | None = None) -> list[int]:
        """The fold's utterances (`without`: less those of that source)."""
        return [i for i, f in enumerate(self.fold) if f == fold and self.source[i] != without]

    @property
    def sources(self) -> list[str]:
        return list(dict.fromkeys(self.source))

    def source_indexes(self, source: str) -> list[int]:
        return [i for i, s in enumerate(self.source) if s == source]

    def score(self, hyps: Sequence[str], indexes: Sequence[int] | None = None) -> Score:
        import jiwer

        ix = range(len(self.refs)) if indexes is None else indexes
        refs = [self.refs[i] for i in ix]
        out = [self.normalize(hyps[i]) for i in ix]
        # jiwer refuses an empty reference: such an utterance scores its hypothesis as insertions
        pairs = [(r, h) for r, h in zip(refs, out) if r.strip()]
        inserted = sum(len(h.split()) for r, h in zip(refs, out) if not r.strip())
        words = jiwer.process_words([r for r, _ in pairs], [h for _, h in pairs])
        n = sum(len(r.split()) for r, _ in pairs)
        chars = jiwer.process_characters([r for r, _ in pairs], [h for _, h in pairs])
        return Score(wer=(words.substitutions + words.deletions + words.insertions + inserted) / max(1, n),
                     cer=chars.cer, substitutions=words.substitutions, deletions=words.deletions,
                     insertions=words.insertions + inserted, words=n,
                     empty=sum(1 for r, h in zip(refs, out) if r.strip() and not h.strip()))

    def per_fold(self, hyps: Sequence[str]) -> list[Score]:
        return [self.score(hyps, self.fold_indexes(f)) for f in range(self.k)]

    def per_group(self, hyps: Sequence[str]) -> dict[str, Score]:
        return {name: self.score(hyps, ix) for name, ix in self.groups.items() if ix}


@functools.cache
def normalizer(language: str = "en") -> Callable[[str], str]:
    """Whisper's text normalizer: the English one (spellings, numbers) for English, else the
    basic one (case, marks, symbols). One per language: the English one reads its spellings
    file when made, and a judge asks for it per clip."""
    if language == "en":
        from whisper_normalizer.english import EnglishTextNormalizer

        return EnglishTextNormalizer()
    from whisper_normalizer.basic import BasicTextNormalizer

    return BasicTextNormalizer()


# "%" as each language's command sets say it (their references write the word, the decoder "%")
PERCENT_SAID = {"fr": "pourcent", "es": "por ciento", "it": "percento", "nl": "procent", "de": "prozent"}


@functools.cache
def sentence_normalizer(language: str = "en") -> Callable[[str], str]:
    """Whether a command was written as said, outside English: `normalizer`, after numbers said
    in words are written in digits (text2num, both sides alike) and "%" is spelled as the
    language says it. Whisper's basic normalizer leaves numbers as written and drops "%", so
    "Allume Rez-de-chaussée à 55%" was no sentence "allume Rez-de-chaussée à 55 pourcent", nor
    "una hora" "1 hora". English: `normalizer` alone (its own numbers and "%")."""
    basic = normalizer(language)
    if language == "en":
        return basic
    from text_to_num import alpha2digit

    percent = PERCENT_SAID.get(language)

    def norm(text: str) -> str:
        if percent:
            text = re.sub(r"\s*%", " " + percent, text)
        try:
            text = alpha2digit(text, language, threshold=0)
        except ValueError:  # a language text2num does not know
            pass
        return basic(text)

    return norm
