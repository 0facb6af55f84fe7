"""The one inference worker: the only thread that runs the engine, and so uses the encoder device.

Front ends (the microphone pipeline, each Wyoming session) submit jobs through a `Lane` of
their own. The worker runs final jobs before partial ones; among finals the lanes take turns,
so one busy client cannot starve another. Each lane's finals are bounded in seconds of audio,
and the lane's `Overflow` policy says what happens beyond that bound. A lane holds at most one
partial job: a newer one replaces it (on a busy CPU partial results are skipped, never
queued), it runs only when no final waits, and it stops between two decoded tokens as soon as
a final arrives, so partial results never delay a final transcript by more than one token.
"""

from __future__ import annotations

import collections
import enum
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edgeasr.errors import Cancelled
from edgeasr.stages import Engine

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.5  # longest wait for a job, so stop requests and liveness marks stay prompt


class Overflow(enum.Enum):
    DROP_OLDEST = "drop oldest"  # a live microphone: fresh speech matters more than a backlog
    BLOCK = "block"  # a file or stdin: the reader waits, nothing read is lost
    REJECT = "reject"  # a network client: its job is refused (it is told)


class LaneFull(Exception):
    """A REJECT lane's bound would be exceeded by this job."""


@dataclass(eq=False)
class Job:
    """Work for the engine. `run(engine, should_stop)` is called on the worker thread; a long
    decode calls should_stop() between tokens and raises errors.Cancelled when it is true."""

    run: Callable[[Engine, Callable[[], bool]], None]
    seconds: float  # audio it covers: what the lane's bound counts
    partial: bool = False
    # called on the worker thread when run() raised (not for Cancelled), or when the job is
    # dropped from a full lane; the front end reports it
    failed: Callable[[Exception], None] = lambda exc: None
    cancelled: threading.Event = field(default_factory=threading.Event)
    # set by the lane that holds the job: a cancelled job leaves its count at once, so that
    # stale work never makes a lane refuse or drop real work
    _withdraw: Callable[[Job], None] | None = field(default=None, init=False, repr=False)

    def cancel(self) -> None:
        self.cancelled.set()
        if self._withdraw is not None:
            self._withdraw(self)


@dataclass
class WorkerStats:
    finals: int = 0
    partials: int = 0
    partials_skipped: int = 0  # replaced or cancelled before they ran, or stopped for a final
    cancelled: int = 0  # finals cancelled (their front end went away, a speculation went stale)
    failures: int = 0
    busy_s: float = 0.0


class Lane:
    """One front end's queue at the worker."""

    def __init__(self, worker: Worker, name: str, max_seconds: float, overflow: Overflow) -> None:
        self.worker, self.name = worker, name
        self.max_seconds, self.overflow = max_seconds, overflow
        self._finals: collections.deque[Job] = collections.deque()
        self._seconds = 0.0
        self._partial: Job | None = None
        self.dropped = 0
        self.dropped_seconds = 0.0

    def submit(self, job: Job, stop: threading.Event | None = None) -> list[Job]:
        """Queue a final job; returns the jobs dropped to make room (DROP_OLDEST). BLOCK waits
        for room (until `stop` is set); REJECT raises LaneFull."""
        dropped: list[Job] = []
        with self.worker.cond:
            while self._finals and self._seconds + job.seconds > self.max_seconds:
                if self.overflow is Overflow.REJECT:
                    raise LaneFull(f"{self.name}: more than {self.max_seconds:g} s of audio waiting")
                if self.overflow is Overflow.BLOCK:
                    if stop is not None and stop.is_set():
                        break
                    self.worker.cond.wait(IDLE_POLL_S)
                    continue
                old = self._finals.popleft()
                self._seconds -= old.seconds
                self.dropped += 1
                self.dropped_seconds += old.seconds
                dropped.append(old)
            self._finals.append(job)
            self._seconds += job.seconds
            job._withdraw = self._withdraw
            self.worker.cond.notify_all()
        for old in dropped:
            old.failed(LaneFull(f"{self.name}: dropped {old.seconds:.1f} s of queued speech"))
        return dropped

    def offer_partial(self, job: Job) -> None:
        """Make `job` this lane's partial job, replacing one that has not run yet."""
        with self.worker.cond:
            if self._partial is not None:
                self.worker.stats.partials_skipped += 1
            self._partial = job
            job._withdraw = self._withdraw
            self.worker.cond.notify_all()

    def close(self) -> None:
        """Cancel everything still waiting (a client went away)."""
        with self.worker.cond:
            waiting, self._finals = list(self._finals), collections.deque()
            self._seconds = 0.0
            self._partial = None
        for job in waiting:
            job.cancel()
        self.worker.remove(self)

    def _withdraw(self, job: Job) -> None:
        """A job cancelled while it waits: out of the queue and its count (the worker may have
        taken it already: then it sees the cancel itself)."""
        with self.worker.cond:
            if job is self._partial:
                self._partial = None
                self.worker.stats.partials_skipped += 1
            elif job in self._finals:
                self._finals.remove(job)
                self._seconds -= job.seconds
                self.worker.stats.cancelled += 1
            else:
                return
            self.worker.cond.notify_all()  # room for a BLOCK lane

    @property
    def depth(self) -> int:
        return len(self._finals)

    @property
    def seconds(self) -> float:
        return self._seconds

    def _take_final(self) -> Job | None:
        if not self._finals:
            return None
        job = self._finals.popleft()
        self._seconds -= job.seconds
        return job

    def _take_partial(self) -> Job | None:
        job, self._partial = self._partial, None
        return job


