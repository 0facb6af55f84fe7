"""The messages edgeasr publishes, and the stdout publisher.

The transcript message is a public contract, described by the JSON Schema shipped next to
this module (`transcript.schema.json`, draft 2020-12; its `$defs` describe the companion
messages: status, error, metrics, Hermes textCaptured, Home Assistant discovery).

A transcript is built in two steps: `build_transcript` makes a *draft* when the engine
returns, then `finish` completes it at publish time (`latency_ms`, and `seq` when the
publisher numbers it; the MQTT outbox numbers transcripts itself, durably).  Draft keys
starting with "_" are publish-time inputs and never leave this process.
"""

from __future__ import annotations

import datetime as dt
import importlib.resources
import itertools
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from edgeasr.errors import OutputError
from edgeasr.stages import Intent, Transcript, Word

SCHEMA_RESOURCE = "transcript.schema.json"
HA_STATE_MAX_CHARS = 255  # Home Assistant rejects longer entity states
HERMES_TEXT_CAPTURED_TOPIC = "hermes/asr/textCaptured"
_SPEECH_END_MONO = "_speech_end_mono"  # private draft key: time.monotonic() at end of speech


def load_schema() -> dict[str, Any]:
    """The shipped JSON Schema (package data)."""
    text = importlib.resources.files("edgeasr.output").joinpath(SCHEMA_RESOURCE).read_text("utf-8")
    return json.loads(text)


