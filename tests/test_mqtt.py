"""MqttPublisher against a real Mosquitto: order, outages, SIGKILL, bound, TLS, extras."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.broker import TEST_PASSWORD, Broker
from helpers.mqtt import DEVICE, INFO, TOPICS, make_publisher, sample_draft, transcripts, wait_seqs
from helpers.payload import validator
from helpers.waiting import wait_until

from edgeasr.errors import ConfigError, MissingInputError
from edgeasr.output import payload as msgs
from edgeasr.output.outbox import Outbox

TESTS = Path(__file__).resolve().parent
PAHO_LOG = "edgeasr.output.paho_client.paho"  # paho's own log lines, at DEBUG


def test_transcripts_arrive_in_order_and_match_the_schema(mosquitto, subscribe, tmp_path):
    sub = subscribe(mosquitto, [f"edgeasr/{DEVICE}/#"])
    pub = make_publisher(mosquitto, tmp_path / "state").start()
    assert pub.wait_connected(10)
    for i in range(30):
        pub.publish(sample_draft(i))
    assert pub.flush(10)
    assert wait_seqs(sub, 30) == list(range(1, 31))
    check = validator()
    received = transcripts(sub)
    for message in received:
        check.validate(message)
    assert [m["text"] for m in received] == [f"utterance {i}" for i in range(30)]
    assert len({m["id"] for m in received}) == 30
    status = [m.json() for m in sub.on(TOPICS.status)]
    assert status[0] == {"state": "online", **INFO}
    pub.close(5)
    assert sub.wait_for(lambda s: s.on(TOPICS.status)[-1].json() == {"state": "offline"}, 5)


def test_broker_outage_mid_stream_loses_nothing(mosquitto, subscribe, tmp_path):
    sub = subscribe(mosquitto, [TOPICS.transcript])
    pub = make_publisher(mosquitto, tmp_path / "state").start()
    assert pub.wait_connected(10)
    for i in range(5):
        pub.publish(sample_draft(i))
    assert pub.flush(10)
    mosquitto.stop()
    wait_until(lambda: not pub.connected, 5)
    for i in range(5, 10):
        pub.publish(sample_draft(i))
    assert pub.stats()["depth"] == 5  # kept on disk while the broker is away
    wait_until(lambda: pub.stats()["connect_failure"] is not None, 15)  # it tried, and will again
    mosquitto.start()
    for i in range(10, 15):
        pub.publish(sample_draft(i))
    assert wait_seqs(sub, 15) == list(range(1, 16))
    assert pub.flush(10)
    pub.close(5)


def sent_transcripts(caplog) -> int:
    """How many transcript PUBLISH packets paho has sent, from its own debug lines."""
    return sum(r.getMessage().startswith("paho: Sending PUBLISH") and TOPICS.transcript in r.getMessage()
               for r in caplog.records if r.name == PAHO_LOG)


def test_unacknowledged_transcripts_are_replayed_in_order_after_broker_crash(mosquitto, subscribe, tmp_path,
                                                                             caplog):
    caplog.set_level(logging.DEBUG, logger=PAHO_LOG)
    sub = subscribe(mosquitto, [TOPICS.transcript])
    pub = make_publisher(mosquitto, tmp_path / "state").start()
    assert pub.wait_connected(10)
    for i in range(3):
        pub.publish(sample_draft(i))
    assert pub.flush(10)
    # the broker's next autosave (every second) persists the subscriber's session
    saved = mosquitto.data / "mosquitto.db"
    after = time.time_ns()
    wait_until(lambda: saved.exists() and saved.stat().st_mtime_ns > after, 5)
    mosquitto.proc.send_signal(signal.SIGSTOP)  # frozen: transcripts go out, no PUBACK comes back
    before = sent_transcripts(caplog)
    for i in range(3, 8):
        pub.publish(sample_draft(i))
    # the sender hands all five to paho, which sends them: five more PUBLISH packets on the wire
    wait_until(lambda: sent_transcripts(caplog) - before == 5, 10, lambda: caplog.text[-3000:])
    assert pub.connected and pub.stats()["depth"] == 5  # sent, and still unacknowledged
    mosquitto.kill()
    mosquitto.start()
    assert wait_seqs(sub, 8) == list(range(1, 9))
    assert pub.flush(10)
    pub.close(5)


PUBLISHER_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[3])
from pathlib import Path
from edgeasr.config import load_config
from edgeasr.output.mqtt import MqttPublisher
from edgeasr.output.outbox import Outbox
from helpers.mqtt import DEVICE, INFO, sample_draft
options = load_config(None, json.loads(sys.argv[1])).mqtt
outbox = Outbox.in_state_dir(Path(sys.argv[2]), options.outbox_max)
pub = MqttPublisher(options, device_id=DEVICE, outbox=outbox, **INFO).start()
for line in sys.stdin:
    command, *args = line.split()
    if command == "wait-connected":
        print("connected" if pub.wait_connected(10) else "not-connected", flush=True)
    elif command == "publish":
        for i in range(int(args[0])):
            pub.publish(sample_draft(i))
        print("stored", len(outbox), flush=True)
"""


