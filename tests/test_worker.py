"""The inference worker: one thread, lanes taking turns, finals before partials, bounds."""

from __future__ import annotations

import threading

import pytest

from edgeasr.errors import Cancelled
from edgeasr.worker import Job, LaneFull, Overflow, Worker


class Gate:
    """An engine stand-in whose jobs wait until the test opens the gate."""

    def __init__(self) -> None:
        self.open = threading.Event()


def record(log: list, name: str, gate: threading.Event | None = None):
    def run(engine, should_stop) -> None:
        if gate is not None:
            assert gate.wait(10)
        log.append(name)
    return run


def held_worker() -> tuple[Worker, threading.Event]:
    """A started worker busy with a first job until the returned event is set."""
    hold = threading.Event()
    worker = Worker(engine=None).start()
    first = worker.lane("first", 60, Overflow.BLOCK)
    first.submit(Job(record([], "hold", hold), 1.0))
    return worker, hold


def drain(worker: Worker) -> None:
    assert worker.stop(10)


def test_lanes_take_turns_and_finals_come_before_partials():
    worker, hold = held_worker()
    done: list[str] = []
    a, b = worker.lane("a", 60, Overflow.BLOCK), worker.lane("b", 60, Overflow.BLOCK)
    for i in range(3):
        a.submit(Job(record(done, f"a{i}"), 1.0))
    b.submit(Job(record(done, "b0"), 1.0))
    b.offer_partial(Job(record(done, "b-partial"), 1.0, partial=True))
    hold.set()
    worker_done = threading.Event()
    b.submit(Job(lambda e, s: worker_done.set(), 0.0))
    assert worker_done.wait(10)
    drain(worker)
    # b's final is not stuck behind all of a's; the partial waits for every final
    assert done.index("b0") < done.index("a2")
    assert "b-partial" not in done or done.index("b-partial") > done.index("a2")


def test_a_newer_partial_replaces_the_waiting_one():
    worker, hold = held_worker()
    done: list[str] = []
    lane = worker.lane("mic", 60, Overflow.BLOCK)
    lane.offer_partial(Job(record(done, "old"), 1.0, partial=True))
    lane.offer_partial(Job(record(done, "new"), 1.0, partial=True))
    hold.set()
    finished = threading.Event()
    lane.offer_partial(Job(lambda e, s: (done.append("last"), finished.set()), 1.0, partial=True))
    assert finished.wait(10)
    drain(worker)
    assert "old" not in done and worker.stats.partials_skipped >= 1


def test_a_running_partial_stops_between_tokens_when_a_final_arrives():
    worker = Worker(engine=None).start()
    lane = worker.lane("mic", 60, Overflow.BLOCK)
    started, done = threading.Event(), []

    def long_partial(engine, should_stop) -> None:
        started.set()
        for _ in range(10_000):  # "tokens"
            if should_stop():
                raise Cancelled("a final is waiting")
            threading.Event().wait(0.001)
        done.append("partial finished")

    lane.offer_partial(Job(long_partial, 10.0, partial=True))
    assert started.wait(10)
    lane.submit(Job(record(done, "final"), 1.0))
    drain(worker)
    assert done == ["final"] and worker.stats.partials_skipped == 1


def test_drop_oldest_when_live_and_behind():
    worker, hold = held_worker()
    reported: list[Exception] = []
    lane = worker.lane("mic", 3.0, Overflow.DROP_OLDEST)
    jobs = [Job(record([], str(i)), 1.0, failed=reported.append) for i in range(5)]
    for job in jobs:
        lane.submit(job)
    assert lane.dropped == 2 and lane.dropped_seconds == 2.0 and lane.seconds == 3.0
    assert len(reported) == 2 and all(isinstance(e, LaneFull) for e in reported)
    hold.set()
    drain(worker)


def test_reject_lanes_refuse_beyond_their_bound():
    worker, hold = held_worker()
    lane = worker.lane("client", 2.0, Overflow.REJECT)
    lane.submit(Job(record([], "a"), 1.5))
    with pytest.raises(LaneFull, match="client: more than 2 s of audio waiting"):
        lane.submit(Job(record([], "b"), 1.0))
    hold.set()
    drain(worker)


def test_block_lanes_wait_for_room():
    worker, hold = held_worker()
    done: list[str] = []
    lane = worker.lane("file", 2.0, Overflow.BLOCK)
    lane.submit(Job(record(done, "a"), 1.5))
    submitted = threading.Event()

    def submit_second() -> None:
        lane.submit(Job(record(done, "b"), 1.0))
        submitted.set()

    threading.Thread(target=submit_second, daemon=True).start()
    assert not submitted.wait(0.3)  # no room until "a" has run
    hold.set()
    assert submitted.wait(10)
    drain(worker)
    assert done == ["a", "b"]


def test_a_failing_job_is_reported_and_the_worker_goes_on():
    worker = Worker(engine=None).start()
    lane = worker.lane("mic", 60, Overflow.BLOCK)
    reported: list[Exception] = []
    done: list[str] = []

    def broken(engine, should_stop) -> None:
        raise RuntimeError("the device fell over")

    lane.submit(Job(broken, 1.0, failed=reported.append))
    lane.submit(Job(record(done, "next"), 1.0))
    drain(worker)
    assert [str(e) for e in reported] == ["the device fell over"] and done == ["next"]
    assert worker.stats.failures == 1


def test_a_closed_lane_runs_nothing_more():
    worker, hold = held_worker()
    done: list[str] = []
    lane = worker.lane("client", 60, Overflow.REJECT)
    lane.submit(Job(record(done, "never"), 1.0))
    lane.close()
    hold.set()
    drain(worker)
    assert done == [] and lane not in worker._lanes


def test_a_cancelled_final_leaves_the_lanes_count_at_once():
    worker, hold = held_worker()
    lane = worker.lane("client", 2.0, Overflow.REJECT)
    stale = Job(record([], "stale"), 1.5)
    lane.submit(stale)
    stale.cancel()
    assert lane.seconds == 0.0 and lane.depth == 0
    lane.submit(Job(record([], "fresh"), 1.5))  # room again: only real work counts
    assert worker.stats.cancelled == 1
    hold.set()
    drain(worker)
    assert worker.stats.cancelled == 1 and worker.stats.finals == 2  # "hold" and "fresh"


def test_a_cancelled_partial_is_no_longer_offered():
    worker, hold = held_worker()
    done: list[str] = []
    lane = worker.lane("mic", 60, Overflow.BLOCK)
    partial = Job(record(done, "partial"), 1.0, partial=True)
    lane.offer_partial(partial)
    partial.cancel()
    hold.set()
    drain(worker)
    assert done == [] and worker.stats.partials_skipped == 1
