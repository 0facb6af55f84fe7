"""The daemon's start under systemd when the embedded default is not prepared: it asks for more
time (EXTEND_TIMEOUT_USEC) before building it, and asks nothing when a bundle is named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.notify import NotifySocket

from edgeasr.commands.run import PREPARE_START_BUDGET_S

REPO = Path(__file__).resolve().parents[1]


def start(notify_socket: NotifySocket, *settings: str) -> tuple[int, list[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "edgeasr", "--input", "-", *settings], cwd=REPO,
                            env={**os.environ, "NOTIFY_SOCKET": str(notify_socket.path)},
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    received = notify_socket.collect(proc, timeout_s=60)
    return proc.wait(10), [datagram for _, _, datagram in received]


def test_a_start_that_must_prepare_the_default_asks_for_more_time(notify_socket, tmp_path):
    state = tmp_path / "state"
    state.write_text("")  # a file: the build fails at once, after the request was sent
    code, datagrams = start(notify_socket, "--set", f"state_dir={state}")
    assert code == 73  # state_dir: cannot create .../models
    assert datagrams == [f"EXTEND_TIMEOUT_USEC={PREPARE_START_BUDGET_S * 1_000_000}\n"
                         "STATUS=preparing the default model bundle (first use)"]


def test_a_start_with_a_named_bundle_asks_nothing(notify_socket, tmp_path):
    code, datagrams = start(notify_socket, "--set", f"model.path={tmp_path / 'no-bundle'}")
    assert code == 66
    assert datagrams == []
