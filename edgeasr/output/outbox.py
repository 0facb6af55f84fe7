"""Durable outbox: transcripts wait on disk until the broker has acknowledged them.

A transcript is committed to an SQLite database in state_dir *before* it is handed to
MQTT and deleted only when its PUBACK arrives, so it survives a broker outage and a
crash of the daemon (SIGKILL, power loss).  The same database holds the `seq` counter,
which therefore never goes back, even across restarts.

Order: rows are keyed by `seq`, and are handed to MQTT in `seq` order.

Bound (mqtt.outbox_max): when the outbox is full, appending a transcript first evicts
the OLDEST waiting ones, so the newest `max_items` are kept: after a long outage the
most recent speech is the most useful, and the bound keeps the SD card from filling.
Every eviction is counted (`evicted`, kept in the database too) and logged as a warning;
consumers see it as a gap in `seq`.

Durability: WAL journal with synchronous=FULL.  With WAL, NORMAL already survives a
process crash (SIGKILL), but a power cut can lose the last commits; a Pi running from an
SD card does lose power, and the transcript rate (well under one per second) makes the
extra fsync per commit negligible.  FULL also keeps `seq` from being reissued after a
power cut.

Full or failing disk: every method raises OutputError (never a bare sqlite3.Error);
edgeasr.output.spool holds transcripts in memory meanwhile and later `insert`s them with
the seq they were given.  While the database cannot be written, `take_seq_in_memory`
hands out the next numbers and records the highest in a small side file (`outbox.seq`)
that is overwritten in place: that needs no new disk block, so it works on a full disk,
and a restart after a crash continues after those numbers instead of issuing them again.

Thread-safe: one connection guarded by a lock (the sender thread deletes rows while the
pipeline appends from its own).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import stat
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from edgeasr.errors import OutputError

log = logging.getLogger(__name__)

FILENAME = "outbox.sqlite3"
SEQ_MARK_SUFFIX = ".seq"  # outbox.seq: the highest seq handed out while the database could not be written
_BUSY_TIMEOUT_S = 5.0  # another process holding the file (a second daemon) fails after this

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY, payload TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters (name, value) VALUES ('seq', 0), ('evicted', 0);
"""


class Entry(NamedTuple):
    seq: int
    text: str  # the message as published (JSON)


def encode(message: Mapping[str, Any], seq: int) -> Entry:
    """The message with its `seq` set (in place, keeping the key order), as published."""
    record = dict(message)
    record["seq"] = seq
    return Entry(seq, json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False))


