"""Rows for `mqtt`: the publisher the daemon builds (daemon.build_outputs) against real Mosquitto
brokers (tests/helpers/broker.py): one plain, one with TLS, a password and client certificates.
What the broker receives, and what it logs of each client (its id, keepalive, user name)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from helpers.broker import Broker

from config_rows.lab import Lab, Rows, transcript
from edgeasr.daemon import Outputs, build_outputs
from edgeasr.errors import ConfigError
from edgeasr.output.mqtt import MqttPublisher
from edgeasr.output.payload import ha_discovery_topic

rows = Rows()
BROKER = ("broker",)
CONNECT_S = 10.0  # a guard against a hang, not a measurement


def tls_keys(lab: Lab) -> dict[str, Any]:
    """What a client of the TLS broker needs: its CA, a client certificate, a user and password."""
    broker, cert, key = lab.fixture("tls_broker")
    return {**broker.overrides(), "mqtt.tls.cert": str(cert), "mqtt.tls.key": str(key)}


@contextmanager
def publisher(lab: Lab, keys: dict[str, Any], broker: Broker | None = None, connect: bool = True
              ) -> Iterator[MqttPublisher]:
    """The daemon's MQTT publisher for these keys (on the plain broker unless they name a host
    or another broker is given), its device the test's own; connected unless `connect` is
    False; closed on leaving."""
    device = lab.request.node.callspec.id.replace(".", "-")
    where = {} if "mqtt.host" in keys else (broker or lab.fixture("broker")).overrides()
    cfg = lab.cfg({**where, "device_id": device, **keys})
    outputs: Outputs = build_outputs(cfg, "whisper-test", "onnx")
    assert outputs.mqtt is not None
    try:
        if connect:
            outputs.mqtt.start()
            assert outputs.mqtt.wait_connected(CONNECT_S)
        yield outputs.mqtt
    finally:
        outputs.close(1.0)


def received(lab: Lab, topic: str, n: int = 1) -> list[Any]:
    messages = lab.fixture("subscriber").wait_count(topic, n, CONNECT_S)
    assert len(messages) >= n, (topic, lab.fixture("subscriber").messages[-5:])
    return messages


def sent(lab: Lab, keys: dict[str, Any]) -> str:
    """Publish one transcript; its device id."""
    with publisher(lab, keys) as mqtt:
        mqtt.publish(transcript())
        assert mqtt.flush(CONNECT_S)
        return mqtt.device_id


@rows.observe("mqtt.host", *BROKER)
def _mqtt_host(lab: Lab) -> None:
    with publisher(lab, {}) as mqtt:
        (status,) = received(lab, mqtt.topics.status)
        assert status.retain and status.json()["state"] == "online"


@rows.observe("mqtt.port", *BROKER)
def _mqtt_port(lab: Lab) -> None:
    broker = lab.fixture("broker")
    assert broker.port != 1883
    device = sent(lab, {"mqtt.port": broker.port})
    assert received(lab, f"edgeasr/{device}/transcript")[0].json()["device_id"] == device


@rows.observe("mqtt.topic_prefix", *BROKER)
def _mqtt_topic_prefix(lab: Lab) -> None:
    device = sent(lab, {"mqtt.topic_prefix": "rows/home"})
    assert received(lab, f"rows/home/{device}/transcript")


def _broker_log(lab: Lab, keys: dict[str, Any]) -> str:
    broker = lab.fixture("broker")
    before = len(broker.log_text())
    with publisher(lab, keys):
        pass
    return broker.log_text()[before:]


@rows.observe("mqtt.client_id", *BROKER)
def _mqtt_client_id(lab: Lab) -> None:
    assert " as rows-client-7 (" in _broker_log(lab, {"mqtt.client_id": "rows-client-7"})


@rows.observe("mqtt.keepalive_s", *BROKER)
def _mqtt_keepalive_s(lab: Lab) -> None:
    assert ", k7" in _broker_log(lab, {"mqtt.keepalive_s": 7})


@rows.observe("mqtt.username", *BROKER)
def _mqtt_username(lab: Lab) -> None:
    assert "u'rows-user'" in _broker_log(lab, {"mqtt.username": "rows-user"})


@rows.observe("mqtt.session_expiry_s", *BROKER)
def _mqtt_session_expiry_s(lab: Lab) -> None:
    """The broker keeps the session for the next connection (default), or ends it at once (0)."""
    caplog = lab.fixture("caplog")
    caplog.set_level(logging.INFO, "edgeasr.output.mqtt")
    present = {}
    for expiry in (86400, 0):
        keys = {"mqtt.session_expiry_s": expiry, "mqtt.client_id": f"rows-expiry-{expiry}"}
        for _ in range(2):
            caplog.clear()
            with publisher(lab, keys):
                pass
        present[expiry] = [r.getMessage() for r in caplog.records if "session present" in r.getMessage()]
    assert present[86400][0].endswith("(session present: yes)") and present[0][0].endswith("(session present: no)")


rows.cannot("mqtt.reconnect_min_s", "a delay between reconnects: only a timed wait shows it (no timing assertions)")
rows.cannot("mqtt.reconnect_max_s", "a delay between reconnects: only a timed wait shows it (no timing assertions)")


@rows.observe("mqtt.password_file", *BROKER)
def _mqtt_password_file(lab: Lab) -> None:
    keys, broker = tls_keys(lab), lab.fixture("tls_broker")[0]
    with publisher(lab, keys, broker) as mqtt:
        assert mqtt.connected
    with pytest.raises(ConfigError, match="not authori[sz]ed|[Bb]ad user name or password"):  # noqa: SIM117
        with publisher(lab, {**keys, "mqtt.password_file": None}, broker):
            pass


@rows.observe("mqtt.tls.enabled", *BROKER)
def _mqtt_tls_enabled(lab: Lab) -> None:
    """A CA file and TLS off: plain MQTT, which the plain broker speaks (null would mean TLS)."""
    _, cert, _ = lab.fixture("tls_broker")
    with publisher(lab, {"mqtt.tls.ca": str(cert), "mqtt.tls.enabled": False}) as mqtt:
        assert mqtt.connected


@rows.observe("mqtt.tls.ca", *BROKER)
def _mqtt_tls_ca(lab: Lab) -> None:
    """The broker's certificate verified against this CA: TLS, and the connection is made."""
    with publisher(lab, tls_keys(lab), lab.fixture("tls_broker")[0]) as mqtt:
        assert mqtt.connected


