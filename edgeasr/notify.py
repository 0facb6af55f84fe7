"""systemd integration: sd_notify (Type=notify), a progress-gated watchdog, journald.

The only module that imports systemd-python (`from systemd import daemon, journal`), and
only when systemd is actually in charge: outside systemd everything here is a no-op.

The watchdog pings (WATCHDOG=1) every half of WATCHDOG_USEC, but only while the pipeline
proves it is alive: `progress()` must report that every stage moved since the previous
check (see `Progress`).  A stalled worker therefore stops the pings and systemd restarts
the service after WatchdogSec, which is the point of having a watchdog at all.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from edgeasr.errors import ToolMissingError
from edgeasr.stages import Notifier

log = logging.getLogger(__name__)

SYSLOG_IDENTIFIER = "edgeasr"


def _systemd(module: str) -> Any:
    try:
        mod = importlib.import_module(f"systemd.{module}")  # daemon or journal
    except ImportError as exc:
        raise ToolMissingError(
            "systemd-python is not installed but the service runs under systemd "
            "(pip install 'edgeasr[systemd]', or apt install python3-systemd)"
        ) from exc
    return mod


class SystemdNotifier:
    """stages.Notifier: sd_notify(3) when NOTIFY_SOCKET is set, else nothing."""

    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        self.enabled = bool(environ.get("NOTIFY_SOCKET"))
        self._daemon = _systemd("daemon") if self.enabled else None
        self.last_status = ""
        self._failed = False

    def notify(self, state: str) -> None:
        for line in state.splitlines():
            if line.startswith("STATUS="):
                self.last_status = line[len("STATUS=") :]
        if self._daemon is None:
            return
        try:
            self._daemon.notify(state)
        except OSError as exc:  # the socket vanished: systemd will notice the missing pings
            if not self._failed:
                log.warning("cannot notify systemd (NOTIFY_SOCKET): %s", exc)
            self._failed = True

    def ready(self, status: str) -> None:
        self.notify(f"READY=1\nSTATUS={status}")

    def status(self, text: str) -> None:
        self.notify(f"STATUS={text}")

    def stopping(self, status: str = "stopping: finishing the current speech") -> None:
        self.notify(f"STOPPING=1\nSTATUS={status}")


def watchdog_interval_s(environ: Mapping[str, str] = os.environ, pid: int | None = None) -> float | None:
    """Half of WATCHDOG_USEC, or None when systemd expects no pings from this process."""
    usec = environ.get("WATCHDOG_USEC")
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    owner = environ.get("WATCHDOG_PID")
    if owner and owner.isdigit() and int(owner) != (pid if pid is not None else os.getpid()):
        return None  # the watchdog belongs to another process (e.g. our parent)
    return int(usec) / 1e6 / 2


class Progress:
    """Liveness marks from the pipeline's stages.

    Each stage calls `mark(name)` whenever it completes a step of its loop (capture per
    block, the worker per segment and per idle wait, ...).  Calling the object answers
    "did every stage mark since the previous call?"; `stalled` names those that did not.
    """

    def __init__(self, *stages: str) -> None:
        if not stages:
            raise ValueError("Progress needs at least one stage name")
        self._counts = dict.fromkeys(stages, 0)
        self._seen = dict(self._counts)
        self.stalled: tuple[str, ...] = ()

    def mark(self, stage: str) -> None:
        self._counts[stage] += 1  # one thread per stage: no lock needed

    def __call__(self) -> bool:
        counts = dict(self._counts)
        self.stalled = tuple(name for name, n in counts.items() if n == self._seen[name])
        self._seen = counts
        return not self.stalled


class Watchdog:
    """Pings systemd's watchdog from its own thread while `progress()` says the pipeline moves."""

    def __init__(
        self,
        notifier: Notifier,
        progress: Callable[[], bool],
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self._notifier, self._progress = notifier, progress
        self.interval_s = watchdog_interval_s(environ) if notifier.enabled else None
        self.stalled = False
        self._resume_status = ""  # the daemon's STATUS= text, restored when progress resumes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.interval_s is not None

    def start(self) -> bool:
        """Ping now and then every interval_s; False (and nothing started) without a watchdog."""
        if not self.enabled:
            return False
        self._notifier.notify("WATCHDOG=1")  # the service just became ready
        self._thread = threading.Thread(target=self._run, name="edgeasr-watchdog", daemon=True)
        self._thread.start()
        log.info("systemd watchdog: pinging every %.1f s while the pipeline makes progress", self.interval_s)
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def check(self) -> bool:
        """One watchdog step: ping if the pipeline made progress; True if pinged."""
        if self._progress():
            self._notifier.notify("WATCHDOG=1")
            if self.stalled:
                self.stalled = False
                log.info("systemd watchdog: the pipeline moves again; pings resumed")
                self._notifier.status(self._resume_status)
            return True
        if not self.stalled:
            self.stalled = True
            self._resume_status = self._notifier.last_status
            names = ", ".join(getattr(self._progress, "stalled", ())) or "the pipeline"
            text = (
                f"stalled: {names} made no progress in the last {self.interval_s:.1f} s; "
                "watchdog pings withheld"
            )
            log.warning("systemd watchdog: %s", text)
            self._notifier.status(text)
        return False

    def _run(self) -> None:
        assert self.interval_s is not None
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.interval_s
            self.check()


def journal_handler(
    environ: Mapping[str, str] = os.environ, identifier: str = SYSLOG_IDENTIFIER
) -> logging.Handler | None:
    """A logging handler writing to journald when systemd started us, else None.

    Under systemd stderr reaches the journal anyway; this adds priorities and fields.
    Use it instead of (not next to) the stderr handler, or every line appears twice.
    """
    if not (environ.get("JOURNAL_STREAM") or environ.get("INVOCATION_ID")):
        return None
    return _systemd("journal").JournalHandler(SYSLOG_IDENTIFIER=identifier)
