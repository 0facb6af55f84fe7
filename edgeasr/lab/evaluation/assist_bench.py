"""Speech-to-text services side by side through one real Home Assistant: every clip of the sets
said to the satellite once per service (the order turns each clip, so a busy spell of the
machine slows them alike), judged against what Home Assistant does with the clip's reference
(assist_judge). `edgeasr bench-assist` is the command line.
"""

from __future__ import annotations

import asyncio
import logging
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeasr.errors import ToolMissingError
from edgeasr.lab.evaluation.assist_engines import ENGINES, EngineProcess, edgeasr, faster_whisper
from edgeasr.lab.evaluation.assist_home import AssistHome
from edgeasr.lab.evaluation.assist_judge import markdown, summary
from edgeasr.lab.evaluation.assist_session import AssistSession, heard_json

log = logging.getLogger(__name__)

SAMPLE_SEED = 36  # --sample draws the same clips on every run
FASTER_WHISPER = ("wyoming-faster-whisper[hass]==3.8.1", "av<19")  # av 19 fails every request of 3.8.1


@dataclass(frozen=True)
class Clip:
    dataset: str
    id: str
    reference: str
    path: Path


@dataclass(frozen=True)
class BenchOptions:
    hass_venv: Path
    home: AssistHome
    engines: tuple[str, ...]
    workdir: Path
    bundle: Path | None  # edgeasr's; None: its default
    whisper_venv: Path
    whisper_model: Path
    path: str  # "satellite" or "run"


def read_clips(datasets: list[Path], limit: int, sample: int = 0) -> list[Clip]:
    """Each set's first `limit` clips, or `sample` of them drawn alike on every run (in the
    set's order); all when both are 0."""
    from edgeasr.lab.evaluation.runs import read_set

    clips = []
    for d in datasets:
        rows = read_set(d, limit)
        if 0 < sample < len(rows):
            kept = set(random.Random(SAMPLE_SEED).sample(range(len(rows)), sample))
            rows = [r for i, r in enumerate(rows) if i in kept]
        clips += [Clip(d.name, r["id"], r["reference"], d / r["file"]) for r in rows]
    return clips


def ensure_faster_whisper(venv: Path) -> None:
    """wyoming-faster-whisper 3.8.1 in `venv`, made with this Python when it is not there (PyPI, once)."""
    if (venv / "bin" / "python").is_file():
        return
    log.info("making %s with %s", venv, " ".join(FASTER_WHISPER))
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *FASTER_WHISPER], check=True)
    except subprocess.CalledProcessError as exc:
        raise ToolMissingError(f"cannot install wyoming-faster-whisper into {venv}: {exc}") from exc


def _process(key: str, o: BenchOptions, session: AssistSession) -> EngineProcess:
    engine = ENGINES[key]
    if engine.kind == "edgeasr":
        return edgeasr(engine, o.workdir, o.bundle, session.url, session.token_file)
    return faster_whisper(engine, o.workdir, o.whisper_venv, o.whisper_model, session.url, session.token_file)


async def run_bench(o: BenchOptions, clips: list[Clip]) -> dict[str, Any]:
    from edgeasr.audio.files import load_audio
    from edgeasr.lab.evaluation.satellite import SAMPLE_RATE
    from edgeasr.lab.evaluation.scoring import sentence_normalizer

    norm = sentence_normalizer(o.home.language)
    async with AssistSession(o.hass_venv, o.home, o.workdir) as session:
        pipelines = {key: await session.serve(_process(key, o, session)) for key in o.engines}
        utterances = []
        for n, clip in enumerate(clips):
            pcm = (np.clip(load_audio(clip.path, SAMPLE_RATE), -1.0, 1.0) * 32767).astype(np.int16)
            turn = n % len(o.engines)
            row: dict[str, Any] = {"dataset": clip.dataset, "id": clip.id, "reference": clip.reference,
                                   "engines": {}}
            for key in o.engines[turn:] + o.engines[:turn]:
                oracle, heard, verdict = await session.judged(pcm, clip.reference, pipelines[key], o.path)
                row["oracle"] = heard_json(oracle)
                row["engines"][key] = {**heard_json(heard), "outcome": verdict.outcome, "why": verdict.why,
                                       "exact": norm(heard.text or "") == norm(clip.reference)}
            log.info("%d/%d %s: %s", n + 1, len(clips), clip.id,
                     ", ".join(f"{k} {v['outcome']}" for k, v in row["engines"].items()))
            utterances.append(row)
        release = f"{session.hass.version} (Python of {o.hass_venv})"
    summaries = {ENGINES[k].name: summary([u["engines"][k] for u in utterances]) for k in o.engines}
    return {"home_assistant": release, "path": o.path, "summary": summaries, "table": markdown(summaries),
            "utterances": utterances}


def wrong_actions(report: dict[str, Any]) -> list[str]:
    """Every clip Home Assistant acted on wrongly, per engine: what was heard and done."""
    lines = []
    for u in report["utterances"]:
        for key, e in u["engines"].items():
            if e["outcome"] == "wrong":
                lines.append(f"{key}: {u['dataset']}/{u['id']}: heard {e['text']!r} for {u['reference']!r}: {e['why']}")
    return lines


def main(o: BenchOptions, clips: list[Clip]) -> dict[str, Any]:
    if any(ENGINES[k].kind == "faster-whisper" for k in o.engines):
        ensure_faster_whisper(o.whisper_venv)
    return asyncio.run(run_bench(o, clips))
