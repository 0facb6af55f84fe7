"""Wyoming's wire format written and read on plain sockets, byte by byte, as a careless or hostile
client on the LAN sends it (the `wyoming` package's own client is helpers.wyoming.transcribe), and
the malformed inputs a server must answer with an `error` event."""

from __future__ import annotations

import json
import socket

from wyoming.event import Event, read_event

from helpers.ports import HOST


def frame(kind: str, data: dict | None = None, payload: bytes = b"") -> bytes:
    """One event in Wyoming's wire format: a header line, its data, its payload."""
    header: dict = {"type": kind}
    body = json.dumps(data).encode() if data else b""
    if body:
        header["data_length"] = len(body)
    if payload:
        header["payload_length"] = len(payload)
    return json.dumps(header).encode() + b"\n" + body + payload


def start16(rate: int = 16000, width: int = 2, channels: int = 1) -> bytes:
    return frame("audio-start", {"rate": rate, "width": width, "channels": channels})


def chunk16(pcm: bytes, rate: int = 16000, width: int = 2, channels: int = 1) -> bytes:
    return frame("audio-chunk", {"rate": rate, "width": width, "channels": channels}, pcm)


def connect(port: int, timeout_s: float = 10.0) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=timeout_s)
    return sock


def events_until_close(sock: socket.socket) -> list[Event]:
    """Every event the server sends until it closes the connection."""
    out = []
    with sock.makefile("rb") as stream:
        try:
            while (ev := read_event(stream)) is not None:
                out.append(ev)
        except (ConnectionError, TimeoutError):
            pass
    return out


def exchange(port: int, data: bytes, *, half_close: bool = True) -> list[Event]:
    """Send `data`, close our sending side (as a client that is done does), read to the end."""
    with connect(port) as sock:
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server closed first (a refused client): what it sent is still read
        return events_until_close(sock)


def codes(events: list[Event]) -> list[str | None]:
    return [e.data.get("code") for e in events if e.type == "error"]


MALFORMED = {
    "a JSON list": b"[1, 2, 3]\n",
    "a JSON string": b'"audio-start"\n',
    "JSON null": b"null\n",
    "no type": b'{"data": {"rate": 16000}}\n',
    "an empty type": b'{"type": ""}\n',
    "data not an object": b'{"type": "transcribe", "data": [1]}\n',
    "data_length a string": b'{"type": "transcribe", "data_length": "12"}\n',
    "payload_length a string": b'{"type": "audio-chunk", "payload_length": "320"}\n',
    "a negative length": b'{"type": "transcribe", "data_length": -5}\n',
    "a float length": b'{"type": "transcribe", "data_length": 1e3}\n',
    "bad UTF-8": b'{"type": "\xff\xfe"}\n',
    "not JSON": b"GET / HTTP/1.1\n",
    "JSON nested past the parser": b"[" * 50_000 + b"\n",
    "an integer of 5000 digits": b'{"type": "x", "data_length": ' + b"9" * 5000 + b"}\n",
    "a header line without end": b'{"type": "' + b"x" * 70_000,
    "data that is not an object": b'{"type": "transcribe", "data_length": 3}\n[1]',
    "a data_length over the cap": b'{"type": "transcribe", "data_length": 2147483648}\n',
    "audio-start rate as a string": frame("audio-start", {"rate": "16000", "width": 2, "channels": 1}),
    "audio-start width 3, rate 0": start16(rate=0, width=3),
    "audio-chunk before audio-start": chunk16(b"\0\0" * 160),
    "audio-stop before audio-start": frame("audio-stop"),
    "a chunk of another format": start16() + chunk16(b"\0" * 320, rate=8000),
    "a language that is a list": frame("transcribe", {"language": ["en"]}),
    "disconnect inside a header's data": b'{"type": "transcribe", "data_length": 100}\n{"lang',
    "disconnect inside a payload": start16() + chunk16(b"\0\0" * 1600)[:-1000],
}
