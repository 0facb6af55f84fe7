"""CPU weights for the bench's processes (`edgeasr bench --load ... --cpu-weight N`).

On a Pi, edgeasr, Home Assistant and the other services each run in a cgroup of their own, and
the kernel shares the CPU between those groups by weight, not between their threads. The bench
puts ours, the peer's row and the neighbours each in a cpu cgroup of its own: ours at the
weight asked for, the others at systemd's default. cgroup v2 (`cpu.weight`) and v1
(`cpu.shares`) are both written; it needs root.
"""

from __future__ import annotations

import logging
from pathlib import Path

from edgeasr.errors import UsageError

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
DEFAULT_WEIGHT = 100  # systemd's CPUWeight= when a unit sets none
MAX_WEIGHT = 10000  # systemd's CPUWeight= range is 1..10000
V1_SHARES_PER_WEIGHT = 1024 / DEFAULT_WEIGHT  # v1's default cpu.shares, 1024, is v2's weight 100
PREFIX = "edgeasr-bench"


def parse_weight(text: str) -> int:
    """`--cpu-weight 1000` -> 1000, a UsageError naming the flag for anything else."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_WEIGHT:
        raise UsageError(f"--cpu-weight: {text!r} is not a weight from 1 to {MAX_WEIGHT} (systemd's CPUWeight=)")
    return int(text)


class CpuGroups:
    """One cpu cgroup per name, each at its weight; `place` moves a process into one."""

    def __init__(self, weights: dict[str, int], root: Path = CGROUP_ROOT) -> None:
        self.v2 = (root / "cgroup.controllers").is_file()
        self.base = root if self.v2 else root / "cpu"
        self.dirs = {name: self.base / f"{PREFIX}-{name}" for name in weights}
        try:
            if self.v2 and "cpu" not in (root / "cgroup.subtree_control").read_text().split():
                (root / "cgroup.subtree_control").write_text("+cpu\n")
            for name, weight in weights.items():
                self.dirs[name].mkdir(exist_ok=True)
                if self.v2:
                    (self.dirs[name] / "cpu.weight").write_text(f"{weight}\n")
                else:
                    (self.dirs[name] / "cpu.shares").write_text(f"{round(weight * V1_SHARES_PER_WEIGHT)}\n")
        except OSError as exc:
            raise UsageError(f"--cpu-weight: cannot make cpu cgroups under {self.base} ({exc.strerror or exc}): "
                             "it needs root and the cpu controller") from exc

    def place(self, name: str, pid: int) -> None:
        (self.dirs[name] / "cgroup.procs").write_text(f"{pid}\n")

    def __enter__(self) -> CpuGroups:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove the groups; one that still holds a process (its bench child did not end) stays,
        and the log names it."""
        for path in self.dirs.values():
            try:
                path.rmdir()
            except OSError as exc:
                log.warning("cpu cgroup %s left in place: %s", path, exc.strerror or exc)
