"""The neighbours of `edgeasr bench --load`: paused and resumed per load, and gone when the
bench is, however it ends."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgeasr.errors import UsageError
from edgeasr.lab.evaluation.cpu_groups import DEFAULT_WEIGHT, CpuGroups, parse_weight
from edgeasr.lab.evaluation.load import LOADS, STREAM_BYTES, Neighbours, parse_loads

REPO = Path(__file__).resolve().parents[1]
EXIT_WAIT_MS = 10_000
STREAM_WAIT_S = 30.0  # for the streaming neighbour to write its buffer once (a loaded machine)


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
    assert parse_loads("idle,busy1,busy2,wakeful,stream1") == ["idle", "busy1", "busy2", "wakeful", "stream1"]
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


def test_the_streaming_neighbour_holds_its_buffer_and_keeps_writing_it():
    with Neighbours(["stream1"]) as neighbours:
        neighbours.use("stream1")
        (proc,) = neighbours.procs.values()

        def resident() -> int:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            return 1024 * int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])

        deadline = time.monotonic() + STREAM_WAIT_S
        while resident() < STREAM_BYTES and time.monotonic() < deadline:
            time.sleep(0.05)
        assert resident() >= STREAM_BYTES  # written through: every page is resident
        assert proc.poll() is None


def test_neighbours_die_with_a_killed_bench():
    script = ("import json, os, signal\n"
              "from edgeasr.lab.evaluation.load import Neighbours\n"
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


def test_a_cpu_weight_is_a_systemd_weight_and_anything_else_is_refused():
    assert parse_weight("1000") == 1000 and parse_weight("1") == 1 and parse_weight("10000") == 10000
    for bad in ("0", "10001", "-5", "high", ""):
        with pytest.raises(UsageError, match="--cpu-weight"):
            parse_weight(bad)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_cpu_groups_write_the_weight_each_cgroup_version_reads(tmp_path, version):
    """cgroup v2 takes systemd's weight as it is (cpu.weight, the cpu controller switched on for
    the children); v1 takes shares, 1024 for the default weight 100."""
    if version == "v2":
        (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (tmp_path / "cgroup.subtree_control").write_text("memory pids\n")
        base = tmp_path
    else:
        base = tmp_path / "cpu"
        base.mkdir()
    groups = CpuGroups({"ours": 1000, "peer": DEFAULT_WEIGHT}, root=tmp_path)
    groups.place("ours", 4242)
    if version == "v2":
        assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu\n"
        assert (base / "edgeasr-bench-ours" / "cpu.weight").read_text() == "1000\n"
        assert (base / "edgeasr-bench-peer" / "cpu.weight").read_text() == "100\n"
    else:
        assert (base / "edgeasr-bench-ours" / "cpu.shares").read_text() == "10240\n"
        assert (base / "edgeasr-bench-peer" / "cpu.shares").read_text() == "1024\n"
    assert (base / "edgeasr-bench-ours" / "cgroup.procs").read_text() == "4242\n"


def test_cpu_groups_that_cannot_be_made_are_a_usage_error_naming_the_flag(tmp_path):
    (tmp_path / "cpu").write_text("a file where the cpu hierarchy should be")
    with pytest.raises(UsageError, match="--cpu-weight: cannot make cpu cgroups under"):
        CpuGroups({"ours": 1000}, root=tmp_path)


def test_a_process_placed_in_a_cpu_group_runs_in_it_and_the_group_goes_with_close():
    """On this machine's own cgroup tree (as root, as CI runs and `--cpu-weight` needs)."""
    groups = CpuGroups({"ours": 1000})
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        groups.place("ours", child.pid)
        assert any(line.endswith("/edgeasr-bench-ours")
                   for line in Path(f"/proc/{child.pid}/cgroup").read_text().splitlines())
    finally:
        child.kill()
        child.wait()
    groups.close()
    assert not groups.dirs["ours"].exists()
