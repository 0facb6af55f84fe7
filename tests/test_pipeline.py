"""The audio front end: segmenter -> worker -> publishers, with partial results and speculative
decoding. A recording engine stands in for Whisper so that the hand-over itself is checked; the
pipeline's clock follows the stream position, so "real time" needs no waiting."""

from __future__ import annotations

import numpy as np
import soundfile as sf
from helpers.audio import DEV, WINDOW_S, read_wav, sentence_pause_sentence

from edgeasr.audio.clock import StreamClock
from edgeasr.audio.segmenter import Segmenter
from edgeasr.audio.sources import FileSource
from edgeasr.config import PipelineConfig, VadOptions
from edgeasr.pipeline import Pipeline
from edgeasr.stages import SAMPLE_RATE, TextSegment, Transcription
from edgeasr.worker import Worker


class RecordingEngine:
    """Takes every segment whole and says so (a cut one: `cut_consumes` of it); remembers how
    it was called."""

    def __init__(self, cut_consumes: float = 1.0) -> None:
        self.cut_consumes = cut_consumes
        self.calls: list[tuple[int, bool]] = []  # (samples, final)
        self.features: list = []  # what each call was given
        self.prompts: list[tuple[int, ...]] = []
        self.partial: list[bool] = []  # whether each call was a partial look
        self.speech: list = []  # the VAD's verdict each call was given

    def feature_stream(self):
        from edgeasr.asr.features import MelSpec, MelStream

        return MelStream(MelSpec(SAMPLE_RATE, 400, 160, 80, int(WINDOW_S * 100)))

    def transcribe(self, audio, *, final: bool = True, language=None, should_stop=None,
                   features=None, prompt=(), max_windows=None, vocabulary=None, partial=False,
                   speech=None) -> Transcription:
        self.calls.append((len(audio), final))
        self.speech.append(speech)
        self.partial.append(partial)
        self.features.append(features)
        self.prompts.append(tuple(prompt))
        seconds = len(audio) / SAMPLE_RATE
        segment = TextSegment(start=0.0, end=seconds, text=f" {seconds:.2f} s", tokens=(1,), avg_logprob=-0.1,
                              no_speech_prob=0.0, compression_ratio=1.0)
        consumed = len(audio) if final else int(len(audio) * self.cut_consumes)
        return Transcription(text=f"{seconds:.2f} s", segments=(segment,), language="en", windows=1, tokens=1,
                             consumed_samples=consumed, context=(len(self.calls),))


class ListPublisher:
    def __init__(self) -> None:
        self.transcripts: list = []

    def publish(self, transcript) -> None:
        self.transcripts.append(transcript)

    def close(self, timeout_s: float) -> None:
        pass

    def finals(self) -> list:
        return [t for t in self.transcripts if not t.partial]


class StreamTime:
    """A source wrapper whose clock is the stream position: the pipeline sees real time pass
    as fast as the file is read."""

    def __init__(self, source: FileSource) -> None:
        self.source, self.seconds = source, 0.0

    def read(self, timeout_s: float):
        chunk = self.source.read(timeout_s)
        if chunk is not None:
            self.seconds = (chunk.start_sample + len(chunk.samples)) / SAMPLE_RATE
        return chunk

    @property
    def ended(self) -> bool:
        return self.source.ended

    def close(self) -> None:
        self.source.close()


def run(tmp_path, audio: np.ndarray, *, live: bool, engine: RecordingEngine | None = None,
        **options) -> tuple[Pipeline, RecordingEngine, ListPublisher]:
    sf.write(tmp_path / "in.wav", audio, SAMPLE_RATE)
    engine, publisher = engine or RecordingEngine(), ListPublisher()
    source = StreamTime(FileSource(tmp_path / "in.wav", realtime=False, block_ms=30))
    worker = Worker(engine).start()
    pipeline = Pipeline(source, Segmenter(VadOptions(), WINDOW_S, StreamClock()), worker, [publisher],
                        PipelineConfig(**options), live=live, clock=lambda: source.seconds)
    pipeline.run()
    assert worker.stop(30)
    return pipeline, engine, publisher


def test_a_segment_cut_in_a_pause_is_decoded_as_complete(tmp_path):
    x, _, _ = sentence_pause_sentence()
    pipeline, engine, publisher = run(tmp_path, x, live=False)
    # the first segment was cut at the window limit, in the pause: no tail to carry over
    assert len(engine.calls) == 2 and [final for _, final in engine.calls] == [True, True]
    assert len(publisher.finals()) == 2 and publisher.finals() == publisher.transcripts
    assert engine.calls[0][0] <= WINDOW_S * SAMPLE_RATE


def test_the_tail_of_a_window_cut_in_speech_is_decoded_with_the_next_one_and_the_text_before_it(tmp_path):
    clip = read_wav(DEV / "audio" / "ls_test-other_3331-159605-0008.wav")  # 21.5 s, no pause long enough
    pipeline, engine, publisher = run(tmp_path, clip, live=False, engine=RecordingEngine(cut_consumes=0.75))
    (first, final), (second, _) = engine.calls[:2]
    assert not final and first <= WINDOW_S * SAMPLE_RATE
    cut = int(first * 0.75)
    # the next call gets the tail and the first call's context, its text goes on from there
    assert second > first - cut and engine.prompts[:2] == [(), (1,)]
    first_message, second_message = (t.segment for t in publisher.finals()[:2])
    assert second_message.start_sample - first_message.start_sample == cut == first_message.duration_s * SAMPLE_RATE
    # the engine reads the segmenter's verdict on what it decodes, the tail's frames first: the
    # audio is judged once, as it arrived
    for samples, speech in zip((first, second), engine.speech[:2]):
        assert speech is not None and -speech.frame < speech.offset <= 0
        assert speech.offset + len(speech.flags) * speech.frame >= samples - speech.frame
    assert engine.speech[1].offset == -(cut % engine.speech[1].frame)  # the tail starts where the cut left it


