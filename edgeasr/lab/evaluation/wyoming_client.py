"""The benches' Wyoming client, as Home Assistant speaks the protocol: one request sent and timed
(`request`), for `edgeasr bench-wyoming` (wyoming_servers.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from edgeasr.wyoming.connection import FINAL_TIMEOUT_S


@dataclass
class Exchange:
    """One request as a Wyoming client saw it (times from the monotonic clock)."""

    text: str | None = None
    error: str | None = None
    chunks: int = 0  # transcript-chunk events before audio-stop
    first_chunk_s: float | None = None  # after the first audio was sent
    stop_to_transcript_s: float | None = None


async def request(uri: str, pcm: bytes, *, rate: int, width: int, channels: int, chunk_s: float,
                  realtime: bool, timeout_s: float = FINAL_TIMEOUT_S, names: list[str] | None = None) -> Exchange:
    """Send one utterance as Home Assistant does (transcribe with `names` as its
    transcript_names, audio-start, chunks of chunk_s, at real time or at once, audio-stop) and
    time what comes back."""
    from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStop
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncClient
    from wyoming.error import Error

    out = Exchange()
    step = max(1, int(chunk_s * rate)) * width * channels
    async with AsyncClient.from_uri(uri) as client:
        await client.write_event(Transcribe(transcript_names=names or None).event())
        await client.write_event(AudioStart(rate=rate, width=width, channels=channels).event())
        t0 = time.monotonic()
        reader = asyncio.ensure_future(client.read_event())
        for i in range(0, len(pcm), step):
            await client.write_event(AudioChunk(rate=rate, width=width, channels=channels,
                                                audio=pcm[i : i + step]).event())
            while realtime and reader.done():
                event = reader.result()
                if event is not None and TranscriptChunk.is_type(event.type):
                    out.chunks += 1
                    out.first_chunk_s = out.first_chunk_s or time.monotonic() - t0
                reader = asyncio.ensure_future(client.read_event())
            if realtime:
                await asyncio.sleep(t0 + (i + step) / (rate * width * channels) - time.monotonic())
        await client.write_event(AudioStop().event())
        stopped = time.monotonic()
        while True:
            event = await asyncio.wait_for(reader, timeout_s)
            if event is None or TranscriptStop.is_type(event.type):
                break
            if Transcript.is_type(event.type):
                out.text = Transcript.from_event(event).text
                out.stop_to_transcript_s = time.monotonic() - stopped
                break
            elif Error.is_type(event.type):
                out.error = Error.from_event(event).text
                break
            reader = asyncio.ensure_future(client.read_event())
    return out
