"""The pipeline's hand-over from segmenter to engine, with a recording engine."""

from __future__ import annotations

import soundfile as sf

from edgeasr.config import VadOptions
from edgeasr.pipeline import Pipeline, PipelineOptions
from edgeasr.segmenter import Segmenter
from edgeasr.sources import FileSource, StreamClock
from edgeasr.stages import SAMPLE_RATE, TextSegment, Transcription
from test_segmenter import WINDOW_S, sentence_pause_sentence


class RecordingEngine:
    """Takes every segment whole and says so; remembers how it was called."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []  # (samples, final)

    def transcribe(self, audio, *, final: bool = True) -> Transcription:
        self.calls.append((len(audio), final))
        seconds = len(audio) / SAMPLE_RATE
        segment = TextSegment(start=0.0, end=seconds, text=" words", tokens=(1,), avg_logprob=-0.1,
                              no_speech_prob=0.0, compression_ratio=1.0)
        return Transcription(text="words", segments=(segment,), language="en", windows=1, tokens=1,
                             consumed_samples=len(audio))


class ListPublisher:
    def __init__(self) -> None:
        self.payloads: list[dict] = []

    def publish(self, payload: dict) -> None:
        self.payloads.append(payload)

    def close(self, timeout_s: float) -> None:
        pass


def test_a_segment_cut_in_a_pause_is_decoded_as_complete(tmp_path):
    x, _, _ = sentence_pause_sentence()
    sf.write(tmp_path / "two.wav", x, SAMPLE_RATE)
    engine, publisher = RecordingEngine(), ListPublisher()
    pipeline = Pipeline(FileSource(tmp_path / "two.wav", realtime=False, block_ms=30),
                        Segmenter(VadOptions(), WINDOW_S, StreamClock()), engine, [publisher],
                        PipelineOptions(device_id="test", model="m", backend="onnx", live=False))
    pipeline.run()
    # the first segment was cut at the window limit, in the pause: no tail to carry over
    assert len(engine.calls) == 2 and [final for _, final in engine.calls] == [True, True]
    assert len(publisher.payloads) == 2
    assert engine.calls[0][0] <= WINDOW_S * SAMPLE_RATE
