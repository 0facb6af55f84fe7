"""Commands through a real Home Assistant's Assist pipeline, and what they did to the home.

A clip goes through the satellite (its device's pipeline run, read back from the pipeline's
debug record once the satellite's in-progress sensor is off) or through `assist_pipeline/run`
with the satellite's `device_id` (the same area and timer context, the events as they come).
A text goes from the intent stage with the same device: the oracle. Before each, the home is
put back (assist_home's reset calls, running timers cancelled) and its states read; after each,
what changed is what the command did.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from edgeasr.lab.evaluation.assist_hass import Hass
from edgeasr.lab.evaluation.assist_home import VOLATILE_DOMAINS, WATCHED, Call
from edgeasr.lab.evaluation.assist_setup import SatelliteDevice
from edgeasr.lab.evaluation.satellite import SAMPLE_RATE, SAMPLES_PER_CHUNK, Satellite

log = logging.getLogger(__name__)

RUN_TIMEOUT_S = 60.0  # one command, from its first audio to run-end
SETTLE_S = 5.0  # the home back to its reset states
TRAILING_S = 3.0  # silence after a clip sent over assist_pipeline/run, before its end is sent


@dataclass(frozen=True)
class Heard:
    """One pipeline run: the text, what the agent answered, how long the text took."""

    text: str | None
    response: dict[str, Any] | None  # intent-end's intent_output.response
    error: str | None  # the run's error event (code: message)
    stop_to_text_ms: float | None  # the end of the speech (Home Assistant's VAD, or audio's end) -> stt-end
    changes: dict[str, Any] = field(default_factory=dict)  # entity -> (state, watched attributes) after
    timers: tuple[tuple[Any, ...], ...] = ()  # timer events the satellite got (Satellite.timer_events)


def _stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"]).timestamp()


def heard_from(events: list[dict[str, Any]], audio_end: float | None = None) -> Heard:
    """A Heard from a run's events (type, data, timestamp); `audio_end` (wall clock) when the
    client ended the audio itself without Home Assistant's VAD."""
    by_type = {e["type"]: e for e in events}
    stt_end, vad_end = by_type.get("stt-end"), by_type.get("stt-vad-end")
    text = stt_end["data"]["stt_output"]["text"] if stt_end else None
    intent_end = by_type.get("intent-end")
    response = intent_end["data"]["intent_output"]["response"] if intent_end else None
    error = by_type.get("error")
    latency = None
    end = _stamp(vad_end) if vad_end else audio_end
    if stt_end and end is not None:
        latency = max(0.0, (_stamp(stt_end) - end) * 1000)
    return Heard(text, response, f"{error['data'].get('code')}: {error['data'].get('message')}" if error else None,
                 latency)


class Home:
    """The home's states: put back, read, and compared."""

    def __init__(self, hass: Hass, entities: list[str], resets: tuple[Call, ...], satellite: Satellite,
                 cancel_timers: str) -> None:
        """`cancel_timers`: what cancels every timer, said in the home's language."""
        self.hass, self.entities, self.resets, self.satellite = hass, entities, resets, satellite
        self.cancel_timers = cancel_timers
        self._baseline: dict[str, Any] | None = None

    async def states(self) -> dict[str, Any]:
        watched = set(self.entities) | {c.data.get("entity_id") for c in self.resets if "entity_id" in c.data}
        found = {}
        for s in await self.hass.call("get_states"):
            entity_id = s["entity_id"]
            if entity_id not in watched:
                continue
            domain = entity_id.split(".")[0]
            state = None if domain in VOLATILE_DOMAINS else s["state"]
            found[entity_id] = (state, tuple((a, _plain(s["attributes"].get(a))) for a in WATCHED.get(domain, ())))
        return found

    async def reset(self, device_id: str, pipeline_id: str) -> dict[str, Any]:
        """The home as after the first reset (timers cancelled); its states."""
        if self.satellite.timers and self.satellite.timers[-1]["type"] != "timer-cancelled":
            await run_text(self.hass, self.cancel_timers, pipeline_id, device_id)
        for call in self.resets:
            await self.hass.service(call.domain, call.service, call.data)
        async with self.hass.subscribe("subscribe_events", event_type="state_changed") as events:
            states = await self.states()
            if self._baseline is None:
                self._baseline = states
            deadline = time.monotonic() + SETTLE_S
            while states != self._baseline and time.monotonic() < deadline:
                try:  # a template entity follows its helper a moment later
                    async with asyncio.timeout(deadline - time.monotonic()):
                        await events.get()
                except TimeoutError:
                    break
                states = await self.states()
        return states

    async def changes(self, before: dict[str, Any]) -> dict[str, Any]:
        after = await self.states()
        return {k: v for k, v in after.items() if before.get(k) != v}


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


