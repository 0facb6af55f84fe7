"""The neighbours of `edgeasr bench --load`: paused and resumed per load, and gone when the
bench is, however it ends."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgeasr.errors import UsageError
from edgeasr.evaluation.load import LOADS, Neighbours, parse_loads

REPO = Path(__file__).resolve().parents[1]
EXIT_WAIT_MS = 10_000


def _state_change(pid: int, flag: int) -> int:
    """Block until the child stops or continues (`flag`): the signal's code (CLD_*)."""
    info = os.waitid(os.P_PID, pid, flag)
    assert info is not None
    return info.si_code


def _exits(pid: int) -> bool:
    """Whether the process (not necessarily our child) has exited within EXIT_WAIT_MS."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(EXIT_WAIT_MS))
    finally:
        os.close(fd)


def test_loads_are_named_and_an_unknown_one_is_refused():
    assert parse_loads("idle,busy1,busy2,wakeful") == ["idle", "busy1", "busy2", "wakeful"]
    assert LOADS["idle"] == () and len(LOADS["busy2"]) == 2
    with pytest.raises(UsageError, match="'busy9'"):
        parse_loads("idle,busy9")


def test_each_load_runs_its_neighbours_alone_and_close_ends_them():
    with Neighbours(["busy1", "busy2", "wakeful"]) as neighbours:
        procs = neighbours.procs
        assert len(procs) == 3  # busy1's spinner is busy2's first
        for proc in procs.values():  # started paused
            assert _state_change(proc.pid, os.WSTOPPED) == os.CLD_STOPPED
        neighbours.use("busy2")
        for n, proc in procs.items():
            if n.kind == "spin":
                assert _state_change(proc.pid, os.WCONTINUED) == os.CLD_CONTINUED
        assert all(proc.poll() is None for proc in procs.values())
        neighbours.use("wakeful")
        for n, proc in procs.items():
            code = _state_change(proc.pid, os.WCONTINUED if n.kind == "wake" else os.WSTOPPED)
            assert code == (os.CLD_CONTINUED if n.kind == "wake" else os.CLD_STOPPED)
    assert all(proc.returncode is not None for proc in procs.values())


def test_neighbours_die_with_a_killed_bench():
    script = ("import json, os, signal\n"
              "from edgeasr.evaluation.load import Neighbours\n"
              "n = Neighbours(['busy2', 'wakeful'])\n"
              "n.use('busy2')\n"
              "print(json.dumps([p.pid for p in n.procs.values()]), flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env=dict(os.environ), check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pids = json.loads(proc.stdout)
    assert len(pids) == 3
    assert all(_exits(pid) for pid in pids)
