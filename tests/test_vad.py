"""The speech detectors (vad.detector) on real speech, digital silence and the noisy dev stream."""

from __future__ import annotations

import csv
import time

import numpy as np
import pytest

from edgeasr.audio.clock import StreamClock
from edgeasr.audio.files import load_audio
from edgeasr.audio.segmenter import Segmenter
from edgeasr.audio.vad import SileroDetector, TenDetector, WebRtcDetector, make_detector
from edgeasr.config import VAD_DETECTORS, VadOptions
from edgeasr.stages import AudioChunk

FRAME = 480  # 30 ms at 16 kHz, the default vad.frame_ms


def frames(audio: np.ndarray) -> np.ndarray:
    n = len(audio) // FRAME
    return (np.clip(audio[: n * FRAME], -1, 1) * 32767).astype(np.int16).reshape(n, FRAME)


@pytest.mark.parametrize("name", VAD_DETECTORS)
def test_detector_hears_speech_and_not_silence(name, dev_dir):
    detector = make_detector(VadOptions(detector=name))
    assert isinstance(detector, {"webrtc": WebRtcDetector, "silero": SileroDetector, "ten": TenDetector}[name])
    speech = load_audio(dev_dir / "audio" / "jfk_inaugural-1961.wav", 16000)[: 16000 * 3]
    verdicts = [detector.is_speech(f) for f in frames(np.concatenate([speech, np.zeros(16000 * 2, np.float32)]))]
    spoken, quiet = verdicts[: 3 * 1000 // 30], verdicts[-(1500 // 30) :]
    assert np.mean(spoken) > 0.5
    assert not any(quiet)


@pytest.mark.parametrize("name", VAD_DETECTORS)
def test_segmenter_finds_every_utterance_of_the_noisy_stream(name, dev_dir):
    """20 dB SNR pink noise over the whole stream, the gaps included: each utterance is
    covered by the segments, and the noise alone opens no segment."""
    longform = dev_dir / "longform"
    with (longform / "segments.tsv").open(newline="") as f:
        spans = [(int(r["start_sample"]), int(r["end_sample"]))
                 for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
                 if r["stream_id"] == "dev_stream_01_noisy20db"]
    with (longform / "streams.tsv").open(newline="") as f:
        utterances = {r["id"]: int(r["num_segments"]) for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)}
    assert len(spans) == utterances["dev_stream_01_noisy20db"] > 0  # the loops below check each of them
    audio = (load_audio(longform / "dev_stream_01_noisy20db.wav", 16000) * 32767).astype(np.int16)
    segmenter = Segmenter(VadOptions(detector=name), 10.0, StreamClock())
    segments = []
    for i in range(0, len(audio), FRAME):
        segments += segmenter.push(AudioChunk(audio[i : i + FRAME], i, time.monotonic()))
    segments += segmenter.flush()
    covered = np.zeros(len(audio), bool)
    for s in segments:
        covered[s.start_sample : s.end_sample] = True
        assert any(s.start_sample < end and s.end_sample > start for start, end in spans), (s.start_sample, s.end_sample)
    for start, end in spans:
        assert covered[start:end].mean() > 0.8, (start, end)