class Outbox:
    """SQLite-backed FIFO of transcripts awaiting acknowledgement."""

    def __init__(self, path: Path, max_items: int) -> None:
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        self.path = Path(path)
        self.max_items = max_items
        self.evicted = 0  # evictions by this process (the all-time total is `evicted_total`)
        self._lock = threading.Lock()
        self._db = self._open(self.path)
        self._mark = _SeqMark(self.path.with_suffix(SEQ_MARK_SUFFIX))
        # the last seq issued; above the database's counter after a crash while the disk was full
        self._last_seq = max(self._counter(self._db, "seq"), self._mark.value)

    @classmethod
    def in_state_dir(cls, state_dir: Path, max_items: int) -> Outbox:
        state_dir = Path(state_dir)
        check_state_dir(state_dir)
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"state_dir: cannot create {state_dir}: {exc.strerror or exc}") from exc
        return cls(state_dir / FILENAME, max_items)

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
        _private(path)
        try:
            db = sqlite3.connect(
                path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise OutputError(f"state_dir: cannot use the outbox database {path}: {exc}") from exc
        return db

    def next_seq(self) -> int:
        """Take the next sequence number (durable), for publishers without an outbox row."""
        with self._transaction() as db:
            seq = self._take_seq(db)
        self._issued(seq)
        return seq

    def append(self, message: Mapping[str, Any]) -> Entry:
        """Store `message` with the next `seq` (set in it) and evict the oldest if full."""
        with self._transaction() as db:
            entry = encode(message, self._take_seq(db))
            db.execute("INSERT INTO outbox (seq, payload) VALUES (?, ?)", entry)
            evicted = self._evict(db)
        self._issued(entry.seq)
        self._count_evictions(evicted)
        return entry

    def insert(self, entries: Sequence[Entry]) -> None:
        """Store entries that already carry their seq (held in memory while the database
        could not be written), in one transaction; evict the oldest if full."""
        if not entries:
            return
        with self._transaction() as db:
            db.executemany("INSERT INTO outbox (seq, payload) VALUES (?, ?)", entries)
            self._raise_seq_counter(db, max(e.seq for e in entries))
            evicted = self._evict(db)
        self._count_evictions(evicted)

    def take_seq_in_memory(self) -> int:
        """The next seq for a transcript the database cannot take now.  The database's
        counter catches up on its next write; until then the mark file keeps the number
        from being issued again after a restart (best effort: logged if it fails)."""
        with self._lock:
            self._last_seq += 1
            self._mark.write(self._last_seq)
            return self._last_seq

    def sync_seq(self) -> None:
        """Bring the database's seq counter up to the numbers taken in memory (a small
        write: the spool also uses it to learn that the disk can be written again)."""
        with self._transaction() as db:
            self._raise_seq_counter(db, self._last_seq)

    def pending(self, after_seq: int = 0, limit: int = 100) -> list[Entry]:
        """Waiting transcripts with seq > after_seq, oldest first."""
        rows = self._read("SELECT seq, payload FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?", after_seq, limit)
        return [Entry(seq, text) for seq, text in rows]

    def remove(self, seq: int) -> bool:
        """Forget a delivered transcript; False if it was not there (already evicted)."""
        with self._transaction() as db:
            return db.execute("DELETE FROM outbox WHERE seq = ?", (seq,)).rowcount > 0

    def remove_all(self, seqs: Iterable[int]) -> None:
        """Forget delivered transcripts, in one transaction."""
        with self._transaction() as db:
            db.executemany("DELETE FROM outbox WHERE seq = ?", ((seq,) for seq in seqs))

    def __len__(self) -> int:
        return self._read("SELECT COUNT(*) FROM outbox")[0][0]

    @property
    def evicted_total(self) -> int:
        return self._read("SELECT value FROM counters WHERE name = 'evicted'")[0][0]

    def stats(self) -> dict[str, int]:
        return {"depth": len(self), "evicted": self.evicted_total}

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self._mark.close()

    # -- internals -------------------------------------------------------------------

    def _transaction(self) -> _Transaction:
        return _Transaction(self._lock, self._db, self.path)

    def _read(self, sql: str, *args: Any) -> list[Any]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise OutputError(f"state_dir: outbox {self.path}: {exc}") from exc

    def _take_seq(self, db: sqlite3.Connection) -> int:
        # MAX: numbers taken in memory (take_seq_in_memory) are never issued again
        db.execute("UPDATE counters SET value = MAX(value, ?) + 1 WHERE name = 'seq'", (self._last_seq,))
        return self._counter(db, "seq")

    def _issued(self, seq: int) -> None:
        # after the commit: a rolled-back number is issued again, not skipped (a gap reads as a loss)
        with self._lock:
            self._last_seq = max(self._last_seq, seq)

    @staticmethod
    def _raise_seq_counter(db: sqlite3.Connection, seq: int) -> None:
        db.execute("UPDATE counters SET value = MAX(value, ?) WHERE name = 'seq'", (seq,))

    def _count_evictions(self, evicted: int) -> None:
        if evicted:
            self.evicted += evicted
            log.warning(
                "outbox full (mqtt.outbox_max=%d): dropped the %d oldest undelivered transcript(s)",
                self.max_items,
                evicted,
            )

    def _evict(self, db: sqlite3.Connection) -> int:
        excess = db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] - self.max_items
        if excess <= 0:
            return 0
        db.execute(
            "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox ORDER BY seq LIMIT ?)", (excess,)
        )
        db.execute("UPDATE counters SET value = value + ? WHERE name = 'evicted'", (excess,))
        return excess

    @staticmethod
    def _counter(db: sqlite3.Connection, name: str) -> int:
        return db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()[0]


