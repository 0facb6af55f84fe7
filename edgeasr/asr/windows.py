"""The window walk: where each encoder window of the audio starts and ends.

A window is the model's length. When the audio goes on past it, the window ends in a pause if
the VAD finds one in its last seconds (the segmenter's cut rule, `PauseFinding`), and then
holds complete speech. Where the next window starts is the decoder's to say (the seek).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edgeasr.asr.features import MelSpec
from edgeasr.asr.text.pieces import MIN_ADVANCE_S, MIN_WINDOW_S
from edgeasr.asr.text.spoken import SpeechMap


class PauseFinding(Protocol):
    """The VAD side's rules for audio in memory (`audio.segmenter.PauseFinder`)."""

    @property
    def frame_s(self) -> float: ...

    def find(self, audio: np.ndarray) -> int | None:
        """Where a window of long audio can end in a pause (samples), or None."""

    def speech(self, audio: np.ndarray) -> np.ndarray:
        """Speech or not, per frame of `frame_s` seconds."""


@dataclass(frozen=True)
class Window:
    """The audio of one encoder window and where it stands in the audio being transcribed."""

    audio: np.ndarray
    seek: int  # its first sample in the audio
    complete: bool  # the speech ends in it: an open tail is complete too
    more: bool  # audio follows it (a looped phrase can be decoded again in the next one)
    speech: SpeechMap | None  # the VAD's verdict on its frames (None without a VAD)


class WindowWalker:
    """Cuts windows out of the audio; `pauses` None cuts long audio at the model's length only."""

    def __init__(self, spec: MelSpec, pauses: PauseFinding | None = None) -> None:
        self.spec, self.pauses = spec, pauses

    def words_left(self, audio: np.ndarray, seek: int) -> bool:
        """Does the audio from `seek` on hold enough for a word?"""
        return len(audio) - seek >= MIN_WINDOW_S * self.spec.sample_rate

    def window(self, audio: np.ndarray, seek: int, final: bool) -> Window:
        """The window from `seek`: the model's length, or up to a pause near its end when the
        audio goes on past it. `final`: no audio follows this audio."""
        sr = self.spec.sample_rate
        chunk = audio[seek : seek + self.spec.n_samples]
        more = seek + self.spec.n_samples < len(audio)
        complete = not more and final
        if more and self.pauses is not None:
            cut = self.pauses.find(chunk)
            if cut is not None and cut >= MIN_ADVANCE_S * sr:
                chunk, complete = chunk[:cut], True
        speech = SpeechMap(self.pauses.speech(chunk), self.pauses.frame_s) if self.pauses is not None else None
        return Window(chunk, seek, complete, more, speech)
