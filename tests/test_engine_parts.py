"""The engine's parts, each alone and without a model: the window walker, the seam rule, the
options an engine is built from."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import numpy as np
import pytest

from edgeasr.asr.decoding import DecodingOptions
from edgeasr.asr.engine import EngineOptions, Fallback
from edgeasr.asr.features import MelSpec
from edgeasr.asr.text.seams import repeats_the_end
from edgeasr.asr.windows import MIN_ADVANCE_S, WindowWalker
from edgeasr.errors import ConfigError

SR = 16000
SPEC = MelSpec(SR, 400, 160, 80, 1000)  # a 10 s window


class PauseAt:
    """The VAD side's rules with a pause found where asked: `at` seconds into any window."""

    frame_s = 0.03

    def __init__(self, at: float | None) -> None:
        self.at = at

    def find(self, audio: np.ndarray) -> int | None:
        return None if self.at is None else int(self.at * SR)

    def speech(self, audio: np.ndarray) -> np.ndarray:
        return np.ones(int(len(audio) / SR / self.frame_s), bool)


def test_a_window_of_long_audio_ends_in_the_pause_near_its_end():
    audio = np.zeros(25 * SR, np.float32)
    window = WindowWalker(SPEC, PauseAt(8.5)).window(audio, 0, final=True)
    assert len(window.audio) == int(8.5 * SR) and window.complete and window.more
    # without a pause, or with one too early to move on, the window is the model's length
    for pauses in (None, PauseAt(None), PauseAt(MIN_ADVANCE_S / 2)):
        window = WindowWalker(SPEC, pauses).window(audio, 0, final=True)
        assert len(window.audio) == SPEC.n_samples and not window.complete and window.more


def test_the_last_window_is_complete_only_when_the_audio_is_final():
    audio = np.zeros(14 * SR, np.float32)
    walker = WindowWalker(SPEC, PauseAt(8.5))
    for final in (True, False):
        window = walker.window(audio, 10 * SR, final)
        assert window.seek == 10 * SR and len(window.audio) == 4 * SR and not window.more
        assert window.complete is final
    assert walker.words_left(audio, len(audio) - SR // 5) and not walker.words_left(audio, len(audio) - SR // 20)


def test_the_walker_hears_speech_only_with_a_vad():
    audio = np.zeros(4 * SR, np.float32)
    assert WindowWalker(SPEC).window(audio, 0, final=True).speech is None
    speech = WindowWalker(SPEC, PauseAt(None)).window(audio, 0, final=True).speech
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
