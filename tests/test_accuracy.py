"""Accuracy behaviours on real speech with real bundles: tails past the window, repetitions,
no text on silence or noise, language detection, calibrated settings from the manifest."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from helpers.audio import as_float, dev_clip
from helpers.engines import make_engine
from helpers.text import normalize

from edgeasr.audio.files import load_audio
from edgeasr.bundle import MANIFEST, load_bundle
from edgeasr.lab.evaluation.calibration import START, better, descend
from edgeasr.lab.evaluation.scoring import Scorer, Utterance
from edgeasr.models.known_decoding import KNOWN, apply_known

pytestmark = pytest.mark.model

MINUTES_2 = 16000 * 120


@pytest.fixture(scope="module")
def base(base_bundle):
    return make_engine(base_bundle)


def pink_noise(n: int, rms: float, seed: int) -> np.ndarray:
    """1/f noise (the dev stream's kind), `rms` of full scale."""
    spectrum = np.fft.rfft(np.random.default_rng(seed).standard_normal(n))
    spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1))
    noise = np.fft.irfft(spectrum, n)
    return (noise * rms / np.sqrt(np.mean(noise**2))).astype(np.float32)


def test_tails_past_the_window_are_kept(tiny_extras_engine, dev_dir, dev_manifest):
    """Every utterance longer than a window ends as its reference ends: a phrase after the
    last carried window edge is not lost."""
    long = [r for r in dev_manifest if float(r["duration_s"]) > tiny_extras_engine.bundle.audio.window_s]
    assert len(long) >= 10
    for row in long:
        ref = normalize(row["reference"]).split()
        hyp = normalize(tiny_extras_engine.transcribe(as_float(dev_clip(row["id"]))).text).split()
        assert set(ref[-3:]) & set(hyp[-5:]), (row["id"], hyp[-5:])
        assert len(hyp) >= 0.85 * len(ref), (row["id"], " ".join(hyp))


@pytest.mark.parametrize("engine_name", ["tiny_extras_engine", "base"], ids=["tiny", "base"])
def test_a_phrase_said_twice_is_kept_twice(engine_name, request, dev_dir):
    """ "go forward ten meters", a pause, "go forward ten meters": a speaker repeating
    himself is not a decoding loop. (With half a second between them base itself writes
    the phrase once, whatever the rules: the pause is a second.)"""
    engine = request.getfixturevalue(engine_name)
    phrase = as_float(dev_clip("cmu_goforward"))
    audio = np.concatenate([phrase, np.zeros(16000, np.float32), phrase])
    words = normalize(engine.transcribe(audio).text).split()
    assert words.count("forward") == 2, words


def test_a_phrase_said_again_at_once_is_kept_twice(tiny_extras_engine, dev_dir):
    """jfk's "Ask what you can do for your country." twice with 0.2 s between: tiny.en writes
    both sayings in one segment, so only the word timestamps can tell them from a loop ("tear down
    the fence! tear down the fence!" once came out once)."""
    audio = as_float(dev_clip("jfk_inaugural-1961"))
    phrase = audio[int(7.9 * 16000) : int(10.6 * 16000)]  # the phrase, as aligned
    said_twice = np.concatenate([phrase, np.zeros(3200, np.float32), phrase])
    result = tiny_extras_engine.transcribe(said_twice)
    assert len(result.segments) == 1, result.segments  # what makes the case: one segment
    assert normalize(result.text).split().count("country") == 2, result.text


def test_words_with_no_audio_under_them_are_cut_from_the_end_of_a_window(base, dev_dir):
    """dev_stream_02's first sentence as the daemon's segmenter cuts it, in a short pause
    (samples 11040-169920): base reads "... he makes me harshly feel. He makes me", the last
    three words aligned to no time at the very end of the audio."""
    audio = load_audio(dev_dir / "longform" / "dev_stream_02.wav", 16000)[11040:169920]
    text = normalize(base.transcribe(audio).text)
    assert text.endswith("he makes me harshly feel") and text.count("makes") == 1, text