def utc_iso(moment: dt.datetime) -> str:
    """ISO 8601 UTC with milliseconds and 'Z', e.g. 2025-01-31T12:00:05.250Z."""
    if moment.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware (UTC)")
    utc = moment.astimezone(dt.UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def build_transcript(transcript: Transcript, *, device_id: str, model: str, backend: str,
                     intent: bool = False) -> dict[str, Any]:
    """A transcript draft; publishers complete it with `finish`. intent: carry what the
    transcript asks of the home, when it is one of its commands (output.intent)."""
    segment, transcription = transcript.segment, transcript.transcription
    timings = transcription.timings_ms
    parts = {name: round(float(timings.get(name, 0.0)), 1) for name in ("features", "encoder", "decoder")}
    words = [word_message(w) for s in transcription.segments for w in s.words]
    return {
        "id": transcript.id,
        "seq": None,
        "device_id": device_id,
        "text": transcription.text.strip(),
        "lang": transcription.language,
        "start": utc_iso(segment.start_utc),
        "end": utc_iso(segment.end_utc),
        "duration_s": round(segment.duration_s, 3),
        "avg_logprob": round(transcription.avg_logprob, 4),
        "no_speech_prob": round(transcription.no_speech_prob, 4),
        "model": model,
        "backend": backend,
        "timings_ms": {**parts, "total": round(transcript.busy_ms, 1)},
        "latency_ms": None,
        **({"words": words} if words else {}),  # output.words: the engine timed them
        **({"intent": intent_message(transcription.intent)} if intent and transcription.intent else {}),
        _SPEECH_END_MONO: segment.speech_end_mono,
    }


def intent_message(intent: Intent) -> dict[str, Any]:
    """An intent as Home Assistant's matcher returns it: its name, and each slot's value."""
    return {"name": intent.name, "slots": dict(intent.slots)}


def word_message(word: Word) -> dict[str, Any]:
    """A word of the transcript: its text without the space before it, start and end in
    seconds from the transcript's `start` (the engine's audio starts there)."""
    return {"word": word.word.strip(), "start": round(word.start, 3), "end": round(word.end, 3),
            "probability": round(word.probability, 4)}


def partial_message(transcript: Transcript, *, device_id: str) -> dict[str, Any]:
    """`{prefix}/{device}/partial`: the text so far of speech still going on. `id` is the one
    the final transcript will carry; `end` is where the audio decoded so far ends."""
    segment = transcript.segment
    return {
        "id": transcript.id,
        "device_id": device_id,
        "text": transcript.transcription.text.strip(),
        "lang": transcript.transcription.language,
        "start": utc_iso(segment.start_utc),
        "end": utc_iso(segment.end_utc),
        "time": utc_iso(dt.datetime.now(dt.UTC)),
    }


def finish(draft: Mapping[str, Any], *, now_mono: float, seq: int | None = None) -> dict[str, Any]:
    """The publishable transcript: latency filled in, private keys dropped, seq set if given."""
    message = {key: value for key, value in draft.items() if not key.startswith("_")}
    speech_end = draft.get(_SPEECH_END_MONO)
    if speech_end is not None:
        message["latency_ms"] = round(max(0.0, now_mono - speech_end) * 1000.0, 1)
    elif message.get("latency_ms") is None:
        message["latency_ms"] = 0.0
    if seq is not None:
        message["seq"] = seq
    return message


def hermes_text_captured(
    transcript: Mapping[str, Any], *, site_id: str, session_id: str | None = None
) -> dict[str, Any]:
    """Rhasspy Hermes `hermes/asr/textCaptured` (camelCase keys, as Hermes has them)."""
    message: dict[str, Any] = {
        "text": transcript["text"],
        "likelihood": round(math.exp(transcript["avg_logprob"]), 4),
        "seconds": round(transcript["timings_ms"]["total"] / 1000.0, 3),  # transcription time
        "siteId": site_id,
        "lang": transcript["lang"],
    }
    if session_id is not None:
        message["sessionId"] = session_id
    return message


def status_message(state: str, *, version: str = "", model: str = "", backend: str = "") -> dict[str, Any]:
    """`{prefix}/{device}/status`: {"state": "offline"} is the last will; online carries versions."""
    if state == "offline":
        return {"state": "offline"}
    return {"state": state, "version": version, "model": model, "backend": backend}


def error_message(error: str, *, device_id: str, context: str | None = None,
                  resolved: bool = False) -> dict[str, Any]:
    """`{prefix}/{device}/error` (the shape of Hermes' hermes/error/asr); `resolved` marks
    the message that says a reported problem is over (e.g. storage recovered)."""
    message: dict[str, Any] = {
        "error": error,
        "context": context,
        "device_id": device_id,
        "time": utc_iso(dt.datetime.now(dt.UTC)),
    }
    if resolved:
        message["resolved"] = True
    return message


def metrics_message(device_id: str, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """`{prefix}/{device}/metrics`: the daemon's counters plus the time they were taken."""
    return {**metrics, "device_id": device_id, "time": utc_iso(dt.datetime.now(dt.UTC))}


def ha_discovery_config(
    *,
    device_id: str,
    transcript_topic: str,
    status_topic: str,
    version: str,
    model: str,
    backend: str,
) -> dict[str, Any]:
    """Home Assistant MQTT discovery config for a "last transcript" sensor.

    The state comes straight from the transcript topic (cut to HA's 255-character state
    limit by the template) and the whole transcript becomes the entity's attributes, so
    nothing extra is published per transcript.
    """
    node = ha_node_id(device_id)
    return {
        "name": "Transcript",
        "unique_id": f"{node}_transcript",
        "state_topic": transcript_topic,
        "value_template": f"{{{{ value_json.text[:{HA_STATE_MAX_CHARS}] }}}}",
        "json_attributes_topic": transcript_topic,
        "availability": [
            {
                "topic": status_topic,
                "value_template": "{{ value_json.state }}",
                "payload_available": "online",
                "payload_not_available": "offline",
            }
        ],
        "qos": 1,
        "icon": "mdi:microphone-message",
        "device": {
            "identifiers": [node],
            "name": f"edgeasr {device_id}",
            "manufacturer": "edgeasr",
            "model": f"{model} ({backend})",
            "sw_version": version,
        },
        "origin": {"name": "edgeasr", "sw_version": version},
    }


def ha_node_id(device_id: str) -> str:
    return f"edgeasr_{device_id}"


def ha_discovery_topic(ha_prefix: str, device_id: str) -> str:
    """<discovery_prefix>/<component>/<node_id>/<object_id>/config"""
    return f"{ha_prefix}/sensor/{ha_node_id(device_id)}/transcript/config"


def dumps(message: Mapping[str, Any]) -> str:
    """Compact UTF-8 JSON, the wire form of every message."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class StdoutPublisher:
    """One JSON line per final transcript on stdout (or `stream`), flushed at once.

    `next_seq` numbers the transcripts; pass `Outbox.next_seq` to keep `seq` monotonic
    across restarts, else a per-process counter from 1 is used.
    """

    def __init__(self, *, device_id: str, model: str, backend: str, stream: TextIO | None = None,
                 next_seq: Callable[[], int] | None = None, intent: bool = False) -> None:
        self._source = {"device_id": device_id, "model": model, "backend": backend}
        self._intent = intent  # output.intent
        self._stream = stream if stream is not None else sys.stdout
        self._next_seq = next_seq or itertools.count(1).__next__
        self._lock = threading.Lock()  # one line at a time, in seq order

    def publish(self, transcript: Transcript) -> None:
        if transcript.partial:
            return  # a JSON-lines consumer wants each utterance once
        draft = build_transcript(transcript, **self._source, intent=self._intent)
        with self._lock:
            message = finish(draft, now_mono=time.monotonic(), seq=self._next_seq())
            try:
                self._stream.write(dumps(message) + "\n")
                self._stream.flush()
            except (BrokenPipeError, ValueError) as exc:  # ValueError: stream already closed
                raise OutputError(f"stdout: cannot write transcripts ({exc})") from exc

    def close(self, timeout_s: float) -> None:
        try:
            self._stream.flush()
        except (BrokenPipeError, ValueError):
            pass  # the reader went away; nothing is left to deliver
