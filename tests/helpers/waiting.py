"""Waiting for state another thread or process owns, when it offers no event to wait on."""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_S = 0.02


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0,
               context: Callable[[], str] | None = None) -> None:
    """Call `condition` every 20 ms until it holds; AssertionError once `timeout_s` has passed
    without it (its message: what `context` returns then, such as a log's text). Where there
    is an event (a subscriber's message, a line printed, a future), wait on that instead."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            said = f": {context()}" if context is not None else ""
            raise AssertionError(f"not so within {timeout_s:g} s{said}")
        time.sleep(POLL_S)
