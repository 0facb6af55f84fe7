"""A Wyoming session's lane counts only the audio that really waits: a client that sends its
audio as fast as it can, while the worker is busy elsewhere, is not refused for the speculative
decodes its own pauses started and its speech then made stale."""

from __future__ import annotations

import threading

import numpy as np

from edgeasr.stages import SAMPLE_RATE, Transcription
from edgeasr.worker import Job, Overflow, Worker
from edgeasr.wyoming.session import Session, SessionOptions

FRAME_MS = 30
MAX_AUDIO_S = 10.0
WINDOW_S = 8.0


class Loud:
    """A detector that hears speech where the frame is loud: the test's audio says where."""

    def is_speech(self, frame: np.ndarray) -> bool:
        return bool(np.abs(frame).max() > 1000)


def speech_with_pauses(seconds: float, every_s: float, pause_s: float) -> bytes:
    """16-bit mono at 16 kHz: a tone, with a pause of `pause_s` every `every_s` seconds."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    tone = 0.3 * np.sin(2 * np.pi * 220 * t)
    tone[(t % every_s) > every_s - pause_s] = 0.0
    return (tone * 32767).astype("<i2").tobytes()


def test_a_fast_client_with_pauses_is_not_refused_while_the_worker_is_busy():
    hold = threading.Event()
    worker = Worker(engine=None).start()
    worker.lane("busy", 60, Overflow.BLOCK).submit(Job(lambda e, s: hold.wait(10), 1.0))
    lane = worker.lane("wyoming", 3 * MAX_AUDIO_S, Overflow.REJECT)  # as the server makes it
    options = SessionOptions(window_s=10.0, max_audio_s=MAX_AUDIO_S, partial_interval_ms=0,
                             speculate_after_ms=150, frame_ms=FRAME_MS)
    errors: list[Exception] = []
    session = Session(lane, options, Loud(), language=None, on_partial=lambda text: None,
                      on_final=lambda result: None, on_error=errors.append)
    session.start(SAMPLE_RATE, 2, 1)
    pcm = speech_with_pauses(9.0, every_s=0.75, pause_s=0.3)
    chunk = SAMPLE_RATE // 10 * 2
    for i in range(0, len(pcm), chunk):  # as fast as the client can send: nothing runs meanwhile
        session.add(pcm[i : i + chunk], SAMPLE_RATE, 2, 1)
    session.stop()
    # what waits: the last pause's speculation and the final, never the stale ones
    assert lane.seconds <= 2 * 9.0 and not errors
    hold.set()
    assert worker.stop(10)


class Commits:
    """An engine stand-in that commits each window it is given whole, with no text."""

    def transcribe(self, audio, **kwargs) -> Transcription:
        window = min(len(audio), int(WINDOW_S * SAMPLE_RATE))
        return Transcription(text="", segments=(), language="en", windows=1, tokens=0, consumed_samples=window)


def test_the_final_counts_the_audio_it_reads():
    """The final reads the audio not yet committed, so that is what the lane counts for it."""
    worker = Worker(engine=Commits()).start()
    lane = worker.lane("wyoming", 3 * MAX_AUDIO_S, Overflow.REJECT)
    options = SessionOptions(window_s=WINDOW_S, max_audio_s=MAX_AUDIO_S, partial_interval_ms=0,
                             speculate_after_ms=None, frame_ms=FRAME_MS)
    committed = threading.Event()
    session = Session(lane, options, Loud(), language=None, on_partial=lambda text: None,
                      on_final=lambda result: None, on_error=lambda exc: None)
    session.start(SAMPLE_RATE, 2, 1)
    session.add(speech_with_pauses(WINDOW_S + 1.5, every_s=1.0, pause_s=0.2), SAMPLE_RATE, 2, 1)
    lane.submit(Job(lambda e, s: committed.set(), 0.0))  # after the commit the audio started
    assert committed.wait(10)
    hold = threading.Event()
    worker.lane("busy", 60, Overflow.BLOCK).submit(Job(lambda e, s: hold.wait(10), 1.0))
    session.stop()
    assert lane.seconds == 1.5  # not the request's 9.5 s
    hold.set()
    assert worker.stop(10)
