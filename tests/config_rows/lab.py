"""What the rows of tests/test_config_keys.py are made of: a row per config key, and the `Lab`
a row observes its key's effect in (fixtures on demand, engines and transcriptions built once
per configuration, the daemon's own builders)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.audio import as_float

from edgeasr.config import Config, load_config
from edgeasr.stages import SAMPLE_RATE, Intent, SpeechSegment, TextSegment, Transcript, Transcription, Vocabulary

ENGINE_KEYS = ("model.", "encoder.", "decoder.", "output.words")  # what an engine is built from


@dataclass(frozen=True)
class Observed:
    """The key set away from its default does what its comment in config/edgeasr.yaml says."""

    check: Callable[[Lab], None]
    needs: tuple[str, ...] = ()  # pytest markers: model, broker, alsa


@dataclass(frozen=True)
class Unobservable:
    """Why no test can see what the key does (said in a few words)."""

    why: str


Row = Observed | Unobservable


@dataclass
class Rows:
    """A section's rows, registered as they are defined."""

    rows: dict[str, Row] = field(default_factory=dict)

    def observe(self, key: str, *needs: str) -> Callable[[Callable[[Lab], None]], Callable[[Lab], None]]:
        def register(check: Callable[[Lab], None]) -> Callable[[Lab], None]:
            assert key not in self.rows, key
            self.rows[key] = Observed(check, needs)
            return check
        return register

    def cannot(self, key: str, why: str) -> None:
        assert key not in self.rows, key
        self.rows[key] = Unobservable(why)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE), np.int16)


def noise(seconds: float, level: float = 3000.0) -> np.ndarray:
    """White noise (int16): what webrtcvad calls speech and a model does not."""
    return np.random.default_rng(0).normal(0, level, int(seconds * SAMPLE_RATE)).astype(np.int16)


def transcript(text: str = "Turn on the lamp.", intent: Intent | None = None) -> Transcript:
    """A final transcript as the engine hands it to publishers."""
    now = dt.datetime.now(dt.UTC)
    segment = SpeechSegment(np.zeros(SAMPLE_RATE, np.int16), 0, SAMPLE_RATE, now, now + dt.timedelta(seconds=1),
                            speech_end_mono=0.0, speech_frames=30, speech_end_sample=SAMPLE_RATE)
    piece = TextSegment(0.0, 1.0, text, (1, 2, 3), -0.2, 0.01, 1.0)
    return Transcript(str(uuid.uuid4()), segment,
                      Transcription(text, (piece,), "en", 1, 3, SAMPLE_RATE, intent=intent), 12.0)


class Lab:
    """A row's view of the test: fixtures when it asks for them, and what is worth building
    once (engines, transcriptions) kept in `cache` for the module."""

    def __init__(self, request: pytest.FixtureRequest, cache: dict) -> None:
        self.request, self.cache = request, cache

    def fixture(self, name: str) -> Any:
        return self.request.getfixturevalue(name)

    @property
    def tmp(self) -> Path:
        return self.fixture("tmp_path")

    @property
    def bundle(self) -> Path:
        return self.fixture("tiny_bundle")

    def cfg(self, keys: dict[str, Any] | None = None) -> Config:
        """The configuration with these dotted keys (the rest defaults; state in tmp)."""
        return load_config(None, {"state_dir": str(self.tmp / "state"), **(keys or {})})

    def engine(self, keys: dict[str, Any] | None = None, bundle: Path | None = None):
        """The daemon's engine (daemon.engine_for: the configured decoding, the home's sentences)
        for the engine keys among `keys`, on the CPU; built once per configuration."""
        from edgeasr.bundle import load_bundle
        from edgeasr.daemon import engine_for

        path = bundle or self.bundle
        own = {k: v for k, v in (keys or {}).items() if k.startswith(ENGINE_KEYS)}
        name = ("engine", str(path), json.dumps(own, sort_keys=True))
        if name not in self.cache:
            cfg = load_config(None, {"encoder.backend": "onnx", "model.path": str(path), **own})
            self.cache[name] = engine_for(cfg, load_bundle(path), words=cfg.output.words)
        return self.cache[name]

    def transcribe(self, keys: dict[str, Any] | None, audio: np.ndarray, bundle: Path | None = None,
                   vocabulary: Vocabulary = Vocabulary()) -> Transcription:
        """What that engine makes of `audio` (int16), once per configuration and audio."""
        name = ("text", str(bundle), json.dumps(keys or {}, sort_keys=True), audio.tobytes().__hash__(),
                repr(vocabulary))
        if name not in self.cache:
            self.cache[name] = self.engine(keys, bundle).transcribe(as_float(audio), vocabulary=vocabulary)
        return self.cache[name]

    def published(self, keys: dict[str, Any], *transcripts: Transcript) -> list[dict]:
        """The JSON lines the daemon's outputs (daemon.build_outputs) print for `transcripts`."""
        from edgeasr.daemon import build_outputs

        capsys = self.fixture("capsys")
        capsys.readouterr()
        outputs = build_outputs(self.cfg(keys), "whisper-test", "onnx")
        try:
            for t in transcripts:
                for publisher in outputs.publishers:
                    publisher.publish(t)
        finally:
            outputs.close(0.0)
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def frames(audio: np.ndarray, block: int) -> Iterator[np.ndarray]:
    for i in range(0, len(audio), block):
        yield audio[i : i + block]
