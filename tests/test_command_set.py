"""`edgeasr models command-set`: the plan (what is said, by which voice, in which noise), the
noise of the dev set's streams, and a small set written by piper and espeak-ng themselves."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import soundfile

from edgeasr.cli import main
from edgeasr.errors import AudioError, UsageError
from edgeasr.home.names import load_home
from edgeasr.home.sentences import HomeSentences
from edgeasr.lab.evaluation.command_phrases import ESPEAK_GROUPS, GROUPS, LANGUAGES, language_of
from edgeasr.lab.evaluation.command_set import (
    COLUMNS,
    HOME_FILE,
    group_sizes,
    intent_from_json,
    intent_json,
    plan,
    plan_everyday,
)
from edgeasr.lab.evaluation.voices import CLEAN_STREAM, NOISE_DIR, NOISY_STREAM, PAD_S, SAMPLE_RATE, mix, read_noise
from edgeasr.stages import Intent

HOME = Path(__file__).parent / "data" / "home.yaml"
LANGS = ("de", "fr", "es", "it", "nl")
HOMES = {lang: Path(__file__).parent / "data" / f"home-{lang}.yaml" for lang in LANGS}
HELD_OUT = {lang: Path(__file__).parent / "data" / f"held-out-home-{lang}.yaml" for lang in LANGS}
COUNT = 6  # a small set: the CI's time


@pytest.fixture(scope="module")
def sentences() -> HomeSentences:
    return HomeSentences(load_home(HOME), "en")


@pytest.mark.parametrize("count", [1, COUNT, 150, 151])
def test_the_groups_share_the_count(count):
    sizes = group_sizes(count)
    assert sum(sizes.values()) == count and set(sizes) == set(GROUPS)
    total = sum(GROUPS.values())
    for group, share in GROUPS.items():
        assert abs(sizes[group] - count * share / total) < 1


def test_the_plan_is_the_seeds(sentences):
    lines = plan(sentences, 48, seed=4)
    assert lines == plan(sentences, 48, seed=4)
    assert [line.text for line in lines] != [line.text for line in plan(sentences, 48, seed=5)]
    assert len({line.id for line in lines}) == 48
    for line in lines:
        assert sentences.recognize(line.text) == line.intent
        assert (line.intent is None) == (line.group == "other")
        assert (line.snr_db is not None) == ("noise" in line.group)
        assert line.voice.kind == line.group.split("-")[0] or line.group in ("short", "other")
    assert {line.group for line in lines} == set(GROUPS)
    named = [line for line in lines if line.intent and any(slot == "name" for slot, _ in line.intent.slots)]
    assert len(named) >= 10  # the home's names are what the set is for


def test_the_everyday_plan_says_each_frame_in_turn_as_a_command_of_the_home(sentences):
    """--everyday: commands as people most often say them, each different, by piper, clean; a
    frame whose domain the home lacks is passed, and the same seed gives the same lines."""
    names = load_home(HOME).names
    lines = plan_everyday(sentences, names, 40, seed=3)
    assert lines == plan_everyday(sentences, names, 40, seed=3)
    assert len({line.text for line in lines}) == 40
    for line in lines:
        assert line.intent is not None and sentences.recognize(line.text) == line.intent
        assert (line.group, line.voice.kind, line.snr_db) == ("everyday", "piper", None)
    said = {line.text for line in lines}
    assert "what time is it" in said and any(text.startswith("turn on the lights in the ") for text in said)
    with pytest.raises(UsageError, match="everyday commands"):
        plan_everyday(sentences, [], 40, seed=3)  # no names: too few of the frames are commands


@pytest.mark.parametrize("intent", [None, Intent("HassTurnOn", (("name", "Hue Go"),)), Intent("HassNevermind")])
def test_the_intent_column_round_trips(intent):
    assert intent_from_json(intent_json(intent)) == intent


def test_the_noise_is_the_dev_streams_difference_and_mixes_at_the_snr_asked(dev_dir):
    import random

    noise = read_noise(NOISE_DIR)
    speech, _ = soundfile.read(dev_dir / "audio" / "jfk_inaugural-1961.wav", dtype="float32")
    speech *= 0.1 / np.abs(speech).max()  # quiet enough that the mix is not scaled down
    pad = np.zeros(int(PAD_S * SAMPLE_RATE), np.float32)
    for snr in (10.0, 20.0):
        added = mix(speech, noise, snr, random.Random(0)) - np.concatenate([pad, speech, pad])
        assert np.mean(added[: len(pad)] ** 2) > np.mean(added**2) / 2  # the noise lies under the silence too
        assert 10 * np.log10(np.mean(speech**2) / np.mean(added**2)) == pytest.approx(snr, abs=0.01)


def test_noise_streams_out_of_step_are_refused(tmp_path, dev_dir):
    clean, rate = soundfile.read(dev_dir / "longform" / CLEAN_STREAM, dtype="int16")
    noisy, _ = soundfile.read(dev_dir / "longform" / NOISY_STREAM, dtype="int16")
    soundfile.write(tmp_path / CLEAN_STREAM, clean, rate)
    soundfile.write(tmp_path / NOISY_STREAM, np.roll(noisy, 1), rate)
    with pytest.raises(AudioError, match="not sample-aligned"):
        read_noise(tmp_path)


def _read(manifest: Path) -> list[dict]:
    with manifest.open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def test_a_small_set_is_written_and_the_same_for_a_seed(tmp_path, sentences):
    runs = [tmp_path / "a", tmp_path / "b"]
    for out in runs:
        assert main(["models", "command-set", "--home", str(HOME), "--out", str(out), "--count", str(COUNT),
                     "--seed", "2"]) == 0
    rows = _read(runs[0] / "manifest.tsv")
    assert rows == _read(runs[1] / "manifest.tsv")
    assert len(rows) == COUNT and list(rows[0]) == list(COLUMNS)
    assert (runs[0] / HOME_FILE).read_text() == HOME.read_text()
    for row in rows:
        audio, rate = soundfile.read(runs[0] / row["file"], dtype="int16")
        info = soundfile.info(runs[0] / row["file"])
        assert (rate, info.channels, info.subtype) == (SAMPLE_RATE, 1, "PCM_16")
        assert abs(len(audio) / rate - float(row["duration_s"])) < 1e-3
        pad = int(PAD_S * SAMPLE_RATE)
        quiet = np.abs(audio[:pad]).max()
        assert quiet > 0 if "noise" in row["group"] else quiet == 0
        assert np.abs(audio[pad:-pad]).max() > 1000  # speech
        assert (runs[1] / row["file"]).read_bytes() == (runs[0] / row["file"]).read_bytes()
        assert intent_from_json(row["intent"]) == sentences.recognize(row["reference"])
        assert row["source"].startswith("generated: ") and row["license"]


@pytest.fixture(scope="module")
def german() -> HomeSentences:
    return HomeSentences(load_home(HOMES["de"]), "de")


@pytest.mark.parametrize("homes", [HOMES, HELD_OUT], ids=["home", "held-out"])
@pytest.mark.parametrize("lang", LANGS)
def test_each_languages_short_commands_are_commands_and_the_others_are_not(lang, homes):
    home = load_home(homes[lang])
    assert home.language == lang
    sentences, spoken = HomeSentences(home, lang), LANGUAGES[lang]
    assert [t for t in spoken.short_commands if sentences.recognize(t) is None] == []
    assert [t for t in spoken.not_commands if sentences.recognize(t) is not None] == []
    assert all(v.split("+")[0].split("-")[0] == lang for v in spoken.espeak_voices)


def test_the_language_is_the_homes_and_english_is_as_it_was():
    assert language_of(None) is language_of("en-GB") is LANGUAGES["en"]
    assert dict(LANGUAGES["en"].groups) == GROUPS and LANGUAGES["en"].voice_kinds == ("piper", "espeak")
    assert language_of("de_CH") is LANGUAGES["de"] and LANGUAGES["de"].voice_kinds == ("espeak",)
    with pytest.raises(UsageError, match="'xx'"):
        language_of("xx")


def test_a_german_plan_is_said_by_german_voices(german):
    lines = plan(german, 24, seed=3)
    assert lines == plan(german, 24, seed=3)
    assert {line.group for line in lines} == set(ESPEAK_GROUPS)
    for line in lines:
        assert line.voice.kind == "espeak" and line.voice.name.startswith("de")
        assert german.recognize(line.text) == line.intent
        assert (line.intent is None) == (line.group == "other")
    said = " ".join(line.text for line in lines).lower()
    assert set("äöü") & set(said)  # German sentences are kept, umlauts and all
    assert any(line.intent and ("name", "Küchenradio") in line.intent.slots for line in plan(german, 96, seed=3))


def test_a_small_german_set_is_written_with_german_voices_and_its_intents(tmp_path, german):
    out = tmp_path / "de"
    assert main(["models", "command-set", "--home", str(HOMES["de"]), "--out", str(out), "--count", "5",
                 "--seed", "1"]) == 0
    rows = _read(out / "manifest.tsv")
    assert len(rows) == 5 and {row["group"] for row in rows} <= set(ESPEAK_GROUPS)
    for row in rows:
        assert row["source"].startswith("generated: espeak-ng de")
        assert "piper" not in row["license"]
        assert intent_from_json(row["intent"]) == german.recognize(row["reference"])
        audio, _ = soundfile.read(out / row["file"], dtype="int16")
        assert np.abs(audio).max() > 1000
