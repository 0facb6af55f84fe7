"""sd_notify and the progress-gated watchdog, received on a test NOTIFY_SOCKET."""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys

import pytest
from helpers.notify import NotifySocket

from edgeasr.notify import Progress, SystemdNotifier, Watchdog, journal_handler, watchdog_interval_s

# A stand-in daemon: a capture thread and a worker thread mark progress; the worker can
# hang after argv[1] seconds (negative: never); the process runs for argv[2] seconds.
DAEMON_SCRIPT = """
import sys, threading, time
from edgeasr.notify import Progress, SystemdNotifier, Watchdog
stall_after, run_for = float(sys.argv[1]), float(sys.argv[2])
notifier = SystemdNotifier()
progress = Progress("capture", "worker")
stop = threading.Event()

def capture():
    while not stop.wait(0.01):
        progress.mark("capture")

def worker():
    t0 = time.monotonic()
    while not stop.wait(0.02):
        if 0 <= stall_after < time.monotonic() - t0:
            threading.Event().wait()  # hung, like a stuck inference call
        progress.mark("worker")

for target in (capture, worker):
    threading.Thread(target=target, daemon=True).start()
notifier.ready("listening on file input; tiny.en on onnx")
watchdog = Watchdog(notifier, progress)
assert watchdog.start()
time.sleep(run_for)
watchdog.stop()
notifier.stopping()
stop.set()
"""


def run_daemon(notify_socket: NotifySocket, stall_after: float, run_for: float, watchdog_usec: int = 400_000):
    env = dict(os.environ, NOTIFY_SOCKET=str(notify_socket.path), WATCHDOG_USEC=str(watchdog_usec))
    proc = subprocess.Popen(
        [sys.executable, "-c", DAEMON_SCRIPT, str(stall_after), str(run_for)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    received = notify_socket.collect(proc, timeout_s=run_for + 10)
    assert proc.wait(10) == 0, proc.stderr.read()
    return proc, received


def test_ready_status_watchdog_stopping_reach_the_socket(notify_socket):
    proc, received = run_daemon(notify_socket, stall_after=-1, run_for=1.6)
    assert {pid for _, pid, _ in received} == {proc.pid}
    datagrams = [d for _, _, d in received]
    assert datagrams[0] == "READY=1\nSTATUS=listening on file input; tiny.en on onnx"
    assert datagrams[-1] == "STOPPING=1\nSTATUS=stopping: finishing the current speech"
    pings = [t for t, _, d in received if d == "WATCHDOG=1"]
    assert len(pings) >= 6  # every 0.2 s (half of WATCHDOG_USEC) for 1.6 s
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert max(gaps) < 0.4  # never a whole WATCHDOG_USEC without a ping


def test_a_stalled_worker_stops_the_pings(notify_socket):
    _, received = run_daemon(notify_socket, stall_after=0.6, run_for=2.4)
    datagrams = [d for _, _, d in received]
    stalled = next(i for i, d in enumerate(datagrams) if d.startswith("STATUS=stalled"))
    assert datagrams[stalled] == (
        "STATUS=stalled: worker made no progress in the last 0.2 s; watchdog pings withheld"
    )
    assert datagrams[:stalled].count("WATCHDOG=1") >= 3  # healthy at first
    after = datagrams[stalled + 1 :]
    assert "WATCHDOG=1" not in after and after[-1].startswith("STOPPING=1")
    silent_for = received[-1][0] - received[stalled][0]
    assert silent_for > 1.2  # three WATCHDOG_USEC without a ping: systemd would have restarted us


def test_watchdog_interval_honours_watchdog_pid():
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000"}, pid=42) == 15.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"}, pid=42) == 15.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"}, pid=42) is None
    assert watchdog_interval_s({}, pid=42) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "0"}, pid=42) is None


def test_everything_is_a_no_op_outside_systemd():
    notifier = SystemdNotifier(environ={})
    assert not notifier.enabled
    notifier.ready("ready")
    notifier.status("transcribing")
    assert notifier.last_status == "transcribing"
    watchdog = Watchdog(notifier, Progress("worker"), environ={"WATCHDOG_USEC": "1000000"})
    assert not watchdog.enabled and watchdog.start() is False
    assert journal_handler(environ={}) is None


def test_progress_needs_every_stage_to_move():
    progress = Progress("capture", "worker")
    assert not progress() and progress.stalled == ("capture", "worker")
    progress.mark("capture")
    progress.mark("worker")
    assert progress() and progress.stalled == ()
    progress.mark("capture")
    assert not progress() and progress.stalled == ("worker",)
    with pytest.raises(ValueError):
        Progress()


def test_a_vanished_notify_socket_warns_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    notifier = SystemdNotifier()
    notifier.ready("ready")
    notifier.notify("WATCHDOG=1")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "NOTIFY_SOCKET" in warnings[0].getMessage()


def test_journal_handler_under_systemd():
    from systemd import journal

    handler = journal_handler(environ={"INVOCATION_ID": "0123456789abcdef0123456789abcdef"})
    assert isinstance(handler, journal.JournalHandler)
    record = logging.LogRecord("edgeasr.test", logging.INFO, __file__, 1, "hello %s", ("journal",), None)
    handler.emit(record)  # journald is absent here: sd_journal_send drops it without error
