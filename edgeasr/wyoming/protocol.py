"""Wyoming's wire format read with a bound on everything: a header line, then `data_length`
bytes of JSON data, then `payload_length` bytes of payload.

The `wyoming` package's reader (`async_read_event`) trusts the lengths a client declares and
answers a bad header like an end of stream; a server on the LAN must not. Here the header
line is read with a length limit, its JSON must be an object with a string `type` and
lengths that are non-negative integers, and the lengths are checked against their caps
before a byte of data or payload is read. Each fault is a `ProtocolError` saying what was
wrong, for the client's `error` event and one log line. Events are the library's `Event`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from wyoming.event import Event

HEADER_LIMIT = 64 * 1024  # the longest header line (the StreamReader's limit)
MAX_DATA_BYTES = 64 * 1024  # Home Assistant's events carry a few hundred bytes of data
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024  # an audio-chunk: 2 min of 16 kHz 16-bit mono, 11 s at 48 kHz stereo 32-bit
MAX_TYPE_CHARS = 64


class ProtocolError(Exception):
    """What the client sent is not a Wyoming event, or is larger than allowed."""

    code = "malformed"


class TooLarge(ProtocolError):
    code = "too-large"


class Disconnected(Exception):
    """The client closed the connection in the middle of an event."""


@dataclass
class Head:
    """An event before its payload: the type, the data (header's and data part's merged)."""

    type: str
    data: dict[str, Any]
    payload_length: int


async def read_head(reader: asyncio.StreamReader) -> Head | None:
    """The next event's header and data, or None at a clean end of stream (between events)."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise Disconnected(f"closed in the middle of an event header ({len(exc.partial)} bytes)") from None
    except asyncio.LimitOverrunError:
        raise TooLarge(f"event header longer than {HEADER_LIMIT} bytes") from None
    header = _json_object(line, "event header")
    kind = header.get("type")
    if not isinstance(kind, str) or not 0 < len(kind) <= MAX_TYPE_CHARS:
        raise ProtocolError("event header without a `type` (a string of 1..64 characters)")
    data = header.get("data")
    if data is None:
        data = {}
    elif not isinstance(data, dict):
        raise ProtocolError(f"{kind}: `data` is not a JSON object")
    data_length = _length(header, "data_length", kind, MAX_DATA_BYTES)
    payload_length = _length(header, "payload_length", kind, MAX_PAYLOAD_BYTES)
    if data_length:
        data = {**data, **_json_object(await _read_exactly(reader, data_length, kind, "data"), f"{kind}: data")}
    return Head(kind, data, payload_length)


async def read_payload(reader: asyncio.StreamReader, head: Head) -> bytes | None:
    if not head.payload_length:
        return None
    return await _read_exactly(reader, head.payload_length, head.type, "payload")


def event(head: Head, payload: bytes | None) -> Event:
    return Event(type=head.type, data=head.data, payload=payload)


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        reason = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else "not JSON"
        raise ProtocolError(f"{what} is {reason} (not a Wyoming event)") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} is a JSON {_json_kind(value)}, not an object (not a Wyoming event)")
    return value


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(value), "value")


def _length(header: dict[str, Any], key: str, kind: str, cap: int) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"{kind}: `{key}` is {_json_kind(value)} {str(value)[:40]!r}, not a byte count")
    if value > cap:
        raise TooLarge(f"{kind}: `{key}` {value} is over the limit of {cap} bytes")
    return value


async def _read_exactly(reader: asyncio.StreamReader, n: int, kind: str, what: str) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as exc:
        raise Disconnected(f"{kind}: closed after {len(exc.partial)} of the {n} bytes of its {what}") from None
