"""MqttPublisher on a disk that really fills (a 2 MB tmpfs, as root) and with a sender
that fails: nothing is lost, order holds, /error and health() tell, the sender restarts.

Every check counts what a persistent-session subscriber received from a real Mosquitto."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers.mqtt import DEVICE, TOPICS, distinct_seqs, publisher_and_outbox, sample_draft, transcripts, wait_seqs
from helpers.payload import validator
from helpers.small_disk import Disk, small_tmpfs
from helpers.waiting import wait_until

from edgeasr.output.mqtt import MqttPublisher
from edgeasr.output.outbox import Entry, Outbox

pytestmark = pytest.mark.broker


def errors(sub) -> list[dict]:
    return [m.json() for m in sub.on(TOPICS.error)]


def stop_broker(broker, pub: MqttPublisher) -> None:
    broker.stop()
    wait_until(lambda: not pub.connected, 5)


@pytest.mark.system
def test_full_disk_with_broker_down_then_space_then_broker_delivers_all_in_order(mosquitto, subscribe, tmp_path):
    sub = subscribe(mosquitto, [TOPICS.transcript])
    with small_tmpfs(tmp_path / "disk") as disk:
        pub, outbox = publisher_and_outbox(mosquitto, disk.path)
        assert pub.start().wait_connected(10)
        stop_broker(mosquitto, pub)
        for i in range(3):
            pub.publish(sample_draft(i))
        disk.fill()
        for i in range(3, 11):
            pub.publish(sample_draft(i))  # before the spool, 6 of these raised and were gone
        health = pub.health()
        assert health.storage_failing and "database or disk is full" in str(health.storage_error)
        assert health.held_in_memory == 8 and health.waiting == 11 and health.dropped == 0
        disk.free()
        # the sender retries the disk every second and moves memory there
        wait_until(lambda: not pub.health().storage_failing, 15)
        assert pub.health().held_in_memory == 0 and pub.stats()["depth"] == 11
        mosquitto.start()
        assert wait_seqs(sub, 11) == list(range(1, 12))
        for i in range(11, 16):
            pub.publish(sample_draft(i))
        assert wait_seqs(sub, 16) == list(range(1, 17))
        assert [m["text"] for m in transcripts(sub)][:16] == [f"utterance {i}" for i in range(16)]
        assert pub.flush(10)
        pub.close(5)
        outbox.close()


@pytest.mark.system
def test_broker_back_while_disk_still_full_sends_from_memory_and_survives_failed_deletes(
    mosquitto, subscribe, tmp_path, caplog
):
    sub = subscribe(mosquitto, [TOPICS.transcript, TOPICS.error])
    with small_tmpfs(tmp_path / "disk") as disk:
        pub, outbox = publisher_and_outbox(mosquitto, disk.path)
        assert pub.start().wait_connected(10)
        stop_broker(mosquitto, pub)
        for i in range(5):
            pub.publish(sample_draft(i))
        disk.fill()
        for i in range(5, 11):
            pub.publish(sample_draft(i))
        mosquitto.start()  # the disk is still full: the acknowledged rows cannot be deleted
        assert wait_seqs(sub, 11) == list(range(1, 12))
        assert pub.flush(10)  # acknowledged...
        assert len(outbox) == 5  # ...even though the 5 rows from before the fill wait for their delete
        health = pub.health()
        assert health.connected and health.storage_failing and health.held_in_memory == 0
        assert health.sender_restarts == 0
        assert sub.wait_for(lambda s: len(errors(s)) == 1, 10)
        failing = errors(sub)[0]
        validator("error").validate(failing)
        assert failing["context"] == "outbox" and failing["error"].startswith("storage failing: ")
        assert "database or disk is full" in failing["error"] and "resolved" not in failing
        for i in range(11, 14):  # still full: held in memory, sent directly
            pub.publish(sample_draft(i))
        assert wait_seqs(sub, 14) == list(range(1, 15))
        disk.free()
        assert sub.wait_for(lambda s: len(errors(s)) == 2, 10)
        recovered = errors(sub)[1]
        validator("error").validate(recovered)
        assert recovered["resolved"] is True and recovered["error"].startswith("storage recovered")
        for i in range(14, 19):  # before the spool, these were stored and never sent
            pub.publish(sample_draft(i))
        assert wait_seqs(sub, 19) == list(range(1, 20))
        assert pub.flush(10)
        assert len(outbox) == 0  # the failed deletes were retried
        assert len(transcripts(sub)) == 19  # nothing sent twice
        assert not any(r.exc_info for r in caplog.records)  # no traceback: nothing died
        pub.close(5)
        outbox.close()


@pytest.mark.system
def test_disk_full_while_connected_publishes_directly(mosquitto, subscribe, tmp_path):
    sub = subscribe(mosquitto, [f"edgeasr/{DEVICE}/#"])
    with small_tmpfs(tmp_path / "disk") as disk:
        pub, outbox = publisher_and_outbox(mosquitto, disk.path, metrics_interval_s=0.3)
        assert pub.start().wait_connected(10)
        pub.publish(sample_draft(0))
        assert pub.flush(10)
        disk.fill()
        for i in range(1, 6):
            pub.publish(sample_draft(i))
        assert wait_seqs(sub, 6) == list(range(1, 7))
        assert pub.flush(10)
        health = pub.health()
        assert health.storage_failing and health.held_in_memory == 0 and health.dropped == 0
        assert "storage failing" in health.summary()
        metrics = sub.wait_for(lambda s: any(m.json()["outbox"]["storage_failing"] for m in s.on(TOPICS.metrics)))
        assert metrics
        failing_metrics = next(m.json() for m in sub.on(TOPICS.metrics) if m.json()["outbox"]["storage_failing"])
        validator("metrics").validate(failing_metrics)
        disk.free()
        wait_until(lambda: not pub.health().storage_failing, 15)
        for i in range(6, 9):
            pub.publish(sample_draft(i))
        assert wait_seqs(sub, 9) == list(range(1, 10))
        assert [e.get("resolved", False) for e in errors(sub)] == [False, True]
        pub.close(5)
        outbox.close()


@pytest.mark.system
def test_memory_bound_with_broker_down_keeps_the_newest_and_counts(mosquitto, subscribe, tmp_path):
    sub = subscribe(mosquitto, [TOPICS.transcript])
    with small_tmpfs(tmp_path / "disk") as disk:
        pub, outbox = publisher_and_outbox(mosquitto, disk.path, outbox_max=5)  # memory bound: 5 too
        assert pub.start().wait_connected(10)
        stop_broker(mosquitto, pub)
        pub.publish(sample_draft(0))
        pub.publish(sample_draft(1))
        disk.fill()
        for i in range(2, 10):
            pub.publish(sample_draft(i))
        health = pub.health()
        assert health.held_in_memory == 5 and health.dropped == 3  # seqs 3, 4, 5: memory's oldest
        _free_and_wait(disk, pub)
        assert pub.health().evicted == 2  # moving 5 next to 2 on disk: the outbox's bound evicts 1, 2
        mosquitto.start()
        assert wait_seqs(sub, 5) == [6, 7, 8, 9, 10]  # the newest five; the gaps show the losses
        assert pub.stats()["dropped"] == 3
        pub.close(5)
        outbox.close()


def _free_and_wait(disk: Disk, pub: MqttPublisher) -> None:
    disk.free()
    wait_until(lambda: not pub.health().storage_failing, 15)


class FailingOutbox(Outbox):
    """An outbox whose reads fail with an unexpected error `failures` times once armed,
    as a bug in the sender's work would."""

    def __init__(self, path: Path, max_items: int) -> None:
        super().__init__(path, max_items)
        self.failures = 0

    def pending(self, after_seq: int = 0, limit: int = 100) -> list[Entry]:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("injected failure in the sender's work")
        return super().pending(after_seq, limit)


def test_sender_restarts_after_unexpected_exceptions(mosquitto, subscribe, tmp_path, caplog):
    sub = subscribe(mosquitto, [TOPICS.transcript])
    pub, outbox = publisher_and_outbox(mosquitto, tmp_path / "state", FailingOutbox)
    assert pub.start().wait_connected(10)
    outbox.failures = 3
    for i in range(4):
        pub.publish(sample_draft(i))
    assert wait_seqs(sub, 4) == [1, 2, 3, 4]  # the broker was not left unused
    assert pub.flush(10)
    assert pub.health().sender_restarts == 3 and pub.stats()["sender_restarts"] == 3
    crashes = [r for r in caplog.records if r.name == "edgeasr.output.sender" and "sender failed" in r.getMessage()]
    assert len(crashes) == 3
    assert crashes[0].exc_info and "injected failure" in caplog.text  # one traceback
    assert not any(r.exc_info for r in crashes[1:])  # the same failure again: one line each
    assert all(r.levelno >= logging.WARNING for r in crashes)
    assert distinct_seqs(sub) == [1, 2, 3, 4]
    pub.close(5)