class PublisherProcess:
    """The publisher in a child process, driven line by line through stdin."""

    def __init__(self, broker: Broker, state: Path) -> None:
        config = json.dumps(broker.overrides())
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PUBLISHER_SCRIPT, config, str(state), str(TESTS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def ask(self, command: str) -> str:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        assert answer, self.proc.stderr.read() if self.proc.poll() is not None else "no answer"
        return answer

    def sigkill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(10) == -signal.SIGKILL


def test_sigkilled_publisher_delivers_its_outbox_after_restart(mosquitto, subscribe, tmp_path):
    state = tmp_path / "state"
    sub = subscribe(mosquitto, [TOPICS.transcript])
    first = PublisherProcess(mosquitto, state)
    assert first.ask("wait-connected") == "connected"
    mosquitto.stop()  # nothing can be acknowledged now
    assert first.ask("publish 6") == "stored 6"
    first.sigkill()  # paho's in-memory queue dies here; the outbox does not
    mosquitto.start()
    left = Outbox.in_state_dir(state, 1000)
    assert len(left) == 6
    left.close()
    second = make_publisher(mosquitto, state).start()
    assert second.wait_connected(10)
    assert wait_seqs(sub, 6) == [1, 2, 3, 4, 5, 6]
    assert [m["text"] for m in transcripts(sub)[:6]] == [f"utterance {i}" for i in range(6)]
    second.publish(sample_draft(99))
    assert wait_seqs(sub, 7)[-1] == 7  # seq continues across the crash
    assert second.flush(10)
    second.close(5)


def test_status_is_retained_and_last_will_fires_on_sigkill(mosquitto, subscribe, tmp_path):
    watcher = subscribe(mosquitto, [TOPICS.status], client_id="watcher")
    child = PublisherProcess(mosquitto, tmp_path / "state")
    assert child.ask("wait-connected") == "connected"
    assert watcher.wait_for(lambda s: [m.json()["state"] for m in s.on(TOPICS.status)] == ["online"], 5)
    online = watcher.on(TOPICS.status)[0].json()
    validator("status").validate(online)
    assert online == {"state": "online", **INFO}
    child.sigkill()
    assert watcher.wait_for(lambda s: len(s.on(TOPICS.status)) == 2, 10)
    assert watcher.on(TOPICS.status)[1].json() == {"state": "offline"}
    late = subscribe(mosquitto, [TOPICS.status], client_id="late-joiner")
    assert late.wait_for(lambda s: len(s.on(TOPICS.status)) == 1, 5)
    retained = late.on(TOPICS.status)[0]
    assert retained.retain and retained.json() == {"state": "offline"}
    # a clean close publishes offline itself (the broker sends no will then)
    pub = make_publisher(mosquitto, tmp_path / "state").start()
    assert pub.wait_connected(10)
    assert watcher.wait_for(lambda s: s.on(TOPICS.status)[-1].json()["state"] == "online", 5)
    pub.close(5)
    assert watcher.wait_for(lambda s: s.on(TOPICS.status)[-1].json() == {"state": "offline"}, 5)


def test_full_outbox_evicts_oldest_and_counts_during_outage(mosquitto, subscribe, tmp_path):
    sub = subscribe(mosquitto, [TOPICS.transcript])
    pub = make_publisher(mosquitto, tmp_path / "state", outbox_max=5).start()
    assert pub.wait_connected(10)
    mosquitto.stop()
    for i in range(8):
        pub.publish(sample_draft(i))
    assert pub.stats()["depth"] == 5 and pub.stats()["evicted"] == 3
    mosquitto.start()
    assert wait_seqs(sub, 5) == [4, 5, 6, 7, 8]  # the newest five; the gap in seq shows the loss
    assert pub.flush(10)
    stats = pub.stats()
    stats.pop("connect_failure")  # whether a reconnect attempt met the stopped broker is timing
    assert stats == {
        "depth": 0, "evicted": 3, "rejected": 0, "connected": True, "memory": 0, "dropped": 0,
        "storage_failing": False, "sender_restarts": 0,
    }
    pub.close(5)


def test_tls_with_password_from_credentials_dir(mosquitto_tls, subscribe, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "mqtt-password").write_text(TEST_PASSWORD + "\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))  # as systemd's LoadCredential= does
    sub = subscribe(mosquitto_tls, [TOPICS.transcript])
    pub = make_publisher(mosquitto_tls, tmp_path / "state", password_file="mqtt-password").start()
    assert pub.wait_connected(10)
    for i in range(3):
        pub.publish(sample_draft(i))
    assert wait_seqs(sub, 3) == [1, 2, 3]
    pub.close(5)
    assert TEST_PASSWORD not in caplog.text


def test_wrong_password_is_a_clear_config_error(mosquitto_tls, tmp_path, caplog):
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password\n")
    pub = make_publisher(mosquitto_tls, tmp_path / "state", password_file=str(wrong)).start()
    with pytest.raises(ConfigError) as err:
        pub.wait_connected(10)
    text = str(err.value)
    assert "mqtt.username/mqtt.password_file" in text and "Not authorized" in text
    assert "not-the-password" not in text and "not-the-password" not in caplog.text
    assert err.value.exit_code == 78
    pub.close(1)


def test_missing_or_incomplete_credentials_are_named(mosquitto_tls, tmp_path):
    with pytest.raises(MissingInputError, match="mqtt.password_file"):
        make_publisher(mosquitto_tls, tmp_path / "a", password_file=str(tmp_path / "absent"))
    with pytest.raises(MissingInputError, match="mqtt.tls.ca"):
        make_publisher(mosquitto_tls, tmp_path / "b", tls__ca=str(tmp_path / "absent.crt"))
    with pytest.raises(ConfigError, match="mqtt.username"):
        make_publisher(mosquitto_tls, tmp_path / "c", username=None)
    empty = tmp_path / "empty-password"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="mqtt.password_file: .* is empty"):
        make_publisher(mosquitto_tls, tmp_path / "d", password_file=str(empty))
    with pytest.raises(ConfigError, match="mqtt.host"):
        make_publisher(mosquitto_tls, tmp_path / "e", host=None)


def test_discovery_hermes_metrics_and_errors(mosquitto, subscribe, tmp_path):
    sub = subscribe(mosquitto, [f"edgeasr/{DEVICE}/#", "homeassistant/#", "hermes/#"])
    pub = make_publisher(
        mosquitto,
        tmp_path / "state",
        homeassistant__discovery=True,
        hermes__enabled=True,
        hermes__site_id="kitchen",
        metrics_interval_s=0.3,
    ).start()
    # the daemon builds its pipeline after the publisher and then hands over its metrics
    pub.metrics = lambda: {"latency_ms": {"p50": 420.0, "p95": 870.0}, "rtf": 0.12, "queue_depth": 0}
    assert pub.wait_connected(10)
    pub.publish(sample_draft(0))
    pub.publish_error("encoder timeout", context="hailo")
    discovery_topic = msgs.ha_discovery_topic("homeassistant", DEVICE)
    expected = (discovery_topic, msgs.HERMES_TEXT_CAPTURED_TOPIC, TOPICS.metrics, TOPICS.error)
    assert sub.wait_for(lambda s: all(s.on(t) for t in expected), 10)
    validator("haSensorConfig").validate(sub.on(discovery_topic)[0].json())
    hermes = sub.on(msgs.HERMES_TEXT_CAPTURED_TOPIC)[0].json()
    validator("hermesTextCaptured").validate(hermes)
    assert hermes["siteId"] == "kitchen" and hermes["text"] == "utterance 0"
    metrics = sub.on(TOPICS.metrics)[-1].json()
    validator("metrics").validate(metrics)
    assert metrics["rtf"] == 0.12 and metrics["outbox"]["connected"] is True
    error = sub.on(TOPICS.error)[0].json()
    validator("error").validate(error)
    assert error["error"] == "encoder timeout" and error["context"] == "hailo"
    pub.close(5)
    late = subscribe(mosquitto, ["homeassistant/#"], client_id="ha")
    assert late.wait_for(lambda s: bool(s.on(discovery_topic)), 5)
    assert late.on(discovery_topic)[0].retain
