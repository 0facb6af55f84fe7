"""A real Home Assistant core judging commands said to a satellite (edgeasr.lab.evaluation's Assist
harness): where its virtualenv is, the home it runs, and the commands said to it. For
tests/test_assist_real.py and tests/test_addon_image.py."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeasr.audio.files import load_audio
from edgeasr.lab.evaluation.satellite import SAMPLE_RATE
from helpers import REPO

HOME = REPO / "tests" / "data" / "assist-home.yaml"
DEV_COMMANDS = REPO.parent / "shared" / "eval" / "dev-commands"
HASS_VENV = Path(os.environ.get("EDGEASR_TEST_HASS_VENV", REPO / ".venv-homeassistant"))
PATH = "satellite"  # every clip said to the satellite, as a real one says it
LEAD = 0.3  # silence before a spoken command, as in the command sets
# said by piper: a satellite's commands that need its device (timers, its area) to be understood
SPOKEN = {
    "timer_5_minutes": "set a timer for 5 minutes",
    "pause": "pause",
    "next_track": "next track",
    "temperature": "what's the temperature",
    "lights_on": "turn on the lights",
    "lock_front_door": "lock the front door",
    # what once went wrong: a duration of two units, a list's item inside a sentence
    "timer_3_hours_10": "set a timer for 3 hours and 10 minutes",
    "shopping_list": "add apples to my shopping list",
    "volume": "set the volume to 50 percent",
    "pause_timer": "pause timer",  # a running timer first (assist_session.preparation)
}

@dataclass(frozen=True)
class Clip:
    id: str
    reference: str
    pcm: np.ndarray


def dev_clips() -> list[tuple[str, str, Path]]:
    """The recorded commands of ../shared/eval/dev-commands: (id, reference, file)."""
    with (DEV_COMMANDS / "manifest.tsv").open(newline="") as f:
        return [(r["id"], r["reference"], DEV_COMMANDS / r["file"])
                for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


def pcm16(audio: np.ndarray) -> np.ndarray:
    """float32 audio as int16, clipped to full scale."""
    return (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)


def command_clips() -> list[Clip]:
    """Every command the Assist tests say to the satellite: the recorded ones, then SPOKEN said
    by piper after LEAD of silence."""
    from edgeasr.models.voices import Speakers, Voice

    clips = [Clip(i, ref, pcm16(load_audio(path, SAMPLE_RATE))) for i, ref, path in dev_clips()]
    speakers, voice = Speakers(), Voice("piper", "en_US-joe-medium", 1.0, 0.667)
    lead = np.zeros(int(LEAD * SAMPLE_RATE), np.float32)
    clips += [Clip(i, text, pcm16(np.concatenate([lead, speakers.say(text, voice)]))) for i, text in SPOKEN.items()]
    return clips