async def run_text(hass: Hass, text: str, pipeline_id: str, device_id: str | None) -> Heard:
    """The pipeline from the intent stage with `text`, as said by the device."""
    events = []
    async with hass.subscribe("assist_pipeline/run", start_stage="intent", end_stage="intent", input={"text": text},
                              pipeline=pipeline_id, device_id=device_id) as queue:
        async with asyncio.timeout(RUN_TIMEOUT_S):
            while (event := await queue.get())["type"] != "run-end":
                events.append(event)
    return heard_from(events)


async def run_audio(hass: Hass, pcm: np.ndarray, pipeline_id: str, device_id: str) -> Heard:
    """A clip through `assist_pipeline/run` as the device: PCM at real time, then silence until
    Home Assistant's VAD ends the speech (or TRAILING_S ran out: the end is sent)."""
    events: list[dict[str, Any]] = []
    audio = np.concatenate([pcm.astype(np.int16), np.zeros(int(TRAILING_S * SAMPLE_RATE), np.int16)])
    audio_end = None
    async with hass.subscribe("assist_pipeline/run", start_stage="stt", end_stage="intent",
                              input={"sample_rate": SAMPLE_RATE}, pipeline=pipeline_id, device_id=device_id) as queue:
        async with asyncio.timeout(RUN_TIMEOUT_S):
            start_event = await queue.get()
            events.append(start_event)
            prefix = bytes([start_event["data"]["runner_data"]["stt_binary_handler_id"]])
            start = time.monotonic()
            for i in range(0, len(audio), SAMPLES_PER_CHUNK):
                if any(e["type"] in ("stt-vad-end", "error") for e in events):
                    break
                await hass.send_bytes(prefix + audio[i:i + SAMPLES_PER_CHUNK].tobytes())
                await _drain(queue, events, start + (i + SAMPLES_PER_CHUNK) / SAMPLE_RATE)
            else:
                audio_end = time.time()
            await hass.send_bytes(prefix)
            while events[-1]["type"] != "run-end":
                events.append(await queue.get())
    return heard_from(events, audio_end)


async def _drain(queue: asyncio.Queue, events: list, until: float) -> None:
    """Events that come before `until` (monotonic): the pace of a microphone."""
    while (left := until - time.monotonic()) > 0:
        try:
            async with asyncio.timeout(left):
                events.append(await queue.get())
        except TimeoutError:
            return


async def run_satellite(hass: Hass, satellite: Satellite, pcm: np.ndarray, pipeline_id: str,
                        device: SatelliteDevice) -> Heard:
    """A clip said to the satellite; the run read from the pipeline's debug record."""
    async with hass.subscribe("subscribe_events", event_type="state_changed") as states:
        known = {r["pipeline_run_id"] for r in await _debug_runs(hass, pipeline_id)}
        command = await satellite.command(pcm)
        async with asyncio.timeout(RUN_TIMEOUT_S):
            while True:  # the run is over when the satellite is idle again (it may be already)
                runs = [r for r in await _debug_runs(hass, pipeline_id) if r["pipeline_run_id"] not in known]
                if runs:
                    record = await hass.call("assist_pipeline/pipeline_debug/get", pipeline_id=pipeline_id,
                                             pipeline_run_id=runs[-1]["pipeline_run_id"])
                    events = record["events"]
                    if any(e["type"] == "run-end" for e in events):
                        break
                event = await states.get()
                while event["data"]["entity_id"] != device.indicator or _state(event) != device.idle:
                    event = await states.get()
    ended = None if command.voice_stopped else time.time() - (time.monotonic() - command.ended_at)
    return heard_from(events, ended)


def _state(event: dict[str, Any]) -> str | None:
    return (event["data"].get("new_state") or {}).get("state")


async def _debug_runs(hass: Hass, pipeline_id: str) -> list[dict[str, Any]]:
    return list((await hass.call("assist_pipeline/pipeline_debug/list", pipeline_id=pipeline_id))["pipeline_runs"])
