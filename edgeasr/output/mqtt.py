"""Transcripts over MQTT (paho-mqtt 2.2+, MQTT v5), through the durable outbox.

The only module that imports paho.  Delivery is at least once and in `seq` order:

* `publish()` commits the transcript to the outbox (edgeasr.output.outbox) and returns; a
  background thread hands waiting rows to paho, at most `WINDOW` unacknowledged at a time.
* A PUBACK (paho's on_publish, matched by mid) deletes the row.
* On every connect, paho's own in-memory queue is dropped and everything still in the
  outbox is published again, oldest first: the outbox is the truth (paho's queue dies
  with the process; replaying it next to the outbox would duplicate and reorder).
  A transcript whose PUBACK was lost can therefore arrive twice: consumers drop repeats
  by `id` (or `seq`).

Topics: {prefix}/{device_id}/transcript (QoS 1), /status (retained: online on connect,
offline as last will and on clean close), /error (QoS 1), /metrics (periodic), plus
optional Home Assistant discovery and Hermes hermes/asr/textCaptured.
"""

from __future__ import annotations

import collections
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeasr.errors import ConfigError, MissingInputError, ToolMissingError
from edgeasr.output import payload as msgs
from edgeasr.output.outbox import Outbox
from edgeasr.stages import Transcript

if TYPE_CHECKING:
    from edgeasr.config import MqttConfig

log = logging.getLogger(__name__)

WINDOW = 64  # transcripts handed to paho and not yet acknowledged
_HEADROOM = 32  # room in paho's queue for status, error, metrics, discovery, Hermes
_AUTH_REFUSALS = {134, 135, 140}  # bad user name or password, not authorized, bad auth method
_PUMP_IDLE_S = 0.5  # the pump's longest sleep: retries after a full paho queue
_CLOSE_ACK_S = 2.0  # longest wait for the broker to acknowledge the offline status


@dataclass(frozen=True)
class Topics:
    transcript: str
    status: str
    error: str
    metrics: str
    partial: str

    @classmethod
    def for_device(cls, prefix: str, device_id: str) -> Topics:
        base = f"{prefix}/{device_id}"
        return cls(f"{base}/transcript", f"{base}/status", f"{base}/error", f"{base}/metrics",
                   f"{base}/partial")


def use_tls(options: MqttConfig) -> bool:
    """mqtt.tls.enabled, where null means "when mqtt.tls.ca is set"."""
    tls = options.tls
    return tls.enabled if tls.enabled is not None else tls.ca is not None


def read_password(path: Path) -> str:
    """mqtt.password_file's content without its final newline (config.py has already
    looked a relative name up in $CREDENTIALS_DIRECTORY).  Never logged."""
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise MissingInputError(f"mqtt.password_file: cannot read {path}: {exc.strerror or exc}") from exc
    password = text.rstrip("\r\n")
    if not password:
        raise ConfigError(f"mqtt.password_file: {path} is empty")
    return password


def _import_paho() -> Any:
    try:
        import paho.mqtt.client as mqtt_client
    except ImportError as exc:
        raise ToolMissingError("paho-mqtt is not installed (pip install 'paho-mqtt>=2.2')") from exc
    if not hasattr(mqtt_client.Client, "drop_out_messages"):
        raise ToolMissingError("paho-mqtt 2.2 or newer is needed (pip install -U 'paho-mqtt>=2.2')")
    return mqtt_client


