"""The client side of the Wyoming protocol the product speaks: `describe`, the add-on's sign that
its server answers (commands/addon.py). The benches' timed requests are the lab's
(edgeasr/lab/evaluation/wyoming_client.py)."""

from __future__ import annotations

import asyncio


async def describe(uri: str, timeout_s: float) -> dict:
    """The server's `info` answer to `describe` (its data: asr programs, ...), as Home
    Assistant asks before it adds a Wyoming service; TimeoutError or OSError when none comes."""
    from wyoming.client import AsyncClient
    from wyoming.info import Describe, Info

    async def ask() -> dict:
        async with AsyncClient.from_uri(uri) as client:
            await client.write_event(Describe().event())
            while True:
                event = await client.read_event()
                if event is None:
                    raise ConnectionResetError(f"{uri} closed the connection without an answer to describe")
                if Info.is_type(event.type):
                    return event.data

    return await asyncio.wait_for(ask(), timeout_s)
