"""Where a transcript waits for its PUBACK: the durable outbox, or memory while the disk fails.

`add()` never raises because the disk is full or failing: a transcript the outbox cannot
take is held in memory, in seq order, and written to the outbox (with the seq it was
given) as soon as a write succeeds again; the sender retries every second meanwhile.
While the broker is up, held transcripts are sent as they are (`pending()` lists the
outbox's rows, then memory's); a PUBACK removes them from memory.

Order: every transcript in memory is newer than every row on disk (memory is written to
disk before anything new is appended), so `pending()` is in seq order.

Seq while the database cannot be written: the numbers continue from the last one issued
(Outbox.take_seq_in_memory), so the stream stays gapless; they are recorded in a side file
written in place, so a crash before the disk recovers never issues them again.

Bounds and the drop rule: memory holds at most `memory_max` transcripts (MEMORY_MAX,
and never more than mqtt.outbox_max).  When it is full, the OLDEST transcript in memory is
dropped, as the outbox evicts its oldest when full: after a long outage the newest speech
is the most useful.  Rows already on disk are not touched (deleting them needs the disk
that is failing, and they survive a crash).  When memory moves to disk, the outbox's own
bound evicts its oldest rows.  Every drop is counted (`dropped`) and logged; consumers see
a gap in seq.  Transcripts still in memory when the daemon stops are lost and counted too.

A PUBACK whose delete fails is remembered (bounded by mqtt.outbox_max) and the delete is
retried; `pending()` skips that row, so it is not sent twice unless the daemon restarts
first (at least once allows that).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgeasr.errors import OutputError
from edgeasr.output.outbox import Entry, Outbox, encode

log = logging.getLogger(__name__)

# ~1 KB each (JSON of one utterance): 1000 is about 1 MB of RAM, and at a transcript every
# few seconds of continuous speech, about an hour in which to free the disk.  A constant,
# not a key: operators choose how much to keep with mqtt.outbox_max; this only bridges a
# disk failure, and is capped by mqtt.outbox_max so memory never keeps more than disk would.
MEMORY_MAX = 1000


@dataclass(frozen=True)
class SpoolState:
    failing: bool  # the last write to the outbox failed and has not succeeded since
    error: str | None  # why (SQLite's message and the file)
    depth: int  # transcripts waiting on disk (acknowledged rows not counted)
    held_in_memory: int
    dropped: int  # lost: memory full while the disk failed, or still in memory at close
    evicted: int  # the outbox's all-time evictions (mqtt.outbox_max)


class Spool:
    """Transcripts awaiting acknowledgement, on disk when possible, else in memory."""

    def __init__(self, outbox: Outbox, memory_max: int = MEMORY_MAX) -> None:
        self.outbox = outbox
        self.memory_max = max(1, min(memory_max, outbox.max_items))
        self._memory: OrderedDict[int, Entry] = OrderedDict()  # seq -> entry, oldest first
        self._undeleted: OrderedDict[int, None] = OrderedDict()  # acknowledged, delete failed
        self._lock = threading.Lock()  # held across outbox calls: memory and disk change together
        self._error: str | None = None
        self._depth = 0  # last known rows on disk, for when the disk cannot be read
        self._evicted = 0
        self.dropped = 0

    @property
    def failing(self) -> bool:
        return self._error is not None

    def add(self, message: Mapping[str, Any]) -> Entry:
        """Store a transcript (seq set in it); in memory when the outbox cannot take it."""
        with self._lock:
            if self.failing:
                self._write_back()  # older transcripts first: disk stays older than memory
            if not self._memory:
                try:
                    return self.outbox.append(message)
                except OutputError as exc:
                    self._failed(exc)
            entry = encode(message, self.outbox.take_seq_in_memory())
            self._hold(entry)
            return entry

    def pending(self, after_seq: int, limit: int) -> list[Entry]:
        """Up to `limit` waiting transcripts with seq > after_seq, oldest first."""
        with self._lock:
            try:
                # ask for more: acknowledged rows whose delete failed are skipped below
                rows = self.outbox.pending(after_seq, limit + len(self._undeleted))
            except OutputError as exc:
                # nothing this round: sending memory's newer ones now would move the
                # sender's cursor past the unread rows
                self._failed(exc)
                return []
            entries = [e for e in rows if e.seq not in self._undeleted][:limit]
            newer = (e for seq, e in self._memory.items() if seq > after_seq)
            entries += itertools.islice(newer, limit - len(entries))
            return entries

    def acknowledge(self, seq: int) -> None:
        """The broker has the transcript: forget it (the delete is retried if it fails)."""
        with self._lock:
            if self._memory.pop(seq, None) is not None:
                return
            try:
                self.outbox.remove(seq)
            except OutputError as exc:
                self._failed(exc)
                self._undeleted[seq] = None
                if len(self._undeleted) > self.outbox.max_items:
                    self._undeleted.popitem(last=False)  # only sent again after a restart

    def retry(self) -> None:
        """Try the disk again (the sender calls this every second while it fails)."""
        with self._lock:
            if self.failing:
                self._write_back()

    def state(self) -> SpoolState:
        with self._lock:
            return SpoolState(
                failing=self.failing,
                error=self._error,
                depth=self._disk_depth(),
                held_in_memory=len(self._memory),
                dropped=self.dropped,
                evicted=self._evicted,
            )

    def __len__(self) -> int:
        """Transcripts waiting for a PUBACK, on disk and in memory."""
        with self._lock:
            return self._disk_depth() + len(self._memory)

    def save_memory(self) -> int:
        """At close: a last write of memory to disk; what is still held is lost (counted)."""
        with self._lock:
            if self.failing:
                self._write_back()
            lost = len(self._memory)
            if lost:
                self.dropped += lost
                log.error(
                    "outbox: %d transcript(s) held in memory are lost: %s still cannot be written (%s)",
                    lost,
                    self.outbox.path,
                    self._error,
                )
                self._memory.clear()
            return lost

    # -- internals (caller holds self._lock) --------------------------------------------

    def _hold(self, entry: Entry) -> None:
        if len(self._memory) >= self.memory_max:
            oldest, _ = self._memory.popitem(last=False)
            self.dropped += 1
            log.warning(
                "outbox: %d transcripts held in memory (the most while the disk fails): "
                "dropped the oldest, seq=%d (%d dropped so far)",
                self.memory_max,
                oldest,
                self.dropped,
            )
        self._memory[entry.seq] = entry

    def _write_back(self) -> None:
        """Retry the deletes, then move memory to disk; recovered once all of it worked."""
        moved = len(self._memory)
        try:
            if self._undeleted:
                self.outbox.remove_all(self._undeleted)
                self._undeleted.clear()
            self.outbox.insert(list(self._memory.values()))
            self._memory.clear()
            self.outbox.sync_seq()  # a write even when nothing was waiting: proves the disk works
        except OutputError as exc:
            self._failed(exc)
            return
        if self._error is not None:
            log.warning("outbox: %s can be written again; %d transcript(s) moved from memory", self.outbox.path, moved)
            self._error = None

    def _failed(self, exc: OutputError) -> None:
        if self._error is None:
            log.error(
                "%s; transcripts are held in memory (at most %d) until it can be written again",
                exc,
                self.memory_max,
            )
        self._error = str(exc)

    def _disk_depth(self) -> int:
        try:
            self._depth = max(0, len(self.outbox) - len(self._undeleted))
            self._evicted = self.outbox.evicted_total
        except OutputError as exc:
            self._failed(exc)
        return self._depth
