"""Transcripts over MQTT (paho-mqtt 2.2+, MQTT v5), through the durable outbox.

Delivery is at least once and in `seq` order:

* `publish()` stores the transcript (edgeasr.output.spool: the SQLite outbox, or memory
  while the disk is full or failing) and returns; it never raises for the disk.  The
  sender thread hands waiting transcripts to paho, at most `WINDOW` unacknowledged.
* A PUBACK (paho's on_publish, matched by mid) removes the transcript.
* On every connect, paho's own in-memory queue is dropped and the sender replays all that
  waits, oldest first: the spool is the truth (paho's queue dies with the process;
  replaying it next to the spool would duplicate and reorder).  A transcript whose PUBACK
  was lost can therefore arrive twice: consumers drop repeats by `id` (or `seq`).

Threads: paho's network thread runs the callbacks (kept small: they never touch the disk);
the sender thread (edgeasr.output.sender, supervised: an exception is logged, counted and
the sender goes on after a short backoff) does everything else.  `health()` tells the daemon
how the output side is doing; storage failure and recovery also go to the /error topic.

Topics: {prefix}/{device_id}/transcript (QoS 1), /status (retained: online on connect,
offline as last will and on clean close), /error (QoS 1), /metrics (periodic), plus
optional Home Assistant discovery and Hermes hermes/asr/textCaptured.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeasr.errors import ConfigError
from edgeasr.output import connection_reasons as reasons
from edgeasr.output import payload as msgs
from edgeasr.output.outbox import Outbox
from edgeasr.output.paho_client import endpoint, import_paho, make_client, read_password, use_tls
from edgeasr.output.sender import WINDOW, Sender
from edgeasr.output.spool import Spool
from edgeasr.stages import Transcript

if TYPE_CHECKING:
    from edgeasr.config import MqttConfig

__all__ = ["MqttPublisher", "OutputHealth", "Topics", "read_password", "use_tls"]

log = logging.getLogger(__name__)

_HEADROOM = 32  # room in paho's queue beyond the sender's WINDOW: status, error, metrics, ...
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


@dataclass(frozen=True)
class OutputHealth:
    """The output side at a glance (MqttPublisher.health()), e.g. for systemd's STATUS."""

    connected: bool
    storage_failing: bool  # the outbox cannot be written: new transcripts wait in memory
    storage_error: str | None
    waiting: int  # transcripts not yet acknowledged (disk and memory)
    held_in_memory: int
    dropped: int  # transcripts lost: memory full while the disk failed, or in memory at close
    evicted: int  # oldest dropped from a full outbox (mqtt.outbox_max), all time
    rejected: int  # transcripts the broker refused (PUBACK failure)
    sender_restarts: int
    connect_failure: str | None  # why the last connection attempt failed (None: none failed)

    def summary(self) -> str:
        """One line for STATUS; empty when all is well."""
        parts = []
        if not self.connected:
            why = f": {self.connect_failure}" if self.connect_failure else ""
            parts.append(f"broker down{why} ({self.waiting} transcript(s) waiting)")
        if self.storage_failing:
            parts.append(f"storage failing ({self.storage_error}): {self.held_in_memory} transcript(s) in memory")
        if self.dropped:
            parts.append(f"{self.dropped} transcript(s) dropped")
        return "; ".join(parts)


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
        intent: bool = False,
    ) -> None:
        if not options.host:
            raise ConfigError("mqtt.host: needed for MQTT output (null means stdout only)")
        self.options, self.device_id = options, device_id
        self._spool = Spool(outbox)
        self.topics = Topics.for_device(options.topic_prefix, device_id)
        self._info = {"version": version, "model": model, "backend": backend}
        self._intent = intent  # output.intent
        self._metrics = metrics
        self.client_id = options.client_id or f"edgeasr-{device_id}"
        offline = msgs.dumps(msgs.status_message("offline"))
        self._client = make_client(
            options, self.client_id, will_topic=self.topics.status, will=offline, max_queued=WINDOW + _HEADROOM
        )
        self._paho = import_paho()
        self._endpoint = endpoint(options, self._client)
        self._client.on_pre_connect = self._on_pre_connect
        self._client.on_connect = self._on_connect
        self._client.on_connect_fail = self._on_connect_fail
        self._client.on_disconnect = self._on_disconnect
        self._client.on_publish = self._on_publish
        self._stop, self._connected = threading.Event(), threading.Event()
        self._sender = Sender(
            self._client,
            self._spool,
            topic=self.topics.transcript,
            connected=self._connected,
            periodic=self._periodic,
            queue_full_rc=self._paho.MQTT_ERR_QUEUE_SIZE,
        )
        interval = options.metrics_interval_s
        self._next_metrics = time.monotonic() + interval if interval > 0 else None
        self._connack = False  # a CONNACK came in the current connection attempt
        self._failure: reasons.Failure | None = None  # logged once per change; None after a connect
        self._last_failure: reasons.Failure | None = None  # kept for health()
        self._refusal: str | None = None  # a refusal that retrying cannot fix (wait_connected raises)
        self._storage_reported = False  # what /error last said: storage failing

    def start(self) -> MqttPublisher:
        """Connect in the background (retrying with exponential backoff) and return."""
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = self.options.session_expiry_s
        log.info(
            "MQTT: connecting to %s as %s%s",
            self._endpoint.where,
            self.client_id,
            " over TLS" if self._endpoint.tls else "",
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
        self._sender.start()
        return self

    # -- the Publisher protocol --------------------------------------------------------

    def publish(self, transcript: Transcript) -> None:
        """Store the transcript (on disk, or in memory while the disk fails); it is sent
        as soon as the broker allows.  Never raises because of the disk. A partial result
        is only sent while connected (QoS 0, never stored): a late one is worthless."""
        if transcript.partial:
            self._publish_live(self.topics.partial, msgs.partial_message(transcript, device_id=self.device_id))
            return
        draft = msgs.build_transcript(transcript, device_id=self.device_id, model=self._info["model"],
                                      backend=self._info["backend"], intent=self._intent)
        message = msgs.finish(draft, now_mono=time.monotonic())
        entry = self._spool.add(message)
        self._sender.wake()
        log.debug("transcript seq=%d stored", entry.seq)
        if self.options.hermes.enabled:
            self._publish_hermes(message)

    def close(self, timeout_s: float) -> None:
        """Deliver what waits while connected (up to timeout_s), publish the offline
        status, disconnect.  Undelivered transcripts stay in the outbox for the next start."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while self.connected and len(self._spool) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.connected:
            offline = msgs.dumps(msgs.status_message("offline"))
            info = self._client.publish(self.topics.status, offline, qos=1, retain=True)
            _wait_published(info, min(_CLOSE_ACK_S, max(0.1, deadline - time.monotonic())))
        self._stop.set()
        self._client.disconnect()
        self._client.loop_stop()
        self._sender.stop()
        self._spool.save_memory()
        log.info("MQTT: closed; %d transcript(s) left in the outbox for the next start", len(self._spool))

    # -- for the daemon and tests ---------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def rejected(self) -> int:
        """Transcripts the broker refused (PUBACK failure)."""
        return self._sender.rejected

    @property
    def sender_restarts(self) -> int:
        return self._sender.restarts

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
        while len(self._spool):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def health(self) -> OutputHealth:
        state = self._spool.state()
        failure = self._last_failure
        return OutputHealth(
            connected=self.connected,
            storage_failing=state.failing,
            storage_error=state.error,
            waiting=state.depth + state.held_in_memory,
            held_in_memory=state.held_in_memory,
            dropped=state.dropped,
            evicted=state.evicted,
            rejected=self.rejected,
            sender_restarts=self.sender_restarts,
            connect_failure=failure.text if failure else None,
        )

    def stats(self) -> dict[str, Any]:
        """The counters of /metrics' "outbox" object."""
        h = self.health()
        return {
            "depth": h.waiting - h.held_in_memory,
            "evicted": h.evicted,
            "rejected": h.rejected,
            "connected": h.connected,
            "memory": h.held_in_memory,
            "dropped": h.dropped,
            "storage_failing": h.storage_failing,
            "sender_restarts": h.sender_restarts,
            "connect_failure": h.connect_failure,
        }

    def publish_error(self, error: str, context: str | None = None, *, resolved: bool = False) -> bool:
        """Report a problem (or its end) on the /error topic; False while disconnected
        (it is logged anyway)."""
        message = msgs.error_message(error, device_id=self.device_id, context=context, resolved=resolved)
        return self._publish_live(self.topics.error, message, qos=1)

    # -- paho callbacks (paho's network thread; no disk, no waiting) -----------------------

    def _on_pre_connect(self, client: Any, userdata: Any) -> None:
        self._connack = False

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        self._connack = True
        if reason.is_failure:
            self._connect_failed(reasons.from_connack(reason, self._endpoint))
            return
        self._failure, self._refusal = None, None
        with self._sender.lock:
            client.drop_out_messages()  # the sender replays the spool instead
            self._sender.new_connection()
            self._connected.set()
            online = msgs.status_message("online", **self._info)
            client.publish(self.topics.status, msgs.dumps(online), qos=1, retain=True)
            if self.options.homeassistant.discovery:
                self._publish_discovery(client)
        present = "yes" if flags.session_present else "no"
        log.info("MQTT: connected to %s (session present: %s)", self._endpoint.where, present)

    def _on_connect_fail(self, client: Any, userdata: Any) -> None:
        # paho calls this inside `except OSError:` around reconnect() (loop_forever): the
        # exception is still being handled, and sys.exc_info() is the only way to it
        self._connect_failed(reasons.from_exception(sys.exc_info()[1], self._endpoint))

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        was_connected = self.connected
        self._connected.clear()
        if self._stop.is_set():
            return
        if was_connected:
            from_broker = flags.is_disconnect_packet_from_server
            cause = f"broker said: {reason}" if from_broker else "network connection closed"
            log.warning("MQTT: connection to %s lost (%s); reconnecting, transcripts are kept",
                        self._endpoint.where, cause)
        elif not self._connack:  # after a refused CONNACK paho disconnects too: already told
            self._connect_failed(reasons.from_early_close(reason, self._endpoint))

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason: Any, properties: Any) -> None:
        self._sender.acked(mid, reason)

    def _connect_failed(self, failure: reasons.Failure) -> None:
        if failure.config:
            self._refusal = failure.text
        self._last_failure = failure
        if failure == self._failure:
            return  # logged already; paho keeps retrying
        self._failure = failure
        o = self.options
        log.log(failure.level, "MQTT: cannot connect to %s: %s (retrying every %g..%g s; transcripts are kept)",
                self._endpoint.where, failure.text, o.reconnect_min_s, o.reconnect_max_s)

    # -- periodic work (the sender thread, supervised there) -------------------------------

    def _periodic(self) -> None:
        self._report_storage()
        now = time.monotonic()
        if self._next_metrics is not None and now >= self._next_metrics:
            self._next_metrics = now + self.options.metrics_interval_s
            self._publish_metrics()

    def _report_storage(self) -> None:
        """Tell /error when storage starts failing and when it recovers (once connected)."""
        if self._spool.failing == self._storage_reported or not self.connected:
            return
        state = self._spool.state()
        if state.failing:
            text = f"storage failing: {state.error}; {state.held_in_memory} transcript(s) held in memory"
        else:
            text = "storage recovered: transcripts are stored on disk again"
        if self.publish_error(text, context="outbox", resolved=not state.failing):
            self._storage_reported = state.failing

    # -- other messages ---------------------------------------------------------------------

    def _publish_live(self, topic: str, message: Mapping[str, Any], qos: int = 0) -> bool:
        if not self.connected:
            log.debug("MQTT: not connected, %s not published", topic)
            return False
        info = self._client.publish(topic, msgs.dumps(message), qos=qos)
        if info.rc == self._paho.MQTT_ERR_QUEUE_SIZE:
            log.warning("MQTT: paho's queue is full, %s not published", topic)
            return False
        return True

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


def _wait_published(info: Any, timeout_s: float) -> bool:
    """Wait for a QoS 1 acknowledgement; False if it did not come (or was never sent)."""
    try:
        info.wait_for_publish(timeout_s)
        return info.is_published()
    except (RuntimeError, ValueError) as exc:  # paho raises when the message was not queued
        log.debug("MQTT: offline status not acknowledged: %s", exc)
        return False
