"""MqttPublisher as the daemon builds it, against a test's broker (helpers.broker), and what its
subscriber received."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeasr.config import load_config
from edgeasr.output.mqtt import MqttPublisher, Topics
from edgeasr.output.outbox import Outbox
from edgeasr.stages import Transcript
from helpers.broker import Broker, Subscriber
from helpers.payload import make_inputs, transcript

DEVICE = "dev1"
TOPICS = Topics.for_device("edgeasr", DEVICE)
INFO = {"version": "0.0-test", "model": "tiny.en", "backend": "onnx"}


def sample_draft(i: int) -> Transcript:
    """The i-th made-up transcript: its text is "utterance i"."""
    segment, transcription = make_inputs(text=f" utterance {i}")
    return transcript(segment, transcription)


def publisher_and_outbox(broker: Broker, state: Path, outbox_class: type[Outbox] = Outbox,
                         **mqtt: Any) -> tuple[MqttPublisher, Outbox]:
    """A publisher (not started) configured the daemon's way, through edgeasr.config: the broker's
    mqtt.* keys and `mqtt` more (helpers.broker.Broker.overrides: "__" for "."); its outbox in
    `state`, for the test to look into."""
    options = load_config(None, broker.overrides(**mqtt)).mqtt
    outbox = outbox_class.in_state_dir(state, options.outbox_max)
    return MqttPublisher(options, device_id=DEVICE, outbox=outbox, **INFO), outbox


def make_publisher(broker: Broker, state: Path, **mqtt: Any) -> MqttPublisher:
    """publisher_and_outbox's publisher alone."""
    return publisher_and_outbox(broker, state, **mqtt)[0]


def transcripts(sub: Subscriber) -> list[dict]:
    """The transcript messages received, in arrival order, repeats included."""
    return [m.json() for m in sub.on(TOPICS.transcript)]


def distinct_seqs(sub: Subscriber) -> list[int]:
    """Seqs in arrival order, repeats (at-least-once redeliveries) dropped."""
    seen: list[int] = []
    for message in transcripts(sub):
        if message["seq"] not in seen:
            seen.append(message["seq"])
    return seen


def wait_seqs(sub: Subscriber, n: int, timeout_s: float = 15.0) -> list[int]:
    """distinct_seqs once there are `n` of them (or the time is up: the test compares the list)."""
    sub.wait_for(lambda s: len(distinct_seqs(s)) >= n, timeout_s)
    return distinct_seqs(sub)
