"""One real Home Assistant made into a home with a satellite, and commands judged through it.

`async with AssistSession(venv, home, workdir) as session`: Home Assistant started on a free
loopback port with a fresh configuration, onboarded, the home made (assist_setup), the satellite
serving and added in the home's first area. Then `serve(process)` starts a Wyoming
speech-to-text server and adds it with its pipeline; `oracle(text)` and `hear(pcm, pipeline,
text)` run a command from a home put back as it was and prepared for it (`preparation`), and
`judged(...)` says how a clip went (assist_judge).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeasr.errors import UsageError
from edgeasr.lab.evaluation.assist_engines import EngineProcess
from edgeasr.lab.evaluation.assist_hass import Hass, HassProcess, Release, free_port, onboard
from edgeasr.lab.evaluation.assist_home import AssistHome, configuration
from edgeasr.lab.evaluation.assist_judge import Verdict, judge
from edgeasr.lab.evaluation.assist_runs import Heard, Home, run_audio, run_satellite, run_text
from edgeasr.lab.evaluation.assist_setup import SatelliteDevice, add_pipeline, add_satellite, add_wyoming, make_home
from edgeasr.lab.evaluation.satellite import Satellite

log = logging.getLogger(__name__)

SATELLITE_NAME = "edgeasr satellite"
TOKEN_DAYS = 1  # the long-lived token of a home that lives as long as the run


@dataclass(frozen=True)
class Spoken:
    """What the harness itself says to the satellite, in the home's language."""

    cancel_timers: str
    start_timer: str
    pause_timer: str
    pause: str  # a media player


# each read as its intent by Home Assistant 2025.4's sentences (home-assistant-intents 2025.3.28)
# and by the newest (tests/test_assist_judge.py)
SPOKEN = {
    "en": Spoken("cancel all timers", "set a timer for 10 minutes", "pause the timer", "pause"),
    "de": Spoken("stoppe alle Timer", "stelle einen Timer für 10 Minuten", "pausiere den Timer", "pausiere"),
    "fr": Spoken("annule tous les minuteurs", "mets un minuteur de 10 minutes", "mets en pause le minuteur", "pause"),
    "es": Spoken("cancela todos los temporizadores", "pon un temporizador de 10 minutos", "pausa el temporizador",
                 "pausa"),
    "it": Spoken("annulla tutti i timer", "imposta un timer di 10 minuti", "metti in pausa il timer", "pausa"),
    "nl": Spoken("annuleer alle timers", "zet een timer voor 10 minuten", "pauzeer de timer", "pauzeer"),
}
# the commands that act on a running timer, which a reset leaves none of
ON_A_RUNNING_TIMER = frozenset({"HassPauseTimer", "HassTimerStatus", "HassIncreaseTimer", "HassDecreaseTimer",
                                "HassCancelTimer", "HassCancelAllTimers"})


