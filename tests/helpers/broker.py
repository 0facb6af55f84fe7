"""Real Mosquitto brokers for tests, started as child processes on loopback.

Fixtures: `mosquitto` (anonymous) and `mosquitto_tls` (TLS + password), each with its
config, persistence (autosave_interval 1, so even a SIGKILLed broker keeps sessions
saved a second earlier) and log in tmp_path; `subscribe`. `Broker.stop/kill/start/restart`
keep the port (helpers.ports.free_port: below the ephemeral range, so nothing takes it while
the broker is down).  `Subscriber` collects messages through a persistent MQTT v5 session.

Run as root, mosquitto drops to the `mosquitto` user by itself: its data dir, key and
password file are chowned to it and tmp_path's parents get the search (x) bit.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from helpers.ports import HOST, free_port

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MOSQUITTO_USER = "mosquitto"
TEST_USER, TEST_PASSWORD = "edgeasr", "s3cret-Pa55"


def _broker_uid_gid() -> tuple[int, int] | None:
    """Who mosquitto will run as when we are root (None when not root)."""
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam(MOSQUITTO_USER)
    return entry.pw_uid, entry.pw_gid


def _give_to_broker(*paths: Path) -> None:
    ids = _broker_uid_gid()
    if ids is None:
        return
    for path in paths:
        os.chown(path, *ids)
    # the broker user must be able to reach these paths through pytest's 0700 dirs
    top = Path(tempfile.gettempdir()).resolve()
    for parent in paths[0].resolve().parents:
        if parent == top or top not in parent.parents:
            break
        parent.chmod(parent.stat().st_mode | 0o001)


@dataclass
class Broker:
    root: Path
    tls: bool = False
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.data = self.root / "data"
        self.data.mkdir(exist_ok=True)
        self.log_path = self.root / "mosquitto.log"
        self.conf = self.root / "mosquitto.conf"
        lines = [
            "per_listener_settings false",
            f"listener {self.port} {HOST}",
            "persistence true",
            f"persistence_location {self.data}/",
            "autosave_interval 1",
            "max_queued_messages 10000",
            "log_dest stderr",  # unbuffered: start() watches it
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
        ]
        owned = [self.data]
        if self.tls:
            self.ca, self.key = self.root / "server.crt", self.root / "server.key"
            self.passwd = self.root / "passwd"
            _make_cert(self.ca, self.key)
            subprocess.run(
                ["mosquitto_passwd", "-c", "-b", str(self.passwd), TEST_USER, TEST_PASSWORD],
                check=True,
                capture_output=True,
            )
            self.key.chmod(0o600)
            self.passwd.chmod(0o600)
            owned += [self.key, self.passwd]
            lines += [
                "allow_anonymous false",
                f"password_file {self.passwd}",
                f"cafile {self.ca}",
                f"certfile {self.ca}",
                f"keyfile {self.key}",
            ]
        else:
            lines.append("allow_anonymous true")
        self.conf.write_text("\n".join(lines) + "\n")
        _give_to_broker(*owned)

    # -- process control ---------------------------------------------------------------

    def start(self, timeout_s: float = 10.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [MOSQUITTO, "-c", str(self.conf)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited {self.proc.returncode}:\n{self.log_text()}")
            # "running" is logged once the listener is bound: then the port is surely ours
            if " running" in self.log_text()[offset:]:
                with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), 0.2):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.port}:\n{self.log_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        self.proc.wait(timeout_s)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # -- what clients need -----------------------------------------------------------------

    def overrides(self, **extra: Any) -> dict[str, Any]:
        """Dotted `mqtt.*` config keys (as for edgeasr.config.load_config) for this broker;
        `extra` adds more, with "__" for "." (outbox_max=5, tls__ca=...)."""
        keys: dict[str, Any] = {
            "mqtt.host": HOST if not self.tls else "localhost",
            "mqtt.port": self.port,
            "mqtt.reconnect_min_s": 0.2,
            "mqtt.reconnect_max_s": 1.0,
            "mqtt.keepalive_s": 5,
        }
        if self.tls:
            pw_file = self.root / "client-password"
            pw_file.write_text(TEST_PASSWORD + "\n")
            keys["mqtt.username"], keys["mqtt.password_file"] = TEST_USER, str(pw_file)
            keys["mqtt.tls.ca"] = str(self.ca)
        keys.update({"mqtt." + k.replace("__", "."): v for k, v in extra.items()})
        return keys

    def configure_client(self, client: mqtt.Client) -> None:
        if self.tls:
            client.tls_set(ca_certs=str(self.ca))
            client.username_pw_set(TEST_USER, TEST_PASSWORD)


def _make_cert(cert: Path, key: Path) -> None:
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    retain: bool

    def json(self) -> Any:
        return json.loads(self.payload)


class Subscriber:
    """A paho client with a persistent session (QoS 1) that records every message."""

    def __init__(self, broker: Broker, topics: list[str], client_id: str) -> None:
        self.broker, self.topics = broker, topics
        self.messages: list[Received] = []
        self._cond = threading.Condition()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        broker.configure_client(self.client)
        self.client.reconnect_delay_set(0.2, 1)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self._subscribed = threading.Event()

    def start(self, timeout_s: float = 10.0) -> Subscriber:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        host = "localhost" if self.broker.tls else HOST
        self.client.connect_async(host, self.broker.port, keepalive=5, clean_start=False, properties=props)
        self.client.loop_start()
        if not self._subscribed.wait(timeout_s):
            raise TimeoutError("subscriber did not connect and subscribe")
        return self

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if not reason.is_failure:
            client.subscribe([(t, 1) for t in self.topics])

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, reasons: list, props: Any) -> None:
        if not any(r.is_failure for r in reasons):
            self._subscribed.set()  # the broker has the subscription (SUBACK)

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        with self._cond:
            self.messages.append(Received(msg.topic, bytes(msg.payload), bool(msg.retain)))
            self._cond.notify_all()

    def on(self, topic: str) -> list[Received]:
        with self._cond:
            return [m for m in self.messages if m.topic == topic]

    def wait_for(self, predicate: Callable[[Subscriber], bool], timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate(self):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def wait_count(self, topic: str, n: int, timeout_s: float = 10.0) -> list[Received]:
        self.wait_for(lambda s: len([m for m in s.messages if m.topic == topic]) >= n, timeout_s)
        return self.on(topic)


def _broker_fixture(tmp_path: Path, tls: bool) -> Iterator[Broker]:
    broker = Broker(tmp_path / ("mosquitto-tls" if tls else "mosquitto"), tls=tls)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Broker]:
    yield from _broker_fixture(tmp_path, tls=False)


@pytest.fixture
def mosquitto_tls(tmp_path: Path) -> Iterator[Broker]:
    yield from _broker_fixture(tmp_path, tls=True)


@pytest.fixture
def subscribe() -> Iterator[Callable[..., Subscriber]]:
    """subscribe(broker, topics, client_id=...) -> a started Subscriber, closed at teardown."""
    made: list[Subscriber] = []

    def make(broker: Broker, topics: list[str], client_id: str = "test-subscriber") -> Subscriber:
        sub = Subscriber(broker, topics, client_id).start()
        made.append(sub)
        return sub

    yield make
    for sub in made:
        sub.close()