def _client_certificate(lab: Lab) -> None:
    """The TLS broker takes only clients with a certificate it trusts."""
    keys, broker = tls_keys(lab), lab.fixture("tls_broker")[0]
    with publisher(lab, keys, broker) as mqtt:
        assert mqtt.connected
    with publisher(lab, {**keys, "mqtt.tls.cert": None, "mqtt.tls.key": None}, broker, connect=False) as mqtt:
        mqtt.start()
        assert not mqtt.wait_connected(2.0)


rows.observe("mqtt.tls.cert", *BROKER)(_client_certificate)
rows.observe("mqtt.tls.key", *BROKER)(_client_certificate)


@rows.observe("mqtt.metrics_interval_s", *BROKER)
def _mqtt_metrics_interval_s(lab: Lab) -> None:
    with publisher(lab, {"mqtt.metrics_interval_s": 0.2}) as mqtt:
        (metrics,) = received(lab, mqtt.topics.metrics)[:1]
        assert metrics.json()["device_id"] == mqtt.device_id


@rows.observe("mqtt.outbox_max")
def _mqtt_outbox_max(lab: Lab) -> None:
    """No broker reached: the outbox holds one transcript and evicts the older ones."""
    with publisher(lab, {"mqtt.outbox_max": 1, "mqtt.host": "127.0.0.1", "mqtt.port": 9}, connect=False) as mqtt:
        for _ in range(3):
            mqtt.publish(transcript())
        assert mqtt.health().evicted == 2 and mqtt.health().waiting == 1


@rows.observe("mqtt.homeassistant.discovery", *BROKER)
def _mqtt_homeassistant_discovery(lab: Lab) -> None:
    with publisher(lab, {"mqtt.homeassistant.discovery": True}) as mqtt:
        (config,) = received(lab, ha_discovery_topic("homeassistant", mqtt.device_id))
        assert config.json()["state_topic"] == mqtt.topics.transcript


@rows.observe("mqtt.homeassistant.prefix", *BROKER)
def _mqtt_homeassistant_prefix(lab: Lab) -> None:
    with publisher(lab, {"mqtt.homeassistant.discovery": True, "mqtt.homeassistant.prefix": "rows-ha"}) as mqtt:
        assert received(lab, ha_discovery_topic("rows-ha", mqtt.device_id))


def _hermes(lab: Lab, keys: dict[str, Any]) -> dict:
    subscriber = lab.fixture("subscriber")
    before = len(subscriber.on("hermes/asr/textCaptured"))
    sent(lab, {"mqtt.hermes.enabled": True, **keys})
    return received(lab, "hermes/asr/textCaptured", before + 1)[-1].json()


@rows.observe("mqtt.hermes.enabled", *BROKER)
def _mqtt_hermes_enabled(lab: Lab) -> None:
    assert _hermes(lab, {})["text"] == "Turn on the lamp."


@rows.observe("mqtt.hermes.site_id", *BROKER)
def _mqtt_hermes_site_id(lab: Lab) -> None:
    assert _hermes(lab, {"mqtt.hermes.site_id": "hall"})["siteId"] == "hall"
