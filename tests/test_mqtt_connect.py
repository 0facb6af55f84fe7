"""Why the broker cannot be reached: each real failure is logged once, with its reason,
and a repeat of the same failure logs nothing new.  Plus the password file's mode."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.broker import Broker, _make_cert
from helpers.mqtt import TOPICS, make_publisher, sample_draft, wait_seqs
from helpers.ports import HOST, free_port
from helpers.waiting import wait_until

from edgeasr.errors import ConfigError
from edgeasr.output.mqtt import MqttPublisher

pytestmark = pytest.mark.broker

PAHO_LOG = "edgeasr.output.paho_client.paho"


def cannot_connect(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "edgeasr.output.mqtt" and "cannot connect" in r.getMessage()]


def attempts(caplog) -> int:
    """Connection attempts paho has finished, from its own debug lines: each failed TCP/TLS
    connect logs "Connection failed, retrying"; an attempt that got as far as sending
    CONNECT (refused by CONNACK, or closed by paho's keepalive timer) has ended once the
    next CONNECT is sent."""
    paho = [r.getMessage() for r in caplog.records if r.name == PAHO_LOG]
    failed = sum("Connection failed, retrying" in text for text in paho)
    connects = sum(text.startswith("paho: Sending CONNECT") for text in paho)
    return failed + max(0, connects - 1)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel's backlog) and never answers."""
    with socket.socket() as listener:
        listener.bind((HOST, 0))
        listener.listen(16)
        yield listener.getsockname()[1]


def failing_publisher(kind: str, request, tmp_path: Path) -> tuple[MqttPublisher, list[str]]:
    """A publisher set up to fail in the way `kind` names, and what its log line must say."""
    state = tmp_path / "state"
    if kind == "tls-verification":
        broker: Broker = request.getfixturevalue("mosquitto_tls")
        other_ca, other_key = tmp_path / "other-ca.crt", tmp_path / "other-ca.key"
        _make_cert(other_ca, other_key)
        pub = make_publisher(broker, state, tls__ca=str(other_ca))
        return pub, ["TLS verification failed", f"mqtt.tls.ca={other_ca}", "self-signed certificate"]
    if kind == "refused":
        port = free_port()
        pub = make_publisher(request.getfixturevalue("mosquitto"), state, port=port)
        return pub, ["connection refused", f"{HOST}:{port}"]
    if kind == "not-authorised":
        wrong = tmp_path / "wrong-password"
        wrong.write_text("not-the-password\n")
        wrong.chmod(0o600)
        pub = make_publisher(request.getfixturevalue("mosquitto_tls"), state, password_file=str(wrong))
        return pub, ["not authorised", "refused user edgeasr", "Not authorized", "MQTT reason code 135"]
    if kind == "dns":
        pub = make_publisher(request.getfixturevalue("mosquitto"), state, host="nonexistent.invalid")
        return pub, ["DNS lookup of 'nonexistent.invalid' failed"]
    if kind == "timeout-connack":
        port = request.getfixturevalue("silent_port")
        pub = make_publisher(request.getfixturevalue("mosquitto"), state, port=port, keepalive_s=1)
        return pub, ["timeout", "no CONNACK within mqtt.keepalive_s=1 s"]
    if kind == "timeout-tls":
        broker = request.getfixturevalue("mosquitto_tls")
        port = request.getfixturevalue("silent_port")
        pub = make_publisher(broker, state, host=HOST, port=port)
        return pub, ["timeout", f"no answer from {HOST}:{port} within 5 s (TCP/TLS connect)"]
    if kind == "plain-to-tls-port":
        broker = request.getfixturevalue("mosquitto_tls")
        pub = make_publisher(broker, state, tls__ca=None, tls__enabled=False, username=None, password_file=None)
        return pub, ["closed the connection before CONNACK", "a TLS port?"]
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    ["tls-verification", "refused", "not-authorised", "dns", "timeout-connack", "timeout-tls", "plain-to-tls-port"],
)
def test_each_connection_failure_is_logged_once_with_its_reason(kind, request, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=PAHO_LOG)
    pub, expected = failing_publisher(kind, request, tmp_path)
    pub.start()
    try:
        # the first failure, then the same again
        wait_until(lambda: attempts(caplog) >= 2, 30, lambda: caplog.text)
        lines = cannot_connect(caplog)
        assert len(lines) == 1, [r.getMessage() for r in lines]
        text = lines[0].getMessage()
        for part in expected:
            assert part in text, text
        expected_level = logging.ERROR if kind == "not-authorised" else logging.WARNING
        assert lines[0].levelno == expected_level
        assert "retrying every" in text
        health = pub.health()
        assert not health.connected and health.connect_failure and health.connect_failure in text
        assert health.connect_failure in health.summary()
        print(text)  # the report quotes these
    finally:
        pub.close(1)
    assert "not-the-password" not in caplog.text