def check_state_dir(state_dir: Path) -> str:
    """Raise OutputError (naming state_dir) unless the daemon can create and write files in
    `state_dir` (creating it, and its missing parents, first); nothing is written here. Returns
    what it found, for `edgeasr check`."""
    path = Path(state_dir)
    missing = 0
    while True:
        if path.is_symlink() and not path.exists():
            raise OutputError(f"state_dir: {path} is a symbolic link to {os.readlink(path)}, which does not exist")
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            if path.parent == path:
                raise OutputError(f"state_dir: {state_dir}: no part of the path exists") from None
            path, missing = path.parent, missing + 1
            continue
        except OSError as exc:
            raise OutputError(f"state_dir: cannot look at {path}: {exc.strerror or exc}") from exc
        break
    if not stat.S_ISDIR(mode):
        raise OutputError(f"state_dir: {path} is not a directory" + (f" (in {state_dir})" if missing else ""))
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"state_dir: {path} cannot be written by user {_user()}")
    return "writable" if not missing else f"to be created in {path}"


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def _private(path: Path) -> None:
    """The database (transcript text) readable by its owner only, whatever the umask: created
    0600 before SQLite opens it, which gives its -wal and -shm files the same mode; files an
    earlier version left open to others are closed to them."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), path.with_suffix(SEQ_MARK_SUFFIX)):
            if name.exists() and name.stat().st_mode & 0o077:
                name.chmod(0o600)
    except OSError as exc:
        raise OutputError(f"state_dir: cannot create the outbox database {path}: {exc.strerror or exc}") from exc


class _SeqMark:
    """An 8-byte file holding the highest seq taken in memory.  Created (and synced) while
    the disk has room; later overwritten in place, which needs no new block on ext4 or
    tmpfs, so it is still written when the disk is full."""

    _SIZE = 8

    def __init__(self, path: Path) -> None:
        self.path, self.value = path, 0
        self._fd: int | None = None
        self._warned = False
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            log.warning("outbox: cannot create %s (%s): seq may repeat after a crash on a full disk", path, exc)
            return
        try:
            data = os.pread(fd, self._SIZE, 0)
            if len(data) == self._SIZE:
                self.value = int.from_bytes(data, "big")
            else:
                os.pwrite(fd, bytes(self._SIZE), 0)
                os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            log.warning("outbox: cannot use %s (%s): seq may repeat after a crash on a full disk", path, exc)
            return
        self._fd = fd

    def write(self, seq: int) -> None:
        if self._fd is None:
            return
        try:
            os.pwrite(self._fd, seq.to_bytes(self._SIZE, "big"), 0)
            os.fsync(self._fd)
        except OSError as exc:
            if not self._warned:  # once: the spool already reports the failing disk
                log.warning("outbox: cannot write %s (%s): seq may repeat after a crash", self.path, exc)
                self._warned = True
            return
        self.value = seq

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _Transaction:
    """`with`: hold the lock, BEGIN IMMEDIATE, COMMIT (or ROLLBACK on error)."""

    def __init__(self, lock: threading.Lock, db: sqlite3.Connection, path: Path) -> None:
        self._lock, self._db, self._path = lock, db, path

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            self._lock.release()
            raise OutputError(f"state_dir: outbox {self._path}: {exc}") from exc
        return self._db

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        try:
            if exc_type is None:
                self._db.execute("COMMIT")
            else:
                self._db.execute("ROLLBACK")
        except sqlite3.Error as err:
            if exc_type is None:
                raise OutputError(f"state_dir: outbox {self._path}: {err}") from err
        finally:
            self._lock.release()
        if isinstance(exc, sqlite3.Error):
            raise OutputError(f"state_dir: outbox {self._path}: {exc}") from exc
