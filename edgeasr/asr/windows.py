"""The window walk: where each encoder window of the audio starts and ends.

A window is the model's length. When the audio goes on past it, the window ends in a pause if
the VAD heard one in its last seconds (the segmenter's cut rule, stages.quietest_frame), and
then holds complete speech. The VAD's verdict is a value: the front end's, as it heard the
audio arrive (the segmenter's frames, a Wyoming session's), or, for audio given whole, one
judgement of all of it (`SpeechJudging`). Where the next window starts is the decoder's to say
(the seek).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edgeasr.asr.features import MelSpec
from edgeasr.asr.text.pieces import MIN_ADVANCE_S, MIN_WINDOW_S
from edgeasr.asr.text.spoken import SpeechMap
from edgeasr.stages import SpeechFrames, quietest_frame


class SpeechJudging(Protocol):
    """The VAD's verdict on audio given whole (`audio.vad.SpeechJudge`)."""

    @property
    def search_s(self) -> float:
        """How far back from a window's end a pause to end it in is looked for."""

    def judge(self, audio: np.ndarray) -> SpeechFrames: ...


@dataclass(frozen=True)
class Window:
    """The audio of one encoder window and where it stands in the audio being transcribed."""

    audio: np.ndarray
    seek: int  # its first sample in the audio
    complete: bool  # the speech ends in it: an open tail is complete too
    more: bool  # audio follows it (a looped phrase can be decoded again in the next one)
    speech: SpeechMap | None  # the VAD's verdict on its frames (None without a VAD)
    # its audio ends before the model's window does (the encoder's input is padded past it):
    # not cut in running speech, so the decoder reads the tail past it (tail.PaddingRows).
    # Whether more audio follows is not asked: the same audio is decoded the same way.
    ends_inside: bool


class WindowWalker:
    """Cuts windows out of the audio. `search_s`: how far back from a window's end a pause is
    looked for (None: long audio is cut at the model's length only)."""

    def __init__(self, spec: MelSpec, search_s: float | None = None) -> None:
        self.spec, self.search_s = spec, search_s

    def words_left(self, audio: np.ndarray, seek: int) -> bool:
        """Does the audio from `seek` on hold enough for a word?"""
        return len(audio) - seek >= MIN_WINDOW_S * self.spec.sample_rate

    def window(self, audio: np.ndarray, seek: int, final: bool, speech: SpeechFrames | None = None) -> Window:
        """The window from `seek`: the model's length, or up to a pause near its end when the
        audio goes on past it. `final`: no audio follows this audio. `speech`: the VAD's
        verdict on the whole audio."""
        sr = self.spec.sample_rate
        chunk = audio[seek : seek + self.spec.n_samples]
        more = seek + self.spec.n_samples < len(audio)
        complete = not more and final
        frames = speech.after(seek) if speech is not None else None
        if more and frames is not None and self.search_s is not None:
            cut = self._pause(chunk, frames, self.search_s)
            if cut is not None and cut >= MIN_ADVANCE_S * sr:
                chunk, complete = chunk[:cut], True
        ends_inside = len(chunk) < self.spec.n_samples
        if frames is None:
            return Window(chunk, seek, complete, more, None, ends_inside)
        whole = max(0, (len(chunk) - frames.offset) // frames.frame)  # the frames that end inside the window
        return Window(chunk, seek, complete, more,
                      SpeechMap(frames.flags[:whole], frames.frame / sr, frames.offset / sr), ends_inside)

    def _pause(self, chunk: np.ndarray, frames: SpeechFrames, search_s: float) -> int | None:
        """Samples up to the end of the pause frame in the window's last `search_s` to end it
        after, or None if none (the segmenter's rule: the quietest non-speech frame)."""
        n = frames.frame
        whole = min(len(frames.flags), max(0, (len(chunk) - frames.offset) // n))
        lo = max(0, whole - max(1, math.ceil(search_s * self.spec.sample_rate / n)))
        if whole <= lo:
            return None
        pcm = (np.clip(chunk, -1.0, 1.0) * 32767).astype(np.int16)  # the frames as the VAD heard them
        energy = np.array([np.mean(np.square(pcm[max(0, a) : a + n], dtype=np.float32))
                           for a in frames.offset + np.arange(lo, whole) * n], dtype=np.float32)
        k, pause = quietest_frame(frames.flags[lo:whole], energy)
        return frames.offset + (lo + k + 1) * n if pause else None
