"""Rows for the keys at the top, `log`, `input` and `vad`: what reaches the publishers, the
log, the audio sources the daemon opens (daemon.open_source) and its segmenter."""

from __future__ import annotations

import logging

import numpy as np
import soundfile as sf
from helpers.audio import dev_clip

from config_rows.lab import Lab, Rows, noise, silence, transcript
from edgeasr.audio.clock import StreamClock
from edgeasr.audio.segmenter import Segmenter
from edgeasr.bundle import load_bundle
from edgeasr.daemon import open_source, window_s
from edgeasr.stages import SAMPLE_RATE, AudioChunk, SegmenterCounters, SpeechSegment

rows = Rows()
SPEECH = "ls_test-other_1688-142285-0002"  # 2.8 s, "You don't mean that you thought me so silly"
SHORT = "alsa_front-center"  # 1.4 s, "Front Center": 1.2 s of speech
LONG = "ls_dev-clean_2412-153948-0000"  # 11.7 s: past the 10 s window


# -- top level, log -------------------------------------------------------------------------------

@rows.observe("device_id")
def _device_id(lab: Lab) -> None:
    (line,) = lab.published({"device_id": "hall-7"}, transcript())
    assert line["device_id"] == "hall-7"


@rows.observe("state_dir")
def _state_dir(lab: Lab) -> None:
    """The outbox (with a broker) is kept there."""
    from edgeasr.daemon import build_outputs
    from edgeasr.output.outbox import FILENAME

    state = lab.tmp / "elsewhere"
    outputs = build_outputs(lab.cfg({"state_dir": str(state), "mqtt.host": "127.0.0.1"}), "whisper-test", "onnx")
    try:
        assert (state / FILENAME).is_file()
    finally:
        outputs.close(0.0)


@rows.observe("log.level")
def _log_level(lab: Lab) -> None:
    from edgeasr.commands.run import setup_logging

    capsys, root = lab.fixture("capsys"), logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        for level in ("INFO", "DEBUG"):  # the default, then the key
            setup_logging(lab.cfg({"log.level": level}).log.level)
            logging.getLogger("edgeasr.rows").debug("said at %s", level)
        err = capsys.readouterr().err
        assert "said at DEBUG" in err and "said at INFO" not in err
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


@rows.observe("log.transcripts", "model")
def _log_transcripts(lab: Lab) -> None:
    from edgeasr.daemon import build_outputs, build_pipeline
    from edgeasr.worker import Worker

    caplog = lab.fixture("caplog")
    caplog.set_level(logging.INFO, "edgeasr.pipeline")
    path = lab.tmp / "said.wav"
    sf.write(path, np.concatenate([dev_clip(SHORT), silence(1.0)]), SAMPLE_RATE)
    cfg = lab.cfg({"log.transcripts": True, "input.source": "file", "input.path": str(path), "output.stdout": False,
                   "model.path": str(lab.bundle)})
    worker = Worker(lab.engine()).start()
    pipeline = build_pipeline(cfg, load_bundle(lab.bundle), worker, build_outputs(cfg, "whisper-test", "onnx"))
    pipeline.run()
    assert worker.stop(60.0)
    texts = [r for r in caplog.records if r.name == "edgeasr.pipeline" and r.getMessage().startswith("text: ")]
    assert [(r.levelno, r.getMessage()) for r in texts] == [(logging.INFO, "text: Front Center.")]


# -- input ----------------------------------------------------------------------------------------

def _file(lab: Lab, name: str) -> str:
    path = lab.tmp / f"{name}.wav"
    sf.write(path, dev_clip(name), SAMPLE_RATE)
    return str(path)


def _read_all(keys: dict, lab: Lab) -> list[np.ndarray]:
    source = open_source(lab.cfg(keys))
    chunks = []
    while not source.ended:
        chunk = source.read(1.0)
        if chunk is not None:
            chunks.append(chunk.samples)
    return chunks


@rows.observe("input.source")
def _input_source(lab: Lab) -> None:
    chunks = _read_all({"input.source": "file", "input.path": _file(lab, SHORT)}, lab)
    assert np.array_equal(np.concatenate(chunks), dev_clip(SHORT))  # the file, not a microphone


@rows.observe("input.path")
def _input_path(lab: Lab) -> None:
    chunks = _read_all({"input.source": "file", "input.path": _file(lab, SPEECH)}, lab)
    assert np.array_equal(np.concatenate(chunks), dev_clip(SPEECH))


@rows.observe("input.realtime")
def _input_realtime(lab: Lab) -> None:
    """Paced: a block is delivered no earlier than the time its end is due in the stream (one
    second long blocks, so that none is due at once however slow the machine)."""
    path = _file(lab, SPEECH)
    for realtime in (False, True):
        source = open_source(lab.cfg({"input.source": "file", "input.path": path, "input.block_ms": 1000,
                                      "input.realtime": realtime}))
        assert (source.read(0.0) is None) == realtime
        source.close()


