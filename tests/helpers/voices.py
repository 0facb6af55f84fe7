"""Commands said by a synthetic voice (the `speakers` fixture: piper and espeak-ng), as the
command sets say them."""

from __future__ import annotations

import numpy as np

from edgeasr.models.voices import Speakers, Voice
from edgeasr.stages import SAMPLE_RATE

JOE = Voice("piper", "en_US-joe-medium", 1.0, 0.667)
LEAD_S = 0.3  # the silence before and after a command said


def said(speakers: Speakers, text: str, voice: Voice = JOE) -> np.ndarray:
    """`text` said by `voice`, with 0.3 s of silence before and after: float32 at 16 kHz."""
    pause = np.zeros(int(LEAD_S * SAMPLE_RATE), np.float32)
    return np.concatenate([pause, speakers.say(text, voice), pause])
