"""The spool: a full or failing disk never loses a transcript it can keep, order holds,
the memory bound drops the oldest held (counted), failed deletes are retried.

The disk fills for real: SQLite's max_page_count (its own SQLITE_FULL) or, as root, a
small tmpfs filled to the last block."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from helpers.small_disk import cap_pages, page_count, small_tmpfs

from edgeasr.output.outbox import Outbox
from edgeasr.output.spool import MEMORY_MAX, Spool


def message(i: int) -> dict:
    return {"id": f"m{i}", "seq": None, "text": f"utterance {i} " + "x" * 500}


def texts(entries) -> list[str]:
    return [json.loads(e.text)["id"] for e in entries]


def full_database(tmp_path: Path, max_items: int = 1000) -> Outbox:
    """An outbox whose file cannot grow by one page (two rows fit before that)."""
    outbox = Outbox.in_state_dir(tmp_path, max_items=max_items)
    cap_pages(outbox, page_count(outbox) + 1)
    return outbox


def test_full_database_holds_in_memory_then_writes_back_in_seq_order(tmp_path, caplog):
    outbox = full_database(tmp_path)
    spool = Spool(outbox)
    entries = [spool.add(message(i)) for i in range(8)]  # none raises
    assert [e.seq for e in entries] == list(range(1, 9))
    state = spool.state()
    assert state.failing and "database or disk is full" in str(state.error)
    assert state.held_in_memory > 0 and state.depth + state.held_in_memory == 8
    assert [e.seq for e in spool.pending(0, 100)] == list(range(1, 9))  # disk rows, then memory's
    assert [e.seq for e in spool.pending(5, 2)] == [6, 7]
    assert texts(spool.pending(0, 100)) == [f"m{i}" for i in range(8)]
    spool.retry()
    assert spool.failing  # still full: nothing changed
    cap_pages(outbox, None)  # space freed
    spool.retry()
    state = spool.state()
    assert not state.failing and state.held_in_memory == 0 and state.depth == 8
    assert [e.seq for e in outbox.pending(limit=100)] == list(range(1, 9))
    assert texts(outbox.pending(limit=100)) == [f"m{i}" for i in range(8)]
    assert spool.add(message(8)).seq == 9
    failing = [r for r in caplog.records if "held in memory (at most" in r.getMessage()]
    recovered = [r for r in caplog.records if "moved from memory" in r.getMessage()]
    assert len(failing) == 1 and failing[0].levelno == logging.ERROR  # once per episode, not per add
    assert len(recovered) == 1


def test_memory_bound_drops_the_oldest_held_and_counts(tmp_path, caplog):
    outbox = full_database(tmp_path)
    spool = Spool(outbox, memory_max=3)
    for i in range(20):
        spool.add(message(i))
    on_disk = [e.seq for e in outbox.pending(limit=100)]
    state = spool.state()
    assert state.held_in_memory == 3 and 0 < len(on_disk) < 17
    # the rule: rows on disk stay; memory keeps its newest `memory_max`; the rest are dropped
    dropped = list(range(len(on_disk) + 1, 18))
    assert state.dropped == len(dropped)
    assert [e.seq for e in spool.pending(0, 100)] == on_disk + [18, 19, 20]
    logged = [r.getMessage() for r in caplog.records if "dropped the oldest" in r.getMessage()]
    assert [int(text.split("seq=")[1].split(" ")[0]) for text in logged] == dropped
    cap_pages(outbox, None)
    spool.retry()
    assert [e.seq for e in outbox.pending(limit=100)] == on_disk + [18, 19, 20]
    assert spool.state().dropped == len(dropped)


def test_memory_bound_is_mqtt_outbox_max_at_most(tmp_path):
    assert Spool(Outbox.in_state_dir(tmp_path, max_items=5)).memory_max == 5
    assert Spool(Outbox.in_state_dir(tmp_path / "b", max_items=100_000)).memory_max == MEMORY_MAX


def test_acknowledged_while_in_memory_is_forgotten_without_the_disk(tmp_path):
    outbox = full_database(tmp_path)
    spool = Spool(outbox)
    entries = [spool.add(message(i)) for i in range(5)]
    held = [e.seq for e in entries if e.seq not in {r.seq for r in outbox.pending()}]
    for seq in held:
        spool.acknowledge(seq)
    assert spool.state().held_in_memory == 0 and len(spool) == 5 - len(held)
    cap_pages(outbox, None)
    spool.retry()
    assert not spool.failing
    assert spool.add(message(9)).seq == 6  # the database's counter caught up with memory's


@pytest.mark.system
def test_deletes_on_a_full_disk_are_retried_and_not_sent_twice(tmp_path, caplog):
    with small_tmpfs(tmp_path / "disk") as disk:
        outbox = Outbox.in_state_dir(disk.path, max_items=1000)
        spool = Spool(outbox)
        for i in range(6):
            spool.add(message(i))
        disk.fill()
        spool.acknowledge(1)  # the broker has 1 and 2; deleting their rows needs the full disk
        spool.acknowledge(2)
        assert spool.failing and "database or disk is full" in str(spool.state().error)
        assert [e.seq for e in outbox.pending()] == [1, 2, 3, 4, 5, 6]  # the rows are still there
        assert [e.seq for e in spool.pending(0, 100)] == [3, 4, 5, 6]  # ...and not sent again
        assert [e.seq for e in spool.pending(0, 2)] == [3, 4]  # the limit counts what is sent
        assert len(spool) == 4
        spool.retry()
        assert spool.failing
        disk.free()
        spool.retry()
        assert not spool.failing
        assert [e.seq for e in outbox.pending()] == [3, 4, 5, 6]
        outbox.close()


@pytest.mark.system
def test_full_tmpfs_keeps_every_transcript_and_seq_survives_a_crash(tmp_path):
    with small_tmpfs(tmp_path / "disk") as disk:
        outbox = Outbox.in_state_dir(disk.path, max_items=1000)
        spool = Spool(outbox)
        for i in range(3):
            spool.add(message(i))
        disk.fill()
        held = [spool.add(message(i)).seq for i in range(3, 8)]  # none raises
        state = spool.state()
        assert state.failing and state.held_in_memory == 5 and held == [4, 5, 6, 7, 8]
        assert [e.seq for e in spool.pending(0, 100)] == list(range(1, 9))
        outbox.close()  # a crash: memory is gone, the database never saw seqs 4..8
        disk.free()
        again = Outbox.in_state_dir(disk.path, max_items=1000)
        assert [e.seq for e in again.pending()] == [1, 2, 3]
        assert again.append(message(9)).seq == 9  # not 4: those numbers may have been published
        again.close()