class Worker:
    """Runs jobs on `engine` in one thread (`start`/`stop`), marking `progress` each loop."""

    def __init__(self, engine: Engine, progress: Callable[[], None] = lambda: None) -> None:
        self.engine = engine
        self.progress = progress
        self.cond = threading.Condition()
        self.stats = WorkerStats()
        self._lanes: list[Lane] = []
        self._turn = itertools.count()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="edgeasr-inference", daemon=True)

    def lane(self, name: str, max_seconds: float, overflow: Overflow) -> Lane:
        lane = Lane(self, name, max_seconds, overflow)
        with self.cond:
            self._lanes.append(lane)
        return lane

    def remove(self, lane: Lane) -> None:
        with self.cond:
            if lane in self._lanes:
                self._lanes.remove(lane)

    def start(self) -> Worker:
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None) -> bool:
        """Finish the finals already queued (within timeout_s), then end; True if it did."""
        with self.cond:
            self._stopping = True
            for lane in self._lanes:
                lane._partial = None
            self.cond.notify_all()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def finals_waiting(self) -> bool:
        return any(lane._finals for lane in self._lanes)

    # -- the worker thread ------------------------------------------------------------------
    def _next(self) -> Job | None:
        """The next job: a final, lanes taking turns; else a partial; else None after a wait."""
        with self.cond:
            for _ in range(2):
                lanes = self._lanes
                start = next(self._turn) % len(lanes) if lanes else 0
                for lane in lanes[start:] + lanes[:start]:
                    job = lane._take_final()
                    if job is not None:
                        self.cond.notify_all()  # room for a BLOCK lane
                        return job
                if not self._stopping:
                    for lane in lanes[start:] + lanes[:start]:
                        job = lane._take_partial()
                        if job is not None:
                            return job
                if self._stopping:
                    return None
                self.cond.wait(IDLE_POLL_S)
            return None

    def _loop(self) -> None:
        while True:
            self.progress()
            job = self._next()
            if job is None:
                with self.cond:
                    if self._stopping and not self.finals_waiting():
                        return
                continue
            self._run(job)

    @staticmethod
    def _report(job: Job, exc: Exception) -> None:
        try:
            job.failed(exc)
        except Exception:  # a front end's report must not end the worker
            log.exception("reporting a failed job failed")

    def _run(self, job: Job) -> None:
        if job.cancelled.is_set():
            if job.partial:
                self.stats.partials_skipped += 1
            else:
                self.stats.cancelled += 1
            return

        def should_stop() -> bool:
            return job.cancelled.is_set() or (job.partial and self.finals_waiting())

        t0 = time.monotonic()
        try:
            job.run(self.engine, should_stop)
            if job.partial:
                self.stats.partials += 1
            else:
                self.stats.finals += 1
        except Cancelled:
            if job.partial:
                self.stats.partials_skipped += 1
            else:
                self.stats.cancelled += 1
        except Exception as exc:  # the one supervision point of the worker: keep serving
            self.stats.failures += 1
            log.exception("an inference job failed")
            self._report(job, exc)
        finally:
            self.stats.busy_s += time.monotonic() - t0
            with self.cond:
                self.cond.notify_all()