@rows.observe("input.block_ms")
def _input_block_ms(lab: Lab) -> None:
    chunks = _read_all({"input.source": "file", "input.path": _file(lab, SPEECH), "input.block_ms": 100}, lab)
    assert {len(c) for c in chunks[:-1]} == {SAMPLE_RATE // 10}


@rows.observe("input.device", "alsa")
def _input_device(lab: Lab) -> None:
    report = lab.fixture("mic_report")
    assert report["default"]["status"].startswith("capturing from fifomic at ")
    assert report["device"]["status"].startswith("capturing from fifomic48 at ")


@rows.observe("input.samplerate", "alsa")
def _input_samplerate(lab: Lab) -> None:
    report = lab.fixture("mic_report")
    assert report["samplerate"]["status"] == "capturing from fifomic at 32000 Hz"
    assert not report["default"]["status"].endswith(" 32000 Hz")  # the device's own rate


@rows.observe("input.ring_s", "alsa")
def _input_ring_s(lab: Lab) -> None:
    """A ring of one block: while the reader stalls, the older blocks are dropped."""
    report = lab.fixture("mic_report")
    assert report["ring"]["ring_drops"] > 0 and report["default"]["ring_drops"] == 0


# -- vad: the segmenter the daemon builds ------------------------------------------------------

def segments(lab: Lab, keys: dict, audio: np.ndarray) -> tuple[list[SpeechSegment], SegmenterCounters]:
    cfg = lab.cfg({"model.path": str(lab.bundle), **keys})
    segmenter = Segmenter(cfg.vad, window_s(cfg, load_bundle(lab.bundle)), StreamClock())
    found = segmenter.push(AudioChunk(audio, 0, 1000.0)) + segmenter.flush()
    return found, segmenter.counters


def _spoken(lab: Lab, keys: dict, audio: np.ndarray) -> int:
    return sum(s.speech_frames for s in segments(lab, keys, audio)[0])


def _padded(name: str) -> np.ndarray:
    return np.concatenate([silence(1.0), dev_clip(name), silence(2.0)])


@rows.observe("vad.aggressiveness", "model")
def _vad_aggressiveness(lab: Lab) -> None:
    audio = _padded(SPEECH)  # LibriSpeech test-other: noisy
    assert _spoken(lab, {"vad.aggressiveness": 3}, audio) < _spoken(lab, {}, audio)


def _hangover(lab: Lab, keys: dict) -> int:
    """Samples from the end of the speech to the end of its segment."""
    (segment,), _ = segments(lab, keys, _padded(SHORT))
    return segment.end_sample - segment.speech_end_sample


@rows.observe("vad.frame_ms", "model")
def _vad_frame_ms(lab: Lab) -> None:
    """The hangover in 20 ms frames: 500 ms exactly (30 ms frames: 510)."""
    assert _hangover(lab, {"vad.frame_ms": 20, "vad.hangover_ms": 500}) == SAMPLE_RATE // 2
    assert _hangover(lab, {"vad.hangover_ms": 500}) == 17 * 480


@rows.observe("vad.hangover_ms", "model")
def _vad_hangover_ms(lab: Lab) -> None:
    assert _hangover(lab, {}) == 30 * 480  # 900 ms
    assert _hangover(lab, {"vad.hangover_ms": 450}) == 15 * 480


@rows.observe("vad.pre_roll_ms", "model")
def _vad_pre_roll_ms(lab: Lab) -> None:
    audio = _padded(SHORT)
    (default,), _ = segments(lab, {}, audio)
    (longer,), _ = segments(lab, {"vad.pre_roll_ms": 600}, audio)
    assert default.start_sample - longer.start_sample == 10 * 480  # 300 ms more before the speech


@rows.observe("vad.min_speech_ms", "model")
def _vad_min_speech_ms(lab: Lab) -> None:
    audio = _padded(SHORT)  # 1.2 s of speech
    assert segments(lab, {}, audio)[1].dropped_short == 0
    found, counters = segments(lab, {"vad.min_speech_ms": 2000}, audio)
    assert found == [] and counters.dropped_short == 1


@rows.observe("vad.max_window_s", "model")
def _vad_max_window_s(lab: Lab) -> None:
    found, _ = segments(lab, {"vad.max_window_s": 3.0}, _padded(LONG))
    assert max(s.duration_s for s in found) <= 3.0 and len(found) >= 4
    assert max(s.duration_s for s in segments(lab, {}, _padded(LONG))[0]) > 3.0


def _first_cut(lab: Lab, keys: dict) -> SpeechSegment:
    found, _ = segments(lab, keys, _padded(LONG))
    assert found[0].cut
    return found[0]


@rows.observe("vad.cut_search_s", "model")
def _vad_cut_search_s(lab: Lab) -> None:
    """Looking back 0.1 s from the limit: cut at the limit, where the quietest point of the
    last 2 s (the default) lies in a pause 1.8 s earlier."""
    near = _first_cut(lab, {"vad.cut_search_s": 0.1})
    assert near.duration_s > 10.0 - 0.1 - 0.03 and not near.cut_in_pause
    assert _first_cut(lab, {}).duration_s < 10.0 - 1.0


@rows.observe("vad.cut_pause_ms", "model")
def _vad_cut_pause_ms(lab: Lab) -> None:
    """A 60 ms pause near the limit is cut at once: an earlier one than 300 ms."""
    sooner, default = _first_cut(lab, {"vad.cut_pause_ms": 60}), _first_cut(lab, {})
    assert sooner.cut_in_pause and sooner.end_sample < default.end_sample


@rows.observe("vad.detector", "model")
def _vad_detector(lab: Lab) -> None:
    """webrtcvad calls loud noise speech; Silero does not."""
    audio = noise(3.0)
    assert segments(lab, {}, audio)[0]
    assert segments(lab, {"vad.detector": "silero"}, audio)[0] == []


@rows.observe("vad.threshold", "model")
def _vad_threshold(lab: Lab) -> None:
    audio = _padded(SPEECH)
    assert _spoken(lab, {"vad.detector": "silero", "vad.threshold": 0.95}, audio) < _spoken(
        lab, {"vad.detector": "silero"}, audio)
