"""Where the decode of speech that ended in a pause stops reading.

The microphone pipeline and the Wyoming sessions speculate: once a pause has lasted
`pipeline.speculate_after_ms`, the speech so far is decoded, and that result is the transcript
if no speech follows. Whether it was ready in time depends on the machine, so the decode made
without it must read the same audio, or the same speech would give different text from one
round to the next: both read up to that long past the last frame the VAD heard speech in.

A VAD can miss quiet speech (webrtcvad heard 3 frames of a FLEURS sentence at -67 dBFS): audio
past that point as loud as the speech heard is read too.
"""

from __future__ import annotations

import numpy as np

from edgeasr.stages import SAMPLE_RATE

FRAME_S = 0.03  # the frames whose power is compared
# the pause past the speech holds no frame louder than this, against the speech's loud frames
QUIET_DB = -10.0
LOUD_PERCENTILE = 90  # the speech's level: this percentile of its frames' power


def decode_until(samples: np.ndarray, speech_end: int, after_ms: int | None) -> int:
    """How many of `samples` a decode reads, the last speech frame ending at `speech_end`
    (samples from their start; 0: the VAD heard none): up to `after_ms` past it, or all."""
    end = speech_end + (after_ms or 0) * SAMPLE_RATE // 1000
    if after_ms is None or speech_end <= 0 or end >= len(samples):
        return len(samples)
    frame = int(FRAME_S * SAMPLE_RATE)
    heard, rest = _frame_power(samples[:speech_end], frame), _frame_power(samples[end:], frame)
    if len(heard) == 0 or len(rest) == 0:
        return end
    loud = float(np.percentile(heard, LOUD_PERCENTILE))
    return end if float(rest.max()) < loud * 10 ** (QUIET_DB / 10) else len(samples)


def _frame_power(samples: np.ndarray, frame: int) -> np.ndarray:
    n = len(samples) // frame
    x = np.asarray(samples[: n * frame], dtype=np.float32).reshape(n, frame)
    return np.mean(np.square(x), axis=1)
