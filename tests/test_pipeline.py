"""The pipeline's hand-over from segmenter to engine, with a recording engine."""

from __future__ import annotations

import soundfile as sf
from test_segmenter import WINDOW_S, sentence_pause_sentence

from edgeasr.audio.clock import StreamClock
from edgeasr.audio.segmenter import Segmenter
from edgeasr.audio.sources import FileSource
from edgeasr.config import PipelineConfig, VadOptions
from edgeasr.pipeline import Pipeline
from edgeasr.stages import SAMPLE_RATE, TextSegment, Transcription


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
        self.payloads: list = []

    def publish(self, transcript) -> None:
        self.payloads.append(transcript)

    def close(self, timeout_s: float) -> None:
        pass


def test_a_segment_cut_in_a_pause_is_decoded_as_complete(tmp_path):
    x, _, _ = sentence_pause_sentence()
    sf.write(tmp_path / "two.wav", x, SAMPLE_RATE)
    engine, publisher = RecordingEngine(), ListPublisher()
    pipeline = Pipeline(FileSource(tmp_path / "two.wav", realtime=False, block_ms=30),
                        Segmenter(VadOptions(), WINDOW_S, StreamClock()), engine, [publisher],
                        PipelineConfig(), live=False)
    pipeline.run()
    # the first segment was cut at the window limit, in the pause: no tail to carry over
    assert len(engine.calls) == 2 and [final for _, final in engine.calls] == [True, True]
    assert len(publisher.payloads) == 2
    assert engine.calls[0][0] <= WINDOW_S * SAMPLE_RATE
