"""The published messages: the shipped JSON Schema as a validator, and a transcript made up the
way the engine and the segmenter hand one to the publishers."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import jsonschema
import numpy as np

from edgeasr.output import payload as msgs
from edgeasr.stages import SAMPLE_RATE, SpeechSegment, TextSegment, Transcript, Transcription

PARTIAL = "partial"  # the $defs entry of the partial message
T0 = dt.datetime(2025, 3, 1, 12, 0, 5, 250_000, tzinfo=dt.UTC)


def validator(definition: str | None = None) -> jsonschema.Draft202012Validator:
    """The shipped schema (or one of its $defs, such as "status" or PARTIAL) as a strict validator."""
    schema = msgs.load_schema()
    if definition is not None:
        schema = {**schema, "$ref": f"#/$defs/{definition}"}
        for key in ("type", "required", "properties", "additionalProperties"):
            schema.pop(key)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def make_inputs(text: str = " Hello there, general.", seconds: float = 2.5, end_mono: float | None = None):
    """A segment of `seconds` of silence at T0 and a two-piece transcription of `text` for it."""
    n = int(seconds * SAMPLE_RATE)
    segment = SpeechSegment(
        samples=np.zeros(n, dtype=np.int16),
        start_sample=16_000,
        end_sample=16_000 + n,
        start_utc=T0,
        end_utc=T0 + dt.timedelta(seconds=seconds),
        speech_end_mono=time.monotonic() if end_mono is None else end_mono,
        seq=3,
    )
    pieces = (
        TextSegment(0.0, 1.2, " Hello there,", (1, 2, 3), -0.2, 0.01, 1.1),
        TextSegment(1.2, 2.4, " general.", (4,), -0.6, 0.02, 1.0),
    )
    transcription = Transcription(
        text=text,
        segments=pieces,
        language="en",
        windows=1,
        tokens=4,
        consumed_samples=n,
        timings_ms={"features": 3.14159, "encoder": 41.0, "decoder": 120.5},
    )
    return segment, transcription


def transcript(segment: SpeechSegment, transcription: Transcription) -> Transcript:
    """The final Transcript of the two, under a new utterance id."""
    busy = sum(transcription.timings_ms.values())  # all the engine's time went into the stages
    return Transcript(str(uuid.uuid4()), segment, transcription, busy)