def test_partial_results_carry_the_id_of_their_final_transcript(tmp_path):
    clip = read_wav(DEV / "audio" / "ls_test-other_1998-15444-0004.wav")  # 8.3 s of speech
    silence = np.zeros(SAMPLE_RATE, np.int16)
    x = np.concatenate([silence, clip, silence, clip, silence])
    pipeline, engine, publisher = run(tmp_path, x, live=True, partial_interval_ms=500, speculate_after_ms=None)
    finals = publisher.finals()
    partials = [t for t in publisher.transcripts if t.partial]
    assert len(finals) == 2 and len({t.id for t in finals}) == 2
    assert partials and {t.id for t in partials} <= {t.id for t in finals}
    assert engine.partial.count(True) == len(partials) and engine.partial.count(False) == 2  # commands: finals only
    for final in finals:  # every partial of an utterance comes before its final
        mine = [i for i, t in enumerate(publisher.transcripts) if t.id == final.id]
        assert publisher.transcripts[mine[-1]] is final
    assert pipeline.stats.partials == len(partials)


def test_partial_jobs_get_the_features_computed_while_the_audio_arrived(tmp_path):
    """The log-mel the capture thread built as the segment grew equals the log-mel of the
    audio a partial job decodes."""
    from edgeasr.asr.features import MelSpec, log_mel

    clip = read_wav(DEV / "audio" / "ls_test-other_1998-15444-0004.wav")
    silence = np.zeros(SAMPLE_RATE, np.int16)
    sf.write(tmp_path / "in.wav", np.concatenate([silence, clip, silence]), SAMPLE_RATE)
    engine, calls = RecordingEngine(), []
    original = engine.transcribe

    def transcribe(audio, **kwargs):
        calls.append((np.array(audio), kwargs.get("features")))
        return original(audio, **kwargs)

    engine.transcribe = transcribe
    source = StreamTime(FileSource(tmp_path / "in.wav", realtime=False, block_ms=30))
    worker = Worker(engine).start()
    Pipeline(source, Segmenter(VadOptions(), WINDOW_S, StreamClock()), worker, [ListPublisher()],
             PipelineConfig(partial_interval_ms=500, speculate_after_ms=None), live=True,
             clock=lambda: source.seconds).run()
    assert worker.stop(30)
    with_features = [(audio, mel) for audio, mel in calls if mel is not None]
    assert with_features
    spec = MelSpec(SAMPLE_RATE, 400, 160, 80, int(WINDOW_S * 100))
    for audio, mel in with_features:
        np.testing.assert_allclose(mel, log_mel(audio, spec), atol=1e-5)


def test_a_pause_long_enough_is_decoded_before_the_hangover_ends(tmp_path):
    clip = read_wav(DEV / "audio" / "ls_test-other_1998-15444-0004.wav")
    silence = np.zeros(2 * SAMPLE_RATE, np.int16)
    pipeline, engine, publisher = run(tmp_path, np.concatenate([silence, clip, silence]), live=True,
                                      partial_interval_ms=0, speculate_after_ms=300)
    assert pipeline.stats.speculations == 1 and pipeline.stats.speculation_hits == 1
    # decoded once, while the hangover ran: the segment's end did not decode it again
    assert len(engine.calls) == 1 and len(publisher.finals()) == 1


def test_speech_resuming_throws_the_speculation_away(tmp_path):
    """One segment holding a pause longer than the speculation's wait but shorter than the
    hangover: the speculation taken in that pause is dropped when speech resumes, and the
    transcript comes from the one taken at the end."""
    # "go forward ten meters": its speech lasts the first 2.35 s of the clip
    phrase = read_wav(DEV / "audio" / "cmu_goforward.wav")[: int(2.35 * SAMPLE_RATE)]
    silence, pause = np.zeros(2 * SAMPLE_RATE, np.int16), np.zeros(int(0.45 * SAMPLE_RATE), np.int16)
    a, b = phrase, phrase
    pipeline, engine, publisher = run(tmp_path, np.concatenate([silence, a, pause, b, silence]), live=True,
                                      partial_interval_ms=0, speculate_after_ms=200)
    assert len(publisher.finals()) == 1
    assert pipeline.stats.speculations == 2 and pipeline.stats.speculation_hits == 1
    # the transcript covers both phrases: the stale speculation's audio ended in the pause
    assert engine.calls[-1][0] >= len(a) + len(pause) + len(b) - SAMPLE_RATE


def test_a_file_read_as_fast_as_possible_is_decoded_once_per_segment(tmp_path):
    x, _, _ = sentence_pause_sentence()
    pipeline, engine, publisher = run(tmp_path, x, live=False, partial_interval_ms=500, speculate_after_ms=300)
    assert pipeline.stats.partials == 0 and pipeline.stats.speculations == 0
    assert len(engine.calls) == len(publisher.finals())
