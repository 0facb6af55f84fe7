"""The engine's parts, each alone and without a model: the window walker, the seam rule, the
options an engine is built from."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import numpy as np
import pytest

from edgeasr.asr.decoding import DecodingOptions
from edgeasr.asr.engine import EngineOptions, Fallback
from edgeasr.asr.features import MelSpec
from edgeasr.asr.text.pieces import MIN_ADVANCE_S
from edgeasr.asr.text.seams import repeats_the_end
from edgeasr.asr.windows import WindowWalker
from edgeasr.errors import ConfigError
from edgeasr.stages import SpeechFrames

SR = 16000
SPEC = MelSpec(SR, 400, 160, 80, 1000)  # a 10 s window


FRAME = SR * 30 // 1000  # a 30 ms VAD frame


def heard(seconds: float, pause_at: float | None = None) -> SpeechFrames:
    """The VAD's verdict on `seconds` of audio: speech throughout, but for one frame of pause
    at `pause_at` seconds."""
    flags = np.ones(int(seconds * SR) // FRAME, bool)
    if pause_at is not None:
        flags[int(pause_at * SR) // FRAME] = False
    return SpeechFrames(flags, FRAME)


def test_a_window_of_long_audio_ends_in_the_pause_near_its_end():
    audio = np.zeros(25 * SR, np.float32)
    window = WindowWalker(SPEC, search_s=2.0).window(audio, 0, final=True, speech=heard(25, 8.5))
    assert len(window.audio) == (int(8.5 * SR) // FRAME + 1) * FRAME and window.complete and window.more
    # without a pause, with one too early to move on, or without a VAD: the model's length
    for walker, speech in ((WindowWalker(SPEC, 2.0), heard(25)), (WindowWalker(SPEC, 10.0), heard(25, MIN_ADVANCE_S / 2)),
                           (WindowWalker(SPEC, 2.0), None), (WindowWalker(SPEC), heard(25, 8.5))):
        window = walker.window(audio, 0, final=True, speech=speech)
        assert len(window.audio) == SPEC.n_samples and not window.complete and window.more


def test_a_window_that_starts_inside_a_frame_reads_the_verdict_where_its_audio_is():
    audio = np.zeros(25 * SR, np.float32)
    seek = 3 * SR + FRAME // 3  # a seek from a timestamp falls anywhere in a frame
    window = WindowWalker(SPEC, 2.0).window(audio, seek, final=True, speech=heard(25, 11.5))
    assert seek + len(window.audio) == (int(11.5 * SR) // FRAME + 1) * FRAME
    assert window.speech is not None and window.speech.origin_s == -(FRAME // 3) / SR
    assert window.speech.spoken_s(0.0, 1.0) == pytest.approx(1.0, abs=0.031)


def test_a_verdict_follows_its_audio_when_cut_and_joined():
    verdict = SpeechFrames(np.array([True, False, True, True]), FRAME)
    rest = verdict.after(FRAME + 5)  # from inside the second frame
    assert rest.flags.tolist() == [False, True, True] and rest.offset == -5
    assert verdict.after(0).flags.tolist() == verdict.flags.tolist() and verdict.after(0).offset == 0
    joined = rest.then(SpeechFrames(np.array([False]), FRAME))
    assert joined.flags.tolist() == [False, True, True, False] and joined.offset == -5


def test_the_last_window_is_complete_only_when_the_audio_is_final():
    audio = np.zeros(14 * SR, np.float32)
    walker = WindowWalker(SPEC, 2.0)
    for final in (True, False):
        window = walker.window(audio, 10 * SR, final, heard(14, 8.5))
        assert window.seek == 10 * SR and len(window.audio) == 4 * SR and not window.more
        assert window.complete is final
    assert walker.words_left(audio, len(audio) - SR // 5) and not walker.words_left(audio, len(audio) - SR // 20)


def test_the_walker_hears_speech_only_with_a_vad():
    audio = np.zeros(4 * SR, np.float32)
    assert WindowWalker(SPEC).window(audio, 0, final=True).speech is None
    speech = WindowWalker(SPEC).window(audio, 0, final=True, speech=heard(4)).speech
    assert speech is not None and speech.is_spoken(1.0, 2.0)


def test_a_seam_repeat_is_the_same_words_or_nearly_the_same_letters():
    kept = ["i", "am", "free", "to", "confess", "that", "the"]
    assert repeats_the_end(["the"], kept)
    assert repeats_the_end(["that", "the"], kept)
    assert not repeats_the_end(["old"], kept)
    # a word cut by the seam is heard otherwise: its letters are judged, given enough of them
    rainbow = ["and", "form", "a", "rainbow"]
    assert repeats_the_end(["and", "former", "rainbow"], rainbow)
    assert not repeats_the_end(["a", "rainbow", "fish"], ["and", "form", "a", "rain"])
    assert not repeats_the_end(["form", "ax"], ["form", "a"])  # too few letters to judge


def test_engine_options_are_frozen_and_checked():
    options = EngineOptions(DecodingOptions())
    with pytest.raises(FrozenInstanceError):
        options.beam_size = 3  # type: ignore[misc]
    assert replace(options, beam_size=3).beam_size == 3 and options.beam_size == 1
    with pytest.raises(ConfigError, match=r"decoder.on_gate_fail: 'ignore' is not allowed \(drop, retry, keep\)"):
        EngineOptions(DecodingOptions(), on_gate_fail="ignore")


def test_the_fallback_goes_up_to_a_temperature_of_one():
    assert Fallback(0.2).temperatures() == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert Fallback(0.5).temperatures() == (0.0, 0.5, 1.0)