def test_a_new_reason_is_logged_and_a_connect_resets(mosquitto, subscribe, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=PAHO_LOG)
    sub = subscribe(mosquitto, [TOPICS.transcript])
    pub = make_publisher(mosquitto, tmp_path / "state").start()
    assert pub.wait_connected(10)
    mosquitto.stop()
    wait_until(lambda: len(cannot_connect(caplog)) == 1, 10)
    before = attempts(caplog)
    pub.publish(sample_draft(0))
    wait_until(lambda: attempts(caplog) >= before + 2, 10)
    assert len(cannot_connect(caplog)) == 1  # refused, refused, refused: one line
    with socket.socket() as silent:  # same port, now a listener that never answers
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the broker's closed sockets linger
        silent.bind((HOST, mosquitto.port))
        silent.listen(16)
        wait_until(lambda: len(cannot_connect(caplog)) == 2, 30)
    texts = [r.getMessage() for r in cannot_connect(caplog)]
    assert "connection refused" in texts[0] and "timeout" in texts[1]
    mosquitto.start()
    assert pub.wait_connected(10)
    assert wait_seqs(sub, 1) == [1]
    assert pub.health().connect_failure is not None  # the last one is kept for health()
    mosquitto.stop()  # a new outage: its reason is logged again, even if it is the first one's
    wait_until(lambda: len(cannot_connect(caplog)) == 3, 10)
    assert "connection refused" in cannot_connect(caplog)[2].getMessage()
    pub.close(1)


def test_wrong_password_still_raises_config_error(mosquitto_tls, tmp_path):
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password\n")
    pub = make_publisher(mosquitto_tls, tmp_path / "state", password_file=str(wrong)).start()
    with pytest.raises(ConfigError, match="MQTT reason code 135"):
        pub.wait_connected(10)
    pub.close(1)


def password_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "mqtt.password_file" in r.getMessage()]


def test_world_readable_password_file_is_warned_about_once_and_used(mosquitto_tls, subscribe, tmp_path, caplog):
    from helpers.broker import TEST_PASSWORD

    secret = tmp_path / "mqtt-password"
    secret.write_text(TEST_PASSWORD + "\n")
    secret.chmod(0o644)
    sub = subscribe(mosquitto_tls, [TOPICS.transcript])
    pub = make_publisher(mosquitto_tls, tmp_path / "state", password_file=str(secret)).start()
    assert pub.wait_connected(10)  # still used
    pub.publish(sample_draft(0))
    assert wait_seqs(sub, 1) == [1]
    pub.close(5)
    warnings = password_warnings(caplog)
    assert len(warnings) == 1
    assert str(secret) in warnings[0] and f"chmod 600 {secret}" in warnings[0]
    assert TEST_PASSWORD not in caplog.text
    caplog.clear()
    secret.chmod(0o600)
    quiet = make_publisher(mosquitto_tls, tmp_path / "state2", password_file=str(secret))
    assert password_warnings(caplog) == []
    quiet.close(0)
