"""The published messages against the shipped JSON Schema, and the stdout publisher."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import io
import json
import math
import uuid
from pathlib import Path

import jinja2
import jsonschema
import pytest
from helpers.payload import PARTIAL, make_inputs, transcript, validator

from edgeasr import __version__
from edgeasr.errors import OutputError
from edgeasr.output import payload as msgs
from edgeasr.output.outbox import Outbox
from edgeasr.stages import SpeechSegment, Transcript, Transcription, Word

SOURCE = {"device_id": "d", "model": "m", "backend": "b"}
def draft(segment: SpeechSegment, transcription: Transcription) -> dict:
    return msgs.build_transcript(transcript(segment, transcription), device_id="d", model="m", backend="b")


def make_transcript(**kwargs) -> dict:
    segment, transcription = make_inputs(**kwargs)
    built = msgs.build_transcript(
        transcript(segment, transcription), device_id="kitchen-pi", model="tiny.en", backend="onnx"
    )
    return msgs.finish(built, now_mono=segment.speech_end_mono + 0.4321, seq=7)


def test_transcript_is_valid_and_carries_the_inputs():
    message = make_transcript()
    validator().validate(message)
    assert uuid.UUID(message["id"]).version == 4
    assert message["seq"] == 7
    assert message["text"] == "Hello there, general."
    assert message["start"] == "2025-03-01T12:00:05.250Z"
    assert message["end"] == "2025-03-01T12:00:07.750Z"
    assert message["duration_s"] == 2.5
    assert message["avg_logprob"] == pytest.approx((-0.2 * 3 - 0.6) / 4, abs=1e-4)
    assert message["no_speech_prob"] == 0.02
    assert message["timings_ms"] == {"features": 3.1, "encoder": 41.0, "decoder": 120.5, "total": 164.6}
    assert message["latency_ms"] == pytest.approx(432.1, abs=0.1)
    assert not any(key.startswith("_") for key in message)


def with_words(transcription: Transcription) -> Transcription:
    """The segments with words, as the engine times them with output.words (seconds from the
    audio start, the leading space kept)."""
    words = [(Word(" Hello", 0.1, 0.42, 0.9871), Word(" there,", 0.42, 0.9, 0.61234)),
             (Word(" general.", 1.3, 2.05, 0.5),)]
    segments = tuple(dataclasses.replace(s, words=w) for s, w in zip(transcription.segments, words))
    return dataclasses.replace(transcription, segments=segments)


def test_transcript_words_with_output_words():
    segment, transcription = make_inputs()
    message = msgs.finish(draft(segment, with_words(transcription)), now_mono=segment.speech_end_mono, seq=1)
    validator().validate(message)
    assert message["words"] == [
        {"word": "Hello", "start": 0.1, "end": 0.42, "probability": 0.9871},
        {"word": "there,", "start": 0.42, "end": 0.9, "probability": 0.6123},
        {"word": "general.", "start": 1.3, "end": 2.05, "probability": 0.5},
    ]
    assert "words" not in make_transcript()  # output.words off: the engine timed none


@pytest.mark.parametrize("change", [
    lambda w: w.pop("probability"),
    lambda w: w.update(start=-0.1),
    lambda w: w.update(word=""),
    lambda w: w.update(probability=1.5),
    lambda w: w.update(tokens=[1, 2]),
])
def test_schema_rejects_broken_words(change):
    segment, transcription = make_inputs()
    message = msgs.finish(draft(segment, with_words(transcription)), now_mono=segment.speech_end_mono, seq=1)
    change(message["words"][1])
    with pytest.raises(jsonschema.ValidationError):
        validator().validate(message)


def test_each_transcript_gets_its_own_id():
    assert make_transcript()["id"] != make_transcript()["id"]


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.pop("seq"),
        lambda m: m.update(seq=None),
        lambda m: m.update(start="2025-03-01T12:00:05Z"),  # no milliseconds
        lambda m: m.update(end="2025-03-01T12:00:05.250+00:00"),  # not 'Z'
        lambda m: m.update(id="not-a-uuid"),
        lambda m: m.update(extra=1),
        lambda m: m["timings_ms"].pop("total"),
        lambda m: m.update(device_id="kitchen/pi"),
    ],
)
def test_schema_rejects_broken_transcripts(change):
    message = copy.deepcopy(make_transcript())
    change(message)
    with pytest.raises(jsonschema.ValidationError):
        validator().validate(message)


def test_draft_is_not_publishable_until_finished():
    assert not validator().is_valid(draft(*make_inputs()))


def test_utc_iso_converts_and_rejects_naive_times():
    plus_one = dt.datetime(2025, 3, 1, 13, 0, 0, 999_999, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert msgs.utc_iso(plus_one) == "2025-03-01T12:00:00.999Z"
    with pytest.raises(ValueError):
        msgs.utc_iso(dt.datetime(2025, 3, 1))


def test_hermes_text_captured():
    transcript = make_transcript()
    hermes = msgs.hermes_text_captured(transcript, site_id="kitchen")
    validator("hermesTextCaptured").validate(hermes)
    assert hermes["likelihood"] == pytest.approx(math.exp(transcript["avg_logprob"]), abs=1e-4)
    assert hermes["seconds"] == pytest.approx(0.1646, abs=1e-3)  # ms precision
    assert hermes["siteId"] == "kitchen" and "sessionId" not in hermes
    with_session = msgs.hermes_text_captured(transcript, site_id="kitchen", session_id="s-1")
    validator("hermesTextCaptured").validate(with_session)
    assert with_session["sessionId"] == "s-1"


def test_status_error_metrics_messages():
    online = msgs.status_message("online", version=__version__, model="tiny.en", backend="hailo")
    validator("status").validate(online)
    validator("status").validate(msgs.status_message("offline"))
    assert not validator("status").is_valid({"state": "online"})  # online names what runs
    validator("error").validate(msgs.error_message("encoder timeout", device_id="d1", context="hailo"))
    outbox = {"depth": 0, "evicted": 0, "rejected": 0, "connected": True}
    metrics = msgs.metrics_message("d1", {"latency_ms": {"p50": 410.0, "p95": 900.0}, "outbox": outbox})
    validator("metrics").validate(metrics)
    assert not validator("metrics").is_valid(msgs.metrics_message("d1", {}))


def test_home_assistant_discovery_config_and_state_template():
    config = msgs.ha_discovery_config(
        device_id="kitchen-pi",
        transcript_topic="edgeasr/kitchen-pi/transcript",
        status_topic="edgeasr/kitchen-pi/status",
        version=__version__,
        model="tiny.en",
        backend="onnx",
    )
    validator("haSensorConfig").validate(config)
    assert msgs.ha_discovery_topic("homeassistant", "kitchen-pi") == (
        "homeassistant/sensor/edgeasr_kitchen-pi/transcript/config"
    )
    assert config["device"]["identifiers"] == ["edgeasr_kitchen-pi"]
    # HA renders value_template with Jinja2 and value_json = the transcript
    long = make_transcript(text="word " * 100)
    env = jinja2.Environment()
    state = env.from_string(config["value_template"]).render(value_json=long)
    assert len(long["text"]) > msgs.HA_STATE_MAX_CHARS and state == long["text"][: msgs.HA_STATE_MAX_CHARS]
    availability = config["availability"][0]
    online = msgs.status_message("online", version="1", model="m", backend="b")
    assert env.from_string(availability["value_template"]).render(value_json=online) == "online"
    offline = msgs.status_message("offline")
    assert env.from_string(availability["value_template"]).render(value_json=offline) == "offline"


def test_stdout_publisher_writes_one_flushed_line_per_transcript():
    segment, transcription = make_inputs()
    stream = io.StringIO()
    publisher = msgs.StdoutPublisher(stream=stream, **SOURCE)
    for _ in range(3):
        publisher.publish(transcript(segment, transcription))
    publisher.close(1.0)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    messages = [json.loads(line) for line in lines]
    for message in messages:
        validator().validate(message)
    assert [m["seq"] for m in messages] == [1, 2, 3]


def test_stdout_publisher_seq_survives_restart_through_the_outbox(tmp_path: Path):
    segment, transcription = make_inputs()
    seqs = []
    for _ in range(2):  # two daemon runs
        outbox = Outbox.in_state_dir(tmp_path, max_items=10)
        stream = io.StringIO()
        publisher = msgs.StdoutPublisher(stream=stream, next_seq=outbox.next_seq, **SOURCE)
        for _ in range(2):
            publisher.publish(transcript(segment, transcription))
        outbox.close()
        seqs += [json.loads(line)["seq"] for line in stream.getvalue().splitlines()]
    assert seqs == [1, 2, 3, 4]


def test_stdout_publisher_closed_stream_is_an_output_error():
    stream = io.StringIO()
    stream.close()
    segment, transcription = make_inputs()
    with pytest.raises(OutputError, match="stdout"):
        msgs.StdoutPublisher(stream=stream, **SOURCE).publish(transcript(segment, transcription))


def test_schema_is_shipped_as_package_data():
    import importlib.resources

    resource = importlib.resources.files("edgeasr.output").joinpath(msgs.SCHEMA_RESOURCE)
    assert resource.is_file()
    schema = json.loads(resource.read_text("utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_a_partial_message_is_valid_and_shares_the_final_id():
    segment, transcription = make_inputs()
    final = transcript(segment, transcription)
    partial = Transcript(final.id, segment, transcription, 12.0, partial=True)
    message = msgs.partial_message(partial, device_id="kitchen-pi")
    validator(PARTIAL).validate(message)
    assert message["id"] == final.id and message["text"] == "Hello there, general."
    with pytest.raises(jsonschema.ValidationError):
        validator(PARTIAL).validate({**message, "seq": 1})  # partials are not numbered


def test_stdout_carries_final_transcripts_only():
    segment, transcription = make_inputs()
    stream = io.StringIO()
    publisher = msgs.StdoutPublisher(stream=stream, **SOURCE)
    final = transcript(segment, transcription)
    publisher.publish(Transcript(final.id, segment, transcription, 1.0, partial=True))
    publisher.publish(final)
    assert [json.loads(line)["id"] for line in stream.getvalue().splitlines()] == [final.id]
