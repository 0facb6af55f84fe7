"""What systemd does with NOTIFY_SOCKET, for the tests of the daemon's sd_notify messages; the
fixture `notify_socket`: one in the test's tmp_path."""

from __future__ import annotations

import socket
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest


class NotifySocket:
    """What systemd does with NOTIFY_SOCKET: an AF_UNIX datagram socket, sender pid attached."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(str(path))

    def collect(self, proc: subprocess.Popen, timeout_s: float,
                until: Callable[[list[str]], bool] | None = None) -> list[tuple[float, int, str]]:
        """(receive time, sender pid, datagram) until the process has exited and what it sent is
        read, or `until` holds for the datagrams so far, or `timeout_s` has passed."""
        received: list[tuple[float, int, str]] = []
        deadline = time.monotonic() + timeout_s
        self.sock.settimeout(0.05)
        while time.monotonic() < deadline and not (until and until([m for _, _, m in received])):
            try:
                data, ancdata, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(struct.calcsize("iii")))
            except TimeoutError:
                if proc.poll() is not None:
                    break
                continue
            pid = next(
                struct.unpack("iii", d[:12])[0] for lvl, typ, d in ancdata if typ == socket.SCM_CREDENTIALS
            )
            received.append((time.monotonic(), pid, data.decode()))
        return received

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path):
    """A NotifySocket at tmp_path/notify.sock (NOTIFY_SOCKET for the daemon), closed after."""
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()
