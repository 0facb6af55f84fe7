"""Neighbour processes that load the machine while a benchmark runs (`edgeasr bench --load`).

A load is a named set of neighbours: `busy1` one CPU-bound spinner pinned to the first core,
`busy2` one spinner on each of the first two cores, `wakeful` one process that wakes every
few milliseconds and works about one (as Home Assistant's event loop and recorder do),
`stream1` one process on the first core that streams a few hundred MB through memory over and
over (so that the last-level cache no longer holds the decoder's weights: a stand-in for a
device whose cache is far smaller than them, as a Raspberry Pi 5's 2 MB), `idle` none. Every neighbour is started once and then paused and resumed (SIGSTOP / SIGCONT), so
that loads can take turns on every utterance as the rows do. Neighbours die with the bench:
the kernel kills them when their parent goes (PR_SET_PDEATHSIG), and `Neighbours.close` ends
them on any ordinary exit.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from edgeasr.errors import UsageError

WAKE_PERIOD_S = 0.005  # a neighbour that wakes every 5 ms ...
WAKE_WORK_S = 0.001  # ... and works 1 ms each time: 20 % of a core, in many short spells
STREAM_BYTES = 256 * 2**20  # the streaming neighbour's buffer: 8x a 32 MB L3, so each pass evicts it
PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Neighbour:
    kind: str  # "spin", "wake" or "stream"
    cpu: int | None  # the core it is pinned to, None: any


LOADS: dict[str, tuple[Neighbour, ...]] = {
    "idle": (),
    "busy1": (Neighbour("spin", 0),),
    "busy2": (Neighbour("spin", 0), Neighbour("spin", 1)),
    "wakeful": (Neighbour("wake", None),),
    "stream1": (Neighbour("stream", 0),),
}


def parse_loads(text: str) -> list[str]:
    """`--load idle,busy1` -> the loads' names, a UsageError naming an unknown one."""
    names = [n for n in text.split(",") if n]
    for name in names:
        if name not in LOADS:
            raise UsageError(f"--load: {name!r} is not a load ({', '.join(LOADS)})")
    return names


class Neighbours:
    """Every neighbour the loads ask for, started paused; `use(load)` runs that load's alone."""

    def __init__(self, loads: list[str]) -> None:
        self.loads = {name: LOADS[name] for name in loads}
        wanted = sorted({n for name in loads for n in LOADS[name]}, key=lambda n: (n.kind, n.cpu or 0))
        cores = os.cpu_count() or 1
        self.procs: dict[Neighbour, subprocess.Popen] = {}
        try:
            for n in wanted:
                cpu = None if n.cpu is None else n.cpu % cores
                cmd = [sys.executable, "-m", "edgeasr.lab.evaluation.load", n.kind, str(os.getpid())]
                proc = subprocess.Popen(cmd + ([] if cpu is None else [str(cpu)]), stdout=subprocess.PIPE,
                                        text=True)
                self.procs[n] = proc
                assert proc.stdout is not None  # PIPE
                proc.stdout.readline()  # "ready": it dies with us from here on
                proc.send_signal(signal.SIGSTOP)
        except BaseException:
            self.close()
            raise

    def use(self, load: str) -> None:
        """Resume the load's neighbours and pause every other."""
        running = set(self.loads[load])
        for n, proc in self.procs.items():
            proc.send_signal(signal.SIGCONT if n in running else signal.SIGSTOP)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a paused process ends only once resumed
                proc.terminate()
        for proc in self.procs.values():
            if proc.stdout is not None:
                proc.stdout.close()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> Neighbours:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _die_with(parent: int) -> None:
    """Be killed by the kernel when the parent exits, even if it is killed itself."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it went before the line above ran
        sys.exit(0)


def spin() -> None:
    while True:
        pass


def wake(clock=time.monotonic) -> None:
    while True:
        until = clock() + WAKE_WORK_S
        while clock() < until:
            pass
        time.sleep(WAKE_PERIOD_S - WAKE_WORK_S)


def stream() -> None:
    import numpy as np

    buffer = np.ones(STREAM_BYTES // 4, np.float32)
    while True:
        buffer += 1.0  # reads and writes every byte


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="a neighbour process of `edgeasr bench --load`")
    p.add_argument("kind", choices=("spin", "wake", "stream"))
    p.add_argument("parent", type=int)
    p.add_argument("cpu", type=int, nargs="?")
    args = p.parse_args(argv)
    _die_with(args.parent)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print("ready", flush=True)
    {"spin": spin, "wake": wake, "stream": stream}[args.kind]()


if __name__ == "__main__":
    main()
