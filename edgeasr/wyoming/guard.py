"""Who may connect to the Wyoming server and how much of it a client may hold: the allow-list
(`wyoming.allow`), the connection cap (`wyoming.max_connections`) and a log that a flood of
bad clients cannot fill.

The protocol has no authentication (neither have Home Assistant's own Wyoming services), so
the address is the only thing to go by. At the cap a new connection makes room by closing a
connection that holds no session, taken from the address that holds the most of them and,
there, the one idle longest: one noisy device cannot lock Home Assistant out, and a new
client is refused only while every connection is transcribing.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Protocol

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def client_address(peer: Any) -> IpAddress | None:
    """A TCP peer's IP address (an IPv4 address mapped into IPv6 as IPv4); None for a unix
    socket's peer, which the file's permissions admit."""
    if not isinstance(peer, tuple) or not peer:
        return None
    try:
        address = ipaddress.ip_address(peer[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class AllowList:
    def __init__(self, networks: Iterable[str]) -> None:
        self.networks = [ipaddress.ip_network(n, strict=False) for n in networks]

    def allows(self, address: IpAddress | None) -> bool:
        return address is None or any(address in net for net in self.networks)


class Connection(Protocol):
    address: IpAddress | None
    last_progress: float  # monotonic

    @property
    def in_session(self) -> bool: ...


def room_from(connections: Iterable[Connection]) -> Connection | None:
    """The connection to close for a new one: none in a session, from the address holding the
    most connections, idle longest there. None when every connection is in a session."""
    idle = [c for c in connections if not c.in_session]
    if not idle:
        return None
    per_address = Counter(c.address for c in idle)
    return min(idle, key=lambda c: (-per_address[c.address], c.last_progress))


class LogLimit:
    """At most `burst` lines every `period_s`; the lines over it are counted, and the count is
    logged once the period is over (`flush`, from the server's heartbeat). A flood of bad
    clients costs a line every period, not a line each."""

    def __init__(self, log: logging.Logger, burst: int = 20, period_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.burst, self.period_s, self.clock = log, burst, period_s, clock
        self._start = clock()
        self._lines = 0
        self.suppressed = 0

    def __call__(self, level: int, message: str, *args: Any) -> None:
        self.flush()
        if self._lines < self.burst:
            self._lines += 1
            self.log.log(level, message, *args)
        else:
            self.suppressed += 1

    def flush(self) -> None:
        now = self.clock()
        if now - self._start < self.period_s:
            return
        if self.suppressed:
            self.log.warning("Wyoming: %d more client problems in the last %.0f s (not logged one by one)",
                             self.suppressed, now - self._start)
        self._start, self._lines, self.suppressed = now, 0, 0