@pytest.mark.parametrize("engine_name", ["tiny_extras_engine", "base"], ids=["tiny", "base"])
def test_two_minutes_without_speech_give_no_text(engine_name, request):
    """40 s each of silence, pink noise and white noise, one after the other: twelve windows,
    none of them with text (a window of silence is a window like the one before it; four
    draws of each noise, and the changes from one kind to the next)."""
    engine = request.getfixturevalue(engine_name)
    third = MINUTES_2 // 3
    audio = np.concatenate([np.zeros(third, np.float32), pink_noise(third, 0.02, seed=1),
                            (0.02 * np.random.default_rng(2).standard_normal(third)).astype(np.float32)])
    result = engine.transcribe(audio)
    assert result.text == "", result.text
    assert result.windows >= 12


def test_language_is_detected_in_english_and_german(base, dev_dir, tmp_path):
    """Per audio, from its first window (model.language null), and reported; no language
    or task token comes out as text."""
    english = base.transcribe(as_float(dev_clip("jfk_inaugural-1961")))
    assert english.language == "en" and "country" in english.text.lower()
    wav = tmp_path / "de.wav"
    sentence = "Guten Morgen. Heute ist das Wetter schön, und wir gehen in den Park."
    subprocess.run(["espeak-ng", "-v", "de", "-w", str(wav), sentence], check=True)
    german = base.transcribe(load_audio(wav, 16000))
    assert german.language == "de"
    assert {"guten", "morgen", "park"} <= set(german.text.lower().replace(",", " ").replace(".", " ").split())
    for text in (english.text, german.text):
        assert "<|" not in text and "|>" not in text


def test_calibrated_settings_are_read_from_the_manifest(tiny_bundle, tmp_path):
    """A bundle's `decoding` section sets every decoder key the config leaves at null; a
    key the config sets wins."""
    copy = tmp_path / "bundle"
    copy.mkdir()
    for f in tiny_bundle.iterdir():
        if f.name != MANIFEST:
            (copy / f.name).symlink_to(f)
    manifest = json.loads((tiny_bundle / MANIFEST).read_text())
    manifest["decoding"] = {"values": {"encoder_padding": 0, "repetition_penalty": 1.1, "eos_threshold": None,
                                       "condition_on_previous_text": True}}
    (copy / MANIFEST).write_text(json.dumps(manifest))
    engine = make_engine(copy)
    o = engine.options.decoding
    assert (o.encoder_padding, o.repetition_penalty, o.eos_threshold, o.condition_on_previous_text) == (0, 1.1, None, True)
    assert engine.options.on_gate_fail == "retry"  # not calibrated: never empty for speech
    overridden = make_engine(copy, **{"decoder.repetition_penalty": 1.2, "decoder.on_gate_fail": "drop"})
    assert overridden.options.decoding.repetition_penalty == 1.2 and overridden.options.on_gate_fail == "drop"
    assert make_engine(copy, **{"decoder.preset": "balanced"}).options.decoding.encoder_padding == 700
    manifest.pop("decoding")
    (copy / MANIFEST).write_text(json.dumps(manifest))
    plain = make_engine(copy).options.decoding  # no calibration: plain greedy decoding, as trained
    assert (plain.encoder_padding, plain.repetition_penalty, plain.eos_threshold) == (1500, 1.0, None)


def test_importing_known_weights_applies_their_calibration(base_bundle, tmp_path):
    """models/known.json holds the values calibrated for the shipped weights (by sha256):
    an imported bundle gets them, and the engine uses them."""
    bundle = load_bundle(base_bundle)
    known = json.loads(KNOWN.read_text())[bundle.manifest["source"]["sha256"]]
    assert bundle.decoding == known["values"]
    other = tmp_path / MANIFEST
    shutil.copy(base_bundle / MANIFEST, other)
    manifest = json.loads(other.read_text())
    manifest.pop("decoding")
    manifest["source"]["sha256"] = "0" * 64
    assert "decoding" not in apply_known(tmp_path, manifest)  # unknown weights: nothing added