class AssistSession:
    def __init__(self, venv: Path, home: AssistHome, workdir: Path) -> None:
        self.home, self.workdir = home, workdir
        self.spoken = spoken_in(home.language)
        self.port = free_port()
        config, self._resets = configuration(home, self.port)
        self._process = HassProcess(venv, workdir / "hass", config, self.port)
        self._stack = contextlib.AsyncExitStack()
        self.hass: Hass
        self.satellite: Satellite
        self.device: SatelliteDevice
        self.release: Release
        self.token_file = workdir / "ha-token"
        self._home: Home
        self._oracle_pipeline: str | None = None
        self._oracles: dict[str, Heard] = {}

    @property
    def url(self) -> str:
        return self._process.url

    def intent_of(self, reference: str) -> str | None:
        """The intent Home Assistant's sentences find in a clip's reference (the newest sentences
        with the home's names), None where they find none."""
        from edgeasr.home.sentences import sentences_for

        sentences = sentences_for(self.home.vocabulary, self.home.language)
        intent = sentences.recognize(reference) if sentences is not None else None
        return intent.name if intent is not None else None

    async def __aenter__(self) -> AssistSession:
        try:
            await asyncio.to_thread(self._stack.enter_context, self._process)
            token = await asyncio.to_thread(onboard, self.url, self.home.language)
            self.hass = await self._stack.enter_async_context(Hass(self.url, token))
            self.release = Release.parse(self.hass.version)
            ids = await make_home(self.hass, self.home)
            long_lived = await self.hass.call("auth/long_lived_access_token", client_name="edgeasr harness",
                                              lifespan=TOKEN_DAYS)
            self.token_file.write_text(long_lived, "utf-8")
            self.token_file.chmod(0o600)
            self.satellite = await self._stack.enter_async_context(
                Satellite(SATELLITE_NAME, self.home.satellite_area, free_port()))
            self.device = await add_satellite(self.hass, self.satellite.port, ids.areas[self.home.satellite_area])
            await self.satellite.wait_ready()
            self._home = Home(self.hass, list(ids.entities), self._resets, self.satellite, self.spoken.cancel_timers)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def serve(self, process: EngineProcess) -> str:
        """A speech-to-text server started (off the event loop: the satellite answers Home
        Assistant's pings meanwhile) and stopped with the session; its pipeline's id."""
        await asyncio.to_thread(self._stack.enter_context, process)
        return await self.add_stt(process.engine.name, process.port)

    async def add_stt(self, name: str, port: int) -> str:
        """The Wyoming speech-to-text service on 127.0.0.1:`port` and a pipeline with it: its id."""
        stt = await add_wyoming(self.hass, port)
        pipeline = await add_pipeline(self.hass, name, stt, self.home.language, self.release)
        self._oracle_pipeline = self._oracle_pipeline or pipeline
        return pipeline

    async def oracle(self, text: str) -> Heard:
        """What Home Assistant does with `text` said by the satellite (once per text)."""
        if text not in self._oracles:
            assert self._oracle_pipeline is not None, "add_stt first"
            pipeline = self._oracle_pipeline
            self._oracles[text] = await self._measured(lambda: run_text(self.hass, text, pipeline,
                                                                        self.device.device_id), pipeline, text)
        return self._oracles[text]

    async def hear(self, pcm: np.ndarray, pipeline: str, reference: str, path: str = "satellite") -> Heard:
        """A clip (16 kHz mono int16) of `reference` said to the satellite, or sent as its device
        (`path`), from the home the reference needs."""
        if path == "satellite":
            await self.hass.call("assist_pipeline/pipeline/set_preferred", pipeline_id=pipeline)
            return await self._measured(lambda: run_satellite(self.hass, self.satellite, pcm, pipeline,
                                                              self.device), pipeline, reference)
        return await self._measured(lambda: run_audio(self.hass, pcm, pipeline, self.device.device_id), pipeline,
                                    reference)

    async def _measured(self, run, pipeline: str, reference: str) -> Heard:
        await self._home.reset(self.device.device_id, pipeline)
        for text in preparation(self.intent_of(reference), self.spoken):
            await run_text(self.hass, text, pipeline, self.device.device_id)
        before = await self._home.states()
        timers = len(self.satellite.timers)
        heard = await run()
        changes = await self._home.changes(before)
        return dataclasses.replace(heard, changes=changes, timers=self.satellite.timer_events(timers))

    async def judged(self, pcm: np.ndarray, reference: str, pipeline: str, path: str = "satellite"
                     ) -> tuple[Heard, Heard, Verdict]:
        oracle = await self.oracle(reference)
        heard = await self.hear(pcm, pipeline, reference, path)
        return oracle, heard, judge(oracle, heard, reference, self.release.has_timers)


def spoken_in(language: str) -> Spoken:
    """What the harness says in `language`; a clear error for a language it cannot speak."""
    if language not in SPOKEN:
        raise UsageError(f"--home: the harness speaks {', '.join(SPOKEN)}, not {language}")
    return SPOKEN[language]


def preparation(intent: str | None, spoken: Spoken) -> tuple[str, ...]:
    """What the satellite says before a command (its `intent`) that acts on something a reset
    leaves out: a running timer ("pause the timer", "how much time is left"), a paused one or a
    paused player ("resume")."""
    if intent in ON_A_RUNNING_TIMER:
        return (spoken.start_timer,)
    if intent == "HassUnpauseTimer":
        return spoken.start_timer, spoken.pause_timer
    if intent == "HassMediaUnpause":
        return (spoken.pause,)
    return ()


def heard_json(heard: Heard) -> dict[str, Any]:
    return {"text": heard.text, "response": heard.response, "error": heard.error,
            "stop_to_text_ms": heard.stop_to_text_ms, "changes": {k: [v[0], dict(v[1])] for k, v in heard.changes.items()},
            "timers": [list(t) for t in heard.timers]}
