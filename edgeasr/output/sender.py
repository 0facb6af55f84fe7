"""The sender thread: hands the spool's transcripts to paho, in seq order, and forgets them
on PUBACK.  Its one supervision point (`_run`) keeps it alive: an unexpected exception is
logged (with its traceback when it differs from the previous one), counted in `restarts`,
and the work goes on after a short backoff, so a connected broker is never left unused.

What it shares with paho's network thread (under `lock`): the mids in flight and the
cursor.  MqttPublisher's on_connect takes the lock to drop paho's queue and call
`new_connection()`; the sender then replays the spool from the start.  on_publish only
appends to a bounded deque (`acked`): it runs under paho's message lock, which the sender
needs while it holds `lock`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from edgeasr.output.spool import Spool

log = logging.getLogger(__name__)

WINDOW = 64  # transcripts handed to paho and not yet acknowledged
_IDLE_S = 0.5  # the longest sleep: retries after a full paho queue
_STORAGE_RETRY_S = 1.0  # how often a failing disk is tried again
_RESTART_MIN_S, _RESTART_MAX_S = 0.1, 5.0  # the backoff after an exception


class Sender:
    def __init__(
        self,
        client: Any,
        spool: Spool,
        *,
        topic: str,
        connected: threading.Event,
        periodic: Callable[[], None],
        queue_full_rc: int,
    ) -> None:
        """`periodic` runs on every wake, supervised like the rest (metrics, /error)."""
        self._client, self._spool, self._topic = client, spool, topic
        self._connected, self._periodic, self._queue_full_rc = connected, periodic, queue_full_rc
        self.lock = threading.Lock()  # guards _inflight, _handed, _generation
        self._inflight: dict[int, int] = {}  # paho mid -> seq
        self._handed = 0  # highest seq handed to paho on this connection
        self._generation = self._replayed = 0  # connections made / replayed
        # (mid, reason) from on_publish; bounded: a lost ack only means a repeat on the next connect
        self._acks: collections.deque = collections.deque(maxlen=4 * WINDOW)
        self._wake, self._stop = threading.Event(), threading.Event()
        self.rejected = 0  # transcripts the broker refused (PUBACK failure)
        self.restarts = 0
        self._thread = threading.Thread(target=self._run, name="edgeasr-mqtt-outbox", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def wake(self) -> None:
        self._wake.set()

    def acked(self, mid: int, reason: Any) -> None:
        """paho's on_publish: never takes `lock` (see the module docstring)."""
        self._acks.append((mid, reason))
        self._wake.set()

    def new_connection(self) -> None:
        """Caller (on_connect) holds `lock` and has dropped paho's queue."""
        self._generation += 1
        self._wake.set()

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        failures, last = 0, ""
        next_retry = time.monotonic()
        while not self._stop.is_set():
            try:
                self._wake.wait(_IDLE_S)
                self._wake.clear()
                if time.monotonic() >= next_retry:
                    next_retry = time.monotonic() + _STORAGE_RETRY_S
                    self._spool.retry()
                self._send()
                self._periodic()
                failures = 0
            except Exception as exc:
                failures += 1
                self.restarts += 1
                delay = min(_RESTART_MAX_S, _RESTART_MIN_S * 2 ** (failures - 1))
                what = f"{type(exc).__name__}: {exc}"
                if what != last:
                    log.exception("MQTT: the sender failed; restarting it in %g s", delay)
                else:
                    log.warning("MQTT: the sender failed again (%s); restart %d in %g s", what, self.restarts, delay)
                last = what
                self._stop.wait(delay)

    def _send(self) -> None:
        with self.lock:
            self._apply_acks()
            if self._connected.is_set():
                if self._replayed != self._generation:
                    self._start_replay()
                self._feed()

    def _apply_acks(self) -> None:
        while self._acks:
            mid, reason = self._acks.popleft()
            seq = self._inflight.pop(mid, None)
            if seq is None:
                continue  # status, error, metrics, discovery: nothing stored
            if reason.is_failure:
                self.rejected += 1
                log.error("MQTT: broker rejected transcript seq=%d on %s: %s", seq, self._topic, reason)
            self._spool.acknowledge(seq)

    def _start_replay(self) -> None:
        """A new connection: paho dropped what it had; send everything again, oldest first."""
        self._inflight.clear()  # their acks were applied just before; the rest never come
        self._handed = 0
        self._replayed = self._generation
        waiting = len(self._spool)
        if waiting:
            log.info("MQTT: sending %d stored transcript(s)", waiting)

    def _feed(self) -> None:
        room = WINDOW - len(self._inflight)
        if room <= 0:
            return
        for entry in self._spool.pending(after_seq=self._handed, limit=room):
            info = self._client.publish(self._topic, entry.text, qos=1)
            if info.rc == self._queue_full_rc:
                break  # paho's queue is full of other messages; retried on the next wake
            self._inflight[info.mid] = entry.seq
            self._handed = entry.seq