class MqttPublisher:
    """stages.Publisher for MQTT.  `start()` connects in the background; `close()` ends."""

    def __init__(
        self,
        options: MqttConfig,
        *,
        device_id: str,
        outbox: Outbox,
        version: str,
        model: str,
        backend: str,
        metrics: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        if not options.host:
            raise ConfigError("mqtt.host: needed for MQTT output (null means stdout only)")
        self.options, self.device_id, self._outbox = options, device_id, outbox
        self.topics = Topics.for_device(options.topic_prefix, device_id)
        self._info = {"version": version, "model": model, "backend": backend}
        self._metrics = metrics
        self.client_id = options.client_id or f"edgeasr-{device_id}"
        self._paho = _import_paho()
        self._client = self._make_client()
        self._lock = threading.Lock()  # guards _inflight/_handed and the order of hand-overs
        self._inflight: dict[int, int] = {}  # paho mid -> outbox seq
        self._handed = 0  # highest seq handed to paho on this connection
        # (mid, reason) from on_publish; bounded: a lost ack only means a repeat on the next connect
        self._acks: collections.deque = collections.deque(maxlen=4 * (WINDOW + _HEADROOM))
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._refusal: str | None = None
        self._down_logged = False
        self.rejected = 0  # transcripts the broker refused (PUBACK failure)
        self._pump = threading.Thread(target=self._run_pump, name="edgeasr-mqtt-outbox", daemon=True)

    # -- setup -----------------------------------------------------------------------

    def _make_client(self) -> Any:
        o, mqtt = self.options, self._paho
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5)
        client.reconnect_delay_set(o.reconnect_min_s, o.reconnect_max_s)
        client.max_queued_messages_set(WINDOW + _HEADROOM)
        offline = msgs.dumps(msgs.status_message("offline"))
        client.will_set(self.topics.status, offline, qos=1, retain=True)
        if o.password_file is not None and not o.username:
            raise ConfigError("mqtt.password_file: set, but mqtt.username is not")
        if o.username:
            client.username_pw_set(o.username, read_password(o.password_file) if o.password_file else None)
        if use_tls(o):
            tls = o.tls
            for key, path in (("ca", tls.ca), ("cert", tls.cert), ("key", tls.key)):
                if path is not None and not path.is_file():
                    raise MissingInputError(f"mqtt.tls.{key}: {path} does not exist")
            if (tls.cert is None) != (tls.key is None):
                raise ConfigError("mqtt.tls.cert: mqtt.tls.cert and mqtt.tls.key go together")
            client.tls_set(
                ca_certs=_opt_str(tls.ca),
                certfile=_opt_str(tls.cert),
                keyfile=_opt_str(tls.key),
                tls_version=ssl.PROTOCOL_TLS_CLIENT,
            )
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        return client

    def start(self) -> MqttPublisher:
        """Connect in the background (retrying with exponential backoff) and return."""
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = self.options.session_expiry_s
        log.info(
            "MQTT: connecting to %s:%d as %s%s",
            self.options.host,
            self.options.port,
            self.client_id,
            " over TLS" if use_tls(self.options) else "",
        )
        # clean_start=False: paho's default cleans the first session of every process.
        self._client.connect_async(
            self.options.host,
            self.options.port,
            keepalive=self.options.keepalive_s,
            clean_start=False,
            properties=props,
        )
        self._client.loop_start()
        self._pump.start()
        return self

    # -- the Publisher protocol --------------------------------------------------------

    def publish(self, transcript: Transcript) -> None:
        """Commit the transcript to the outbox; it is sent as soon as the broker allows. A
        partial result is only sent while connected (QoS 0): a late one is worthless."""
        if transcript.partial:
            self._publish_live(self.topics.partial, msgs.partial_message(transcript, device_id=self.device_id))
            return
        draft = msgs.build_transcript(transcript, device_id=self.device_id, model=self._info["model"],
                                      backend=self._info["backend"])
        message = msgs.finish(draft, now_mono=time.monotonic())
        entry = self._outbox.append(message)
        self._wake.set()
        log.debug("transcript seq=%d stored", entry.seq)
        if self.options.hermes.enabled:
            self._publish_hermes(message)

    def close(self, timeout_s: float) -> None:
        """Deliver what the outbox holds while connected (up to timeout_s), publish the
        offline status, disconnect.  Undelivered transcripts stay for the next start."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while self.connected and len(self._outbox) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.connected:
            offline = msgs.dumps(msgs.status_message("offline"))
            info = self._client.publish(self.topics.status, offline, qos=1, retain=True)
            _wait_published(info, min(_CLOSE_ACK_S, max(0.1, deadline - time.monotonic())))
        self._stop.set()
        self._wake.set()
        self._client.disconnect()
        self._client.loop_stop()
        if self._pump.is_alive():
            self._pump.join()
        left = len(self._outbox)
        log.info("MQTT: closed; %d transcript(s) left in the outbox for the next start", left)

    # -- for the daemon and tests ---------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def metrics(self) -> Callable[[], Mapping[str, Any]] | None:
        """The source of the periodic /metrics message; may be set after start()."""
        return self._metrics

    @metrics.setter
    def metrics(self, source: Callable[[], Mapping[str, Any]] | None) -> None:
        self._metrics = source

    def wait_connected(self, timeout_s: float) -> bool:
        """True once connected; False on timeout; ConfigError if the broker refused the credentials."""
        deadline = time.monotonic() + timeout_s
        while not self._connected.wait(0.05):
            if self._refusal is not None:
                raise ConfigError(self._refusal)
            if time.monotonic() >= deadline:
                return False
        return True

    def flush(self, timeout_s: float) -> bool:
        """Wait until every stored transcript is acknowledged; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while len(self._outbox):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def stats(self) -> dict[str, Any]:
        return {**self._outbox.stats(), "rejected": self.rejected, "connected": self.connected}

    def publish_error(self, error: str, context: str | None = None) -> None:
        """Report a problem on the /error topic (skipped while disconnected: it is logged anyway)."""
        message = msgs.error_message(error, device_id=self.device_id, context=context)
        self._publish_live(self.topics.error, message, qos=1)

    # -- paho callbacks (paho's network thread) -------------------------------------------

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self._refused(reason)
            return
        self._refusal, self._down_logged = None, False
        with self._lock:
            self._drain_acks()  # acks of the last connection, before their mids are forgotten
            client.drop_out_messages()  # replaced by the outbox replay below
            self._inflight.clear()
            self._handed = 0
            self._connected.set()
            online = msgs.status_message("online", **self._info)
            client.publish(self.topics.status, msgs.dumps(online), qos=1, retain=True)
            if self.options.homeassistant.discovery:
                self._publish_discovery(client)
            replayed = self._feed()
        log.info(
            "MQTT: connected to %s:%d (session present: %s); %d stored transcript(s) sent",
            self.options.host,
            self.options.port,
            "yes" if flags.session_present else "no",
            replayed,
        )

    def _refused(self, reason: Any) -> None:
        where = f"{self.options.host}:{self.options.port}"
        if reason.value in _AUTH_REFUSALS:
            user = self.options.username or "(none)"
            text = (
                f"mqtt.username/mqtt.password_file: broker {where} refused user {user}: {reason}"
            )
        else:
            text = f"mqtt.host: broker {where} refused the connection: {reason}"
        if text != self._refusal:
            log.error("MQTT: %s (retrying with backoff)", text)
        self._refusal = text

    def _on_connect_fail(self, client: Any, userdata: Any) -> None:
        if not self._down_logged:
            self._down_logged = True
            log.warning(
                "MQTT: cannot connect to %s:%d; retrying every %g..%g s, transcripts are kept in the outbox",
                self.options.host,
                self.options.port,
                self.options.reconnect_min_s,
                self.options.reconnect_max_s,
            )

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        was_connected = self.connected
        self._connected.clear()
        if was_connected and not self._stop.is_set():
            from_broker = flags.is_disconnect_packet_from_server
            cause = f"broker said: {reason}" if from_broker else "network connection closed"
            log.info("MQTT: connection lost (%s); reconnecting, transcripts are kept in the outbox", cause)
            self._down_logged = True

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason: Any, properties: Any) -> None:
        # Runs under paho's message lock: never take self._lock here (the pump holds it
        # while calling client.publish, which needs paho's lock).
        self._acks.append((mid, reason))
        self._wake.set()

    # -- the pump (its own thread; also called from _on_connect) ---------------------------

    def _run_pump(self) -> None:
        interval = self.options.metrics_interval_s
        next_metrics = time.monotonic() + interval if interval > 0 else None
        while not self._stop.is_set():
            self._wake.wait(_PUMP_IDLE_S)
            self._wake.clear()
            with self._lock:
                self._drain_acks()
                if self.connected:
                    self._feed()
            if next_metrics is not None and time.monotonic() >= next_metrics:
                next_metrics = time.monotonic() + interval
                self._publish_metrics()

    def _drain_acks(self) -> None:
        """Delete acknowledged transcripts (caller holds self._lock)."""
        while self._acks:
            mid, reason = self._acks.popleft()
            seq = self._inflight.pop(mid, None)
            if seq is None:
                continue  # status, error, metrics, discovery: nothing stored
            if reason.is_failure:
                self.rejected += 1
                topic = self.topics.transcript
                log.error("MQTT: broker rejected transcript seq=%d on %s: %s", seq, topic, reason)
            self._outbox.remove(seq)

    def _feed(self) -> int:
        """Hand waiting transcripts to paho, oldest first (caller holds self._lock)."""
        room = WINDOW - len(self._inflight)
        if room <= 0:
            return 0
        sent = 0
        for entry in self._outbox.pending(after_seq=self._handed, limit=room):
            info = self._client.publish(self.topics.transcript, entry.text, qos=1)
            if info.rc == self._paho.MQTT_ERR_QUEUE_SIZE:
                break  # paho's queue is full of other messages; retried on the next wake
            self._inflight[info.mid] = entry.seq
            self._handed = entry.seq
            sent += 1
        return sent

    # -- other messages ---------------------------------------------------------------------

    def _publish_live(self, topic: str, message: Mapping[str, Any], qos: int = 0) -> None:
        if not self.connected:
            log.debug("MQTT: not connected, %s not published", topic)
            return
        info = self._client.publish(topic, msgs.dumps(message), qos=qos)
        if info.rc == self._paho.MQTT_ERR_QUEUE_SIZE:
            log.warning("MQTT: paho's queue is full, %s not published", topic)

    def _publish_hermes(self, transcript: Mapping[str, Any]) -> None:
        # Live only: a voice command replayed after an outage must not fire late.
        site = self.options.hermes.site_id or self.device_id
        message = msgs.hermes_text_captured(transcript, site_id=site)
        self._publish_live(msgs.HERMES_TEXT_CAPTURED_TOPIC, message, qos=1)

    def _publish_discovery(self, client: Any) -> None:
        config = msgs.ha_discovery_config(
            device_id=self.device_id,
            transcript_topic=self.topics.transcript,
            status_topic=self.topics.status,
            **self._info,
        )
        topic = msgs.ha_discovery_topic(self.options.homeassistant.prefix, self.device_id)
        client.publish(topic, msgs.dumps(config), qos=1, retain=True)

    def _publish_metrics(self) -> None:
        try:
            values = dict(self._metrics()) if self._metrics else {}
        except Exception:  # a broken metrics source must not stop delivery
            log.exception("MQTT: the metrics callable failed; metrics skipped")
            return
        values["outbox"] = self.stats()
        self._publish_live(self.topics.metrics, msgs.metrics_message(self.device_id, values))


def _opt_str(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _wait_published(info: Any, timeout_s: float) -> bool:
    """Wait for a QoS 1 acknowledgement; False if it did not come (or was never sent)."""
    try:
        info.wait_for_publish(timeout_s)
        return info.is_published()
    except (RuntimeError, ValueError) as exc:  # paho raises when the message was not queued
        log.debug("MQTT: offline status not acknowledged: %s", exc)
        return False
