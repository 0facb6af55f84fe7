"""A free TCP port on loopback, for a server a test starts (Mosquitto, the daemon's Wyoming
server, the stand-in Supervisor, an in-process Wyoming server)."""

from __future__ import annotations

import random
import socket

HOST = "127.0.0.1"

# Below the kernel's ephemeral range (32768+ by default): no outgoing connection and no `bind(0)`
# of a concurrent test run takes the port between this call and the server's own bind, nor while
# a server that keeps its port (a broker restarted) is down.
_PORTS = range(20000, 32768)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, below the ephemeral range; the server
    binds it itself (a race with another test run is unlikely, not impossible: 12,000 ports)."""
    for port in random.sample(_PORTS, 200):
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port on 127.0.0.1 below the ephemeral range")
