"""The daemon as a Wyoming server in a subprocess: `start_server` for a test that needs its own
settings, and `wyoming_daemon`, one plain server shared by every test that only talks to it."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
MAX_AUDIO_S = 20.0  # wyoming.max_audio_s of every server here: a request of 23 s is over it
START_TIMEOUT_S = 120
# the shared server's open files: an idle daemon holds about 11, and asyncio accepts up to 100
# connections a turn of its loop, two turns before the cap (wyoming.max_connections) has closed
# one; a flood of a few hundred connections runs it out of them unless the cap holds
SHARED_FILE_LIMIT = 256


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    uri: str
    port: int
    log: Path  # the daemon's stderr

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def rss(self) -> float:
        return proc_status(self.pid, "VmRSS")

    def files(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/task"))


def proc_status(pid: int, field: str) -> float:
    """A /proc/<pid>/status field in MB (VmRSS: resident now; VmHWM: the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(field)


def limit_files(n: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


def start_server(tmp: Path, bundle: Path, extra: dict | None = None, env: dict | None = None, *,
                 files: int | None = None) -> Server:
    """The daemon serving Wyoming on a free port (`extra`: more "section.key" settings; `files`:
    its limit of open files), once it accepts connections. stdout is a pipe, stderr a file."""
    port = free_port()
    settings = {"model": {"path": str(bundle)}, "encoder": {"backend": "onnx"}, "input": {"source": "none"},
                "state_dir": str(tmp / "state"),
                "wyoming": {"uri": f"tcp://{HOST}:{port}", "max_audio_s": MAX_AUDIO_S}}
    for key, value in (extra or {}).items():
        section, leaf = key.split(".")
        settings.setdefault(section, {})[leaf] = value
    config = tmp / "edgeasr.yaml"
    config.write_text(yaml.safe_dump(settings))
    log = tmp / "daemon.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "edgeasr", "--config", str(config)], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                                preexec_fn=limit_files(files) if files else None)
    server = Server(proc, f"tcp://{HOST}:{port}", port, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
            return server
        except OSError:
            time.sleep(0.2)
    proc.kill()
    proc.communicate()
    raise AssertionError(f"the Wyoming server did not start:\n{server.log_text()[-3000:]}")


def stop_server(server: Server) -> tuple[str, str]:
    """SIGTERM; the daemon must exit 0. Its stdout and stderr."""
    server.proc.terminate()
    out, _ = server.proc.communicate(timeout=60)
    err = server.log_text()
    assert server.proc.returncode == 0, err[-3000:]
    return out, err


@pytest.fixture(scope="session")
def wyoming_daemon(tiny_default_bundle: Path, tmp_path_factory) -> Iterator[Server]:
    """The daemon as a Wyoming server only: tiny.en as imported by default, wyoming.max_audio_s
    20 s, 160 open files. Shared by the tests that send it requests, attacks included (each of
    those checks that the server recovers); it must stop cleanly, with no traceback logged."""
    server = start_server(tmp_path_factory.mktemp("wyoming"), tiny_default_bundle, files=SHARED_FILE_LIMIT)
    try:
        yield server
    finally:  # the daemon never outlives the run, whatever failed
        _, err = stop_server(server)
    for sign in ("Traceback", "Task exception", "out of system resource"):
        assert sign not in err, err[-3000:]
