"""A Wyoming request decoded while it arrives reads as `edgeasr transcribe` reads the same audio.

In process: the real engine (tiny.en) and a lane that runs each job as it is submitted, the
way a worker faster than real time does; audio in 100 ms chunks as Home Assistant sends it."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from helpers.engines import make_engine

from edgeasr.audio.vad import make_detector
from edgeasr.config import load_config
from edgeasr.stages import SAMPLE_RATE
from edgeasr.wyoming.session import Result, Session, SessionOptions

pytestmark = pytest.mark.model

CHUNK = SAMPLE_RATE // 10
LONGEST = "ls_test-other_3331-159605-0008"  # 21.5 s: two windows committed while it is spoken


class RunAtOnce:
    """A lane whose jobs run as they are submitted."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.jobs = 0

    def submit(self, job, stop=None) -> list:
        self.jobs += 1
        if not job.cancelled.is_set():
            job.run(self.engine, job.cancelled.is_set)
        return []

    def offer_partial(self, job) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize("keys", [{}, {"decoder.condition_on_previous_text": True}],
                         ids=["calibrated", "prompted"])
def test_a_long_request_committed_window_by_window_reads_as_one_transcription(tiny_bundle, dev_dir, keys):
    engine = make_engine(tiny_bundle, **keys)
    cfg = load_config(None, keys)
    audio, rate = sf.read(dev_dir / "audio" / f"{LONGEST}.wav", dtype="int16")
    assert rate == SAMPLE_RATE
    lane = RunAtOnce(engine)
    results: list[Result] = []
    options = SessionOptions(window_s=engine.bundle.audio.window_s, max_audio_s=60, partial_interval_ms=0,
                             speculate_after_ms=None, frame_ms=cfg.vad.frame_ms)
    session = Session(lane, options, make_detector(cfg.vad), language=None, on_partial=lambda text: None,
                      on_final=results.append, on_error=pytest.fail)  # type: ignore[arg-type]
    session.start(SAMPLE_RATE, 2, 1)
    for i in range(0, len(audio), CHUNK):
        session.add(audio[i : i + CHUNK].tobytes(), SAMPLE_RATE, 2, 1)
    session.stop()

    offline = engine.transcribe(audio.astype(np.float32) / 32768)
    assert offline.windows >= 3
    assert lane.jobs == offline.windows  # a commit per window but the last, then the final
    assert [r.text for r in results] == [" ".join(offline.text.split())]