def test_the_calibration_takes_only_wins_that_hold_across_speakers():
    """A value is taken when it lowers the pool's WER by half a point and lowers it on most
    speaker folds: a win on the pool that one fold's voices carry is not taken."""
    pool = [Utterance(f"ls_test-clean_{spk}-1-{i}", np.zeros(1, np.float32), "a b c d e f g h i j", 5.0,
                      str(spk), "set") for spk in range(5) for i in range(2)]
    scorer = Scorer(pool, window_s=10.0)
    assert sorted(set(scorer.fold)) == [0, 1, 2, 3, 4]  # one speaker per fold
    right, one_wrong = "a b c d e f g h i j", "a b c d e f g h i x"

    def texts(wrong_in: set[int]) -> list[str]:
        return [one_wrong if scorer.fold[i] in wrong_in else right for i in range(len(pool))]

    folds = [0, 1, 2, 3, 4]
    assert better(texts(set()), texts({0, 1, 2}), scorer, folds)  # better on 3 folds of 5
    assert not better(texts({0, 1, 2}), texts({0, 1, 2}), scorer, folds)  # no gain
    # fold 0's voices gain much (the pool gains), folds 1 and 2 lose: not taken
    all_wrong = "x x x x x x x x x x"
    one_fold_wins = [right if scorer.fold[i] == 0 else one_wrong if scorer.fold[i] in (1, 2) else right
                     for i in range(len(pool))]
    before = [all_wrong if scorer.fold[i] == 0 else right for i in range(len(pool))]
    assert scorer.score(one_fold_wins).wer < scorer.score(before).wer - 0.005
    assert not better(one_fold_wins, before, scorer, folds)

    def decode(values: dict) -> list[str]:  # penalty 1.1 helps every fold; padding 700 only fold 0
        if values["repetition_penalty"] == 1.1:
            return texts(set())
        return texts({1, 2, 3, 4} if values["encoder_padding"] == 700 else {0, 1, 2, 3, 4})

    values = descend(decode, scorer, folds)
    assert values["repetition_penalty"] == 1.1 and values["encoder_padding"] == START["encoder_padding"]


def test_a_value_that_wins_on_one_source_alone_is_not_chosen_without_it():
    """Held out by source: a value chosen on the other sources' utterances alone. One that puts
    LibriSpeech right and changes nothing on VCTK is taken on the pool, not without LibriSpeech."""
    pool = [Utterance(f"{prefix}{spk}-1-{i}", np.zeros(1, np.float32), "a b c d e f g h i j", 5.0,
                      f"{prefix}{spk}", "set") for prefix in ("ls_test-clean_", "vctk_p") for spk in range(5)
            for i in range(2)]
    scorer = Scorer(pool, window_s=10.0)
    assert scorer.sources == ["LibriSpeech", "VCTK"]
    assert all({scorer.source[i] for i in scorer.fold_indexes(f)} == {"LibriSpeech", "VCTK"} for f in range(5))
    right, wrong = "a b c d e f g h i j", "a b c d e f g h x x"

    def decode(values: dict) -> list[str]:
        fixes_ls = values["repetition_penalty"] == 1.1
        return [right if fixes_ls and s == "LibriSpeech" else wrong for s in scorer.source]

    folds = [0, 1, 2, 3, 4]
    assert descend(decode, scorer, folds)["repetition_penalty"] == 1.1
    assert descend(decode, scorer, folds, without="LibriSpeech") == START


def test_the_earlier_text_as_prompt_is_judged_on_speech_longer_than_a_window():
    """The earlier text as prompt changes only the later windows of long speech: its gain is
    weighed there, not diluted by the short utterances it cannot change. The penalty, which
    changes every window, is weighed on the whole pool."""
    pool = [Utterance(f"ls_test-clean_{spk}-1-{i}", np.zeros(1, np.float32), "a b c d e f g h i j", duration,
                      str(spk), "set") for spk in range(5) for i, duration in enumerate((12.0, *[5.0] * 24))]
    scorer = Scorer(pool, window_s=10.0)
    assert len(scorer.long) == 5
    right, wrong = "a b c d e f g h i j", "a b c d e f g h i x"

    def decode(values: dict) -> list[str]:  # either puts the long ones right: 5 words of 1250
        fixed = values["condition_on_previous_text"] or values["repetition_penalty"] == 1.1
        return [right if fixed or i not in scorer.long else wrong for i in range(len(pool))]

    assert scorer.score(decode({**START, "condition_on_previous_text": True})).wer > scorer.score(decode(START)).wer - 0.005
    values = descend(decode, scorer, [0, 1, 2, 3, 4])
    assert values["repetition_penalty"] == START["repetition_penalty"] and values["condition_on_previous_text"]
