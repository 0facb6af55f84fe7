"""The daemon, the command line and other Python children in subprocesses, from the repository's
root: `python -m edgeasr` as a user or systemd starts it, `python -c CODE` for a child that must
have an environment of its own (a private ALSA configuration, say)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import yaml

from helpers import REPO

STREAM_TIMEOUT_S = 240


def run_edgeasr(*args: str, timeout: float = 300, env: dict | None = None,
                prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`edgeasr ARGS` to its end (`prefix`: a wrapper command, such as unshare); text output
    captured; `env`: variables added to this process's."""
    return subprocess.run([*prefix, sys.executable, "-m", "edgeasr", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})})


def write_config(path: Path, settings: dict) -> Path:
    """A config file of dotted keys ({"mqtt.port": 1883, "state_dir": Path(...)}): paths as strings."""
    tree: dict = {}
    for key, value in settings.items():
        node = tree
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = str(value) if isinstance(value, Path) else value
    path.write_text(yaml.safe_dump(tree))
    return path


def start_daemon(config: Path, env: dict | None = None) -> subprocess.Popen:
    """The daemon on `config`, stdout and stderr piped (text); `env`: variables added."""
    return subprocess.Popen([sys.executable, "-m", "edgeasr", "--config", str(config)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def finish(proc: subprocess.Popen, timeout_s: float = STREAM_TIMEOUT_S) -> tuple[str, str]:
    """Wait for the end (AssertionError unless it exits 0 in time); its stdout and stderr."""
    code, out, err = finish_child(proc, timeout_s)
    assert code == 0, err[-3000:]
    return out, err


class Running:
    """The daemon in a subprocess with `output.stdout` on: its transcript lines are read as
    they come, so that a test waits for what it needs instead of for a time."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[dict] = []
        self.err: list[str] = []
        self._cond = threading.Condition()
        self._ended = False  # stdout closed
        self._readers = [threading.Thread(target=self._read_out, daemon=True)]
        if proc.stderr is not None:  # else a file the test reads
            self._readers.append(threading.Thread(target=lambda: self.err.extend(proc.stderr), daemon=True))
        for t in self._readers:
            t.start()

    def _read_out(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self._cond:
                    self.lines.append(json.loads(line))
                    self._cond.notify_all()
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[list[dict]], bool], timeout_s: float = 120) -> list[dict]:
        """The transcripts printed once `predicate` holds for them (or the daemon ended, or the
        time is up: the test checks what it got)."""
        with self._cond:
            self._cond.wait_for(lambda: predicate(self.lines) or self._ended, timeout_s)
            return list(self.lines)

    def wait_lines(self, n: int, timeout_s: float = 120) -> list[dict]:
        """The first `n` transcripts printed (fewer if the daemon ended or the time is up)."""
        return self.wait_for(lambda lines: len(lines) >= n, timeout_s)[:n]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def finish(self, timeout_s: float = STREAM_TIMEOUT_S) -> str:
        """Wait for the end (AssertionError unless it exits 0 in time); its stderr."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"daemon did not finish; stderr:\n{self.stderr()[-3000:]}") from None
        for t in self._readers:
            t.join(10)
        assert self.proc.returncode == 0, self.stderr()[-3000:]
        return self.stderr()

    def stderr(self) -> str:
        return "".join(self.err)


def start_child(code: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """`python -c code args...` from the repository root, with pipes for stdout/stderr."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish_child(proc: subprocess.Popen[str], timeout_s: float = 60) -> tuple[int, str, str]:
    """Wait for the child; returns (exit code, stdout, stderr)."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the child did not finish within {timeout_s:g} s; stderr:\n{err[-3000:]}") from None
    return proc.returncode, out, err


def json_lines(out: str) -> list:
    return [json.loads(line) for line in out.splitlines() if line.startswith(("{", "["))]


def wait_ready(proc: subprocess.Popen[str], timeout_s: float = 30) -> None:
    """Block until the child prints its `ready` line (its stream is running)."""
    import select

    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"child not ready: {line!r}; stderr:\n{proc.communicate()[1]}")
