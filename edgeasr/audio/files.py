"""Audio files (WAV, FLAC, OGG, ...) to float32 mono at the model's sample rate.

Decoding is libsndfile's (soundfile), resampling soxr's. Files with nothing to
transcribe are refused with an AudioError, so callers can skip them: Hailo's sample
app crashes on digital silence.
"""

from __future__ import annotations

import logging
import os
import re
from typing import BinaryIO

import numpy as np
import soundfile as sf
import soxr

from edgeasr.errors import AudioError, MissingInputError

log = logging.getLogger(__name__)

# Very high quality, as SoX's `rate -v` that made the dev set; cheap next to the model.
RESAMPLE_QUALITY = "VHQ"


def load_audio(path: str | os.PathLike[str], sample_rate: int) -> np.ndarray:
    """The file's audio as float32 mono in [-1, 1] at sample_rate Hz (channels averaged)."""
    name = os.fspath(path)
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
            audio = sound.read(dtype="float32", always_2d=True)
            rate = sound.samplerate
            warn_if_truncated(sound, name)
    except (sf.SoundFileError, RuntimeError) as e:
        # libsndfile's own reason, e.g. "Format not recognised."
        reason = getattr(e, "error_string", None) or str(e) or type(e).__name__
        raise AudioError(f"audio file {name} cannot be decoded: {reason}") from None
    return audio, rate


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
    if not np.isfinite(audio).all():
        raise AudioError(f"audio file {name} is corrupt: it holds samples that are not numbers")
    if not audio.any():
        raise AudioError(f"audio file {name} is digital silence: every sample is zero")
