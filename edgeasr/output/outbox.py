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

Thread-safe: one connection guarded by a lock (paho's callbacks delete rows from
paho's network thread while the pipeline appends from its own).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from edgeasr.errors import OutputError

log = logging.getLogger(__name__)

FILENAME = "outbox.sqlite3"
_BUSY_TIMEOUT_S = 5.0  # another process holding the file (a second daemon) fails after this

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY, payload TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters (name, value) VALUES ('seq', 0), ('evicted', 0);
"""


class Entry(NamedTuple):
    seq: int
    text: str  # the message as published (JSON)


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

    @classmethod
    def in_state_dir(cls, state_dir: Path, max_items: int) -> Outbox:
        state_dir = Path(state_dir)
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"state_dir: cannot create {state_dir}: {exc.strerror or exc}") from exc
        return cls(state_dir / FILENAME, max_items)

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
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
            return self._take_seq(db)

    def append(self, message: Mapping[str, Any]) -> Entry:
        """Store `message` with the next `seq` (set in it) and evict the oldest if full."""
        with self._transaction() as db:
            seq = self._take_seq(db)
            record = dict(message)
            record["seq"] = seq
            text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            db.execute("INSERT INTO outbox (seq, payload) VALUES (?, ?)", (seq, text))
            evicted = self._evict(db)
        if evicted:
            self.evicted += evicted
            log.warning(
                "outbox full (mqtt.outbox_max=%d): dropped the %d oldest undelivered transcript(s)",
                self.max_items,
                evicted,
            )
        return Entry(seq, text)

    def pending(self, after_seq: int = 0, limit: int = 100) -> list[Entry]:
        """Waiting transcripts with seq > after_seq, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, payload FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?", (after_seq, limit)
            ).fetchall()
        return [Entry(seq, text) for seq, text in rows]

    def remove(self, seq: int) -> bool:
        """Forget a delivered transcript; False if it was not there (already evicted)."""
        with self._transaction() as db:
            return db.execute("DELETE FROM outbox WHERE seq = ?", (seq,)).rowcount > 0

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]

    @property
    def evicted_total(self) -> int:
        with self._lock:
            return self._counter(self._db, "evicted")

    def stats(self) -> dict[str, int]:
        return {"depth": len(self), "evicted": self.evicted_total}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- internals -------------------------------------------------------------------

    def _transaction(self) -> _Transaction:
        return _Transaction(self._lock, self._db, self.path)

    def _take_seq(self, db: sqlite3.Connection) -> int:
        db.execute("UPDATE counters SET value = value + 1 WHERE name = 'seq'")
        return self._counter(db, "seq")

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
