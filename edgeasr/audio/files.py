"""Audio files (WAV, FLAC, OGG, ...) to float32 mono at the model's sample rate.

Decoding is libsndfile's (soundfile), resampling soxr's. Files with nothing to
transcribe are refused with an AudioError, so callers can skip them: Hailo's sample
app crashes on digital silence.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import BinaryIO

import numpy as np
import soundfile as sf
import soxr

from edgeasr.config import special_file
from edgeasr.errors import AudioError, MissingInputError

log = logging.getLogger(__name__)

# Very high quality, as SoX's `rate -v` that made the dev set; cheap next to the model.
RESAMPLE_QUALITY = "VHQ"
# Sample rates a file may declare: below 4 kHz there is no speech band left (and a header
# declaring 1 Hz would be resampled into hours of audio); above, no converter goes.
MIN_RATE, MAX_RATE = 4000, 768_000


def load_audio(path: str | os.PathLike[str], sample_rate: int) -> np.ndarray:
    """The file's audio as float32 mono in [-1, 1] at sample_rate Hz (channels averaged)."""
    name = os.fspath(path)
    check_path(name)
    try:
        with open(name, "rb") as file:
            audio, file_rate = _decode(file, name)
    except FileNotFoundError:
        raise MissingInputError(f"audio file {name} does not exist") from None
    except IsADirectoryError:
        raise MissingInputError(f"audio file {name} is a directory") from None
    except PermissionError:
        raise MissingInputError(f"audio file {name} cannot be read: permission denied") from None
    except OSError as e:
        raise AudioError(f"audio file {name} cannot be read: {e.strerror or e}") from None
    _check_content(audio, name)
    mono = audio.mean(axis=1, dtype=np.float32) if audio.shape[1] > 1 else audio[:, 0]
    if file_rate != sample_rate:
        log.debug("resampling %s from %d Hz to %d Hz", name, file_rate, sample_rate)
        mono = soxr.resample(mono, file_rate, sample_rate, quality=RESAMPLE_QUALITY)
    return np.ascontiguousarray(mono, dtype=np.float32)


def _decode(file: BinaryIO, name: str) -> tuple[np.ndarray, int]:
    """All frames as float32 [frames, channels], and the file's sample rate."""
    if os.fstat(file.fileno()).st_size == 0:
        raise AudioError(f"audio file {name} holds no audio: the file is empty")
    try:
        with sf.SoundFile(file) as sound:
            check_header(name, sound.samplerate, sound.frames)
            audio = sound.read(dtype="float32", always_2d=True)
            rate = sound.samplerate
            warn_if_truncated(sound, name)
    except (sf.SoundFileError, RuntimeError) as e:
        # libsndfile's own reason, e.g. "Format not recognised."
        reason = getattr(e, "error_string", None) or str(e) or type(e).__name__
        raise AudioError(f"audio file {name} cannot be decoded: {reason}") from None
    return audio, rate


def check_path(name: str) -> None:
    """A device or a FIFO named for what it is, before it is opened (a FIFO blocks the open, a
    device reads forever or holds no header)."""
    kind = special_file(Path(name))
    if kind is not None:
        raise MissingInputError(f"audio file {name} is {kind}, not an audio file")


def check_header(name: str, rate: int, frames: int) -> None:
    """What the header declares, before any audio is read."""
    if frames == 0:
        raise AudioError(f"audio file {name} holds no audio: its header declares no samples")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(f"audio file {name} declares a sample rate of {rate} Hz: not audio "
                         f"({MIN_RATE}..{MAX_RATE} Hz)")


def check_finite(samples: np.ndarray, name: str) -> None:
    if not np.isfinite(samples).all():
        raise AudioError(f"audio file {name} is corrupt: it holds samples that are not numbers (NaN or infinite)")


def inspect_file(path: str | os.PathLike[str]) -> str:
    """Everything `load_audio` and the daemon's file source would refuse, found by reading the
    file once without keeping it (for `edgeasr check`): a device or FIFO, an absurd header,
    samples that are not numbers, digital silence. Returns a short description."""
    name = os.fspath(path)
    check_path(name)
    try:
        with sf.SoundFile(name) as sound:
            check_header(name, sound.samplerate, sound.frames)
            heard = False
            for block in sound.blocks(blocksize=1 << 16, dtype="float32", always_2d=True):
                check_finite(block, name)
                heard = heard or bool(block.any())
            rate, channels, frames = sound.samplerate, sound.channels, sound.frames
    except (sf.SoundFileError, RuntimeError) as e:
        reason = getattr(e, "error_string", None) or str(e) or type(e).__name__
        raise AudioError(f"audio file {name} cannot be decoded: {reason}") from None
    if not heard:
        raise AudioError(f"audio file {name} is digital silence: every sample is zero")
    return f"{rate} Hz, {channels} channel{'s' if channels > 1 else ''}, {frames / rate:.1f} s"


_TRUNCATED = re.compile(r"^data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.M)


def warn_if_truncated(sound: sf.SoundFile, name: str) -> None:
    """A file whose header promises more audio than it holds (a copy cut short, a recorder
    killed): libsndfile reads what is there and notes the difference in its log."""
    match = _TRUNCATED.search(sound.extra_info)
    if match and int(match.group(2)) < int(match.group(1)):
        promised, held = int(match.group(1)), int(match.group(2))
        log.warning("audio file %s is truncated: its header promises %d bytes of audio, it holds %d "
                    "(%.0f%%); transcribing what is there", name, promised, held, 100 * held / promised)


def _check_content(audio: np.ndarray, name: str) -> None:
    if audio.size == 0:
        raise AudioError(f"audio file {name} holds no audio: it has no samples")
    check_finite(audio, name)
    if not audio.any():
        raise AudioError(f"audio file {name} is digital silence: every sample is zero")
