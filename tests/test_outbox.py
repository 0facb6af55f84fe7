"""The durable outbox: order, seq across restarts, the bound, crash safety, threads."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers.small_disk import cap_pages, page_count

from edgeasr.errors import OutputError
from edgeasr.output.outbox import FILENAME, Entry, Outbox


def message(i: int) -> dict:
    return {"id": f"m{i}", "seq": None, "text": f"utterance {i}"}


def test_append_assigns_seq_and_pending_keeps_order(tmp_path: Path):
    outbox = Outbox.in_state_dir(tmp_path / "state", max_items=100)
    entries = [outbox.append(message(i)) for i in range(5)]
    assert [e.seq for e in entries] == [1, 2, 3, 4, 5]
    assert json.loads(entries[2].text) == {"id": "m2", "seq": 3, "text": "utterance 2"}
    assert list(json.loads(entries[0].text)) == ["id", "seq", "text"]  # seq keeps its place
    assert outbox.pending() == entries
    assert outbox.pending(after_seq=3, limit=1) == [entries[3]]
    assert outbox.remove(2) and not outbox.remove(2)
    assert [e.seq for e in outbox.pending()] == [1, 3, 4, 5]
    assert len(outbox) == 4


def test_seq_and_rows_survive_reopening(tmp_path: Path):
    outbox = Outbox.in_state_dir(tmp_path, max_items=100)
    outbox.append(message(0))
    outbox.append(message(1))
    outbox.remove(1)
    assert outbox.next_seq() == 3
    outbox.close()
    again = Outbox.in_state_dir(tmp_path, max_items=100)
    assert [e.seq for e in again.pending()] == [2]
    assert again.append(message(2)).seq == 4  # never reissued, even after removals


def test_database_is_wal_with_full_sync(tmp_path: Path):
    Outbox.in_state_dir(tmp_path, max_items=3).close()
    db = sqlite3.connect(tmp_path / FILENAME)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    outbox = Outbox.in_state_dir(tmp_path, max_items=3)
    assert outbox._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_full_outbox_evicts_the_oldest_and_counts(tmp_path: Path, caplog):
    outbox = Outbox.in_state_dir(tmp_path, max_items=3)
    for i in range(5):
        outbox.append(message(i))
    assert [e.seq for e in outbox.pending()] == [3, 4, 5]
    assert outbox.evicted == 2 and outbox.evicted_total == 2
    assert "dropped the 1 oldest" in caplog.text
    outbox.close()
    # the bound may shrink between runs: the next append trims to the new bound
    smaller = Outbox.in_state_dir(tmp_path, max_items=1)
    smaller.append(message(5))
    assert [e.seq for e in smaller.pending()] == [6]
    assert smaller.evicted == 3 and smaller.evicted_total == 5
    assert smaller.stats() == {"depth": 1, "evicted": 5}


def test_rows_survive_sigkill(tmp_path: Path):
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from edgeasr.output.outbox import Outbox\n"
        "box = Outbox.in_state_dir(Path(sys.argv[1]), max_items=100)\n"
        "for i in range(20):\n"
        "    box.append({'id': str(i), 'seq': None})\n"
        "box.remove(1)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    outbox = Outbox.in_state_dir(tmp_path, max_items=100)
    assert [e.seq for e in outbox.pending()] == list(range(2, 21))
    assert outbox.next_seq() == 21


def test_threads_append_and_remove_concurrently(tmp_path: Path):
    outbox = Outbox.in_state_dir(tmp_path, max_items=10_000)
    removed: list[int] = []

    def producer(k: int) -> None:
        for i in range(50):
            outbox.append(message(k * 100 + i))

    def consumer() -> None:
        for _ in range(200):
            for entry in outbox.pending(limit=5):
                if outbox.remove(entry.seq):
                    removed.append(entry.seq)

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
    threads.append(threading.Thread(target=consumer))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    left = [e.seq for e in outbox.pending(limit=1000)]
    assert sorted(removed + left) == list(range(1, 201))  # nothing lost, nothing twice
    assert len(removed) == len(set(removed))


def test_unusable_state_dir_is_an_output_error(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OutputError, match="state_dir"):
        Outbox.in_state_dir(blocker / "state", max_items=5)


def test_corrupt_database_is_an_output_error(tmp_path: Path):
    (tmp_path / FILENAME).write_bytes(b"this is not an sqlite database" * 100)
    with pytest.raises(OutputError, match=FILENAME):
        Outbox.in_state_dir(tmp_path, max_items=5)


def test_sqlite_full_is_an_output_error_and_leaves_no_gap_in_seq(tmp_path: Path):
    outbox = Outbox.in_state_dir(tmp_path, max_items=1000)
    outbox.append(message(0))
    cap_pages(outbox, page_count(outbox))
    with pytest.raises(OutputError, match="database or disk is full"):
        for i in range(1, 50):  # the last page may still have room for a few rows
            outbox.append({**message(i), "text": "x" * 1000})
    stored = len(outbox)
    cap_pages(outbox, None)
    assert outbox.append(message(99)).seq == stored + 1  # the failed append's seq is issued again


def test_seq_taken_in_memory_is_inserted_later_and_never_reissued(tmp_path: Path):
    outbox = Outbox.in_state_dir(tmp_path, max_items=1000)
    outbox.append(message(0))
    held = [outbox.take_seq_in_memory() for _ in range(3)]
    assert held == [2, 3, 4]
    assert outbox.append(message(5)).seq == 5  # the database's counter skips the held numbers
    outbox.remove(5)
    outbox.insert([Entry(seq, f'{{"seq":{seq}}}') for seq in held])
    assert [e.seq for e in outbox.pending()] == [1, 2, 3, 4]
    outbox.remove_all([1, 3])
    assert [e.seq for e in outbox.pending()] == [2, 4]
    assert outbox.next_seq() == 6


def test_seq_mark_survives_a_restart_without_the_database_counter(tmp_path: Path):
    outbox = Outbox.in_state_dir(tmp_path, max_items=1000)
    outbox.append(message(0))
    assert [outbox.take_seq_in_memory() for _ in range(2)] == [2, 3]
    outbox.close()  # as a crash: seqs 2 and 3 never reached the database
    db = sqlite3.connect(tmp_path / FILENAME)
    assert db.execute("SELECT value FROM counters WHERE name = 'seq'").fetchone()[0] == 1
    db.close()
    assert (tmp_path / "outbox.seq").read_bytes() == (3).to_bytes(8, "big")
    again = Outbox.in_state_dir(tmp_path, max_items=1000)
    assert again.append(message(1)).seq == 4


def test_insert_evicts_beyond_the_bound(tmp_path: Path):
    outbox = Outbox.in_state_dir(tmp_path, max_items=3)
    outbox.append(message(0))
    outbox.append(message(1))
    held = [outbox.take_seq_in_memory() for _ in range(2)]
    outbox.insert([Entry(seq, "{}") for seq in held])
    assert [e.seq for e in outbox.pending()] == [2, 3, 4]
    assert outbox.evicted == 1


def test_the_database_and_its_wal_are_private_whatever_the_umask(tmp_path: Path):
    """Run outside systemd (umask 022), the files holding transcript text are
    0600 all the same; files an earlier version left 0644 are closed to others at the next open."""
    import os
    import stat

    def modes(state: Path) -> dict[str, str]:
        return {p.name: stat.filemode(p.stat().st_mode) for p in sorted(state.iterdir())}

    previous = os.umask(0o022)
    try:
        state = tmp_path / "state"
        outbox = Outbox.in_state_dir(state, max_items=5)
        outbox.append(message(1))
        assert set(modes(state)) == {FILENAME, f"{FILENAME}-wal", f"{FILENAME}-shm", "outbox.seq"}
        assert set(modes(state).values()) == {"-rw-------"}, modes(state)
        outbox.close()
        for p in state.iterdir():
            p.chmod(0o644)  # as an earlier version left them
        reopened = Outbox.in_state_dir(state, max_items=5)
        assert [e.seq for e in reopened.pending()] == [1]
        assert set(modes(state).values()) == {"-rw-------"}, modes(state)
        reopened.close()
    finally:
        os.umask(previous)


@pytest.mark.parametrize("kind", ["dangling symlink", "regular file"])
def test_a_state_dir_that_cannot_be_one_is_named(tmp_path: Path, kind):
    state = tmp_path / "state"
    if kind == "dangling symlink":
        state.symlink_to(tmp_path / "gone")
    else:
        state.write_text("x")
    with pytest.raises(OutputError, match=r"^state_dir: ") as err:
        Outbox.in_state_dir(state, max_items=5)
    assert err.value.exit_code == 73 and ("does not exist" in str(err.value) or "not a directory" in str(err.value))
