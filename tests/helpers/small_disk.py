"""A disk that really fills: a small tmpfs mounted for one test (needs root, as CI runs).

    with small_tmpfs(tmp_path / "disk") as disk:
        ...            # disk.path is the mount point
        disk.fill()    # a filler file takes every free block: writes get ENOSPC
        disk.free()    # the filler is gone

SQLite then fails with its own SQLITE_FULL ("database or disk is full"), in appends,
deletes and commits alike, as on a full SD card. Without root, `cap_pages` gives an outbox's
database SQLite's own limit on its size, with the same SQLITE_FULL past it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from edgeasr.output.outbox import Outbox

_CHUNK = 64 * 1024


class Disk:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave_bytes: int = 0) -> None:
        """Take all free space but `leave_bytes` (rounded down to 4 KiB pages)."""
        budget = self.free_bytes() - leave_bytes
        with open(self.filler, "ab", buffering=0) as f:  # unbuffered: ENOSPC shows here, not at close
            while budget > 0:
                try:
                    written = f.write(b"\0" * min(_CHUNK, budget)) or 0
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                budget -= written
        assert self.free_bytes() <= leave_bytes + 4096

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "2m") -> Iterator[Disk]:
    if os.geteuid() != 0:
        raise RuntimeError("a tmpfs mount needs root (CI runs the tests as root)")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield Disk(path)
    finally:
        # lazy if a test failed with the database still open: the mount must not outlive the test
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(path)], check=True)


def cap_pages(outbox: Outbox, pages: int | None) -> None:
    """SQLite's own limit on the file's size: past it, writes fail with a real SQLITE_FULL."""
    limit = pages if pages is not None else 1_073_741_823
    outbox._db.execute(f"PRAGMA max_page_count = {limit}")


def page_count(outbox: Outbox) -> int:
    return outbox._db.execute("PRAGMA page_count").fetchone()[0]
