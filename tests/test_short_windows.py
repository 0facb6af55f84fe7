"""Short audio on the CPU encoder: with window parts asked for, a window is encoded over the
smallest of a few sizes that holds its audio, and the decoder reads the rest as the silence
row (the daemon keeps the full window: encoder.WINDOW_PARTS)."""

from __future__ import annotations

import numpy as np
import pytest

from edgeasr.asr.encoder import OnnxEncoder, audio_frames, window_sizes
from edgeasr.asr.features import MelSpec, log_mel
from edgeasr.bundle import load_bundle

SPEC = MelSpec(16000, 400, 160, 80, 1000)
PARTS = (0.75, 1.0)  # the short windows measured (encoder.WINDOW_PARTS keeps the full one)
PARTS_FRAMES = (750, 1000)
CLIPS = ["ls_test-other_1688-142285-0002", "cmu_goforward", "picovoice_test-en"]


def test_the_window_sizes_are_parts_of_the_full_window():
    assert window_sizes(1000, PARTS) == (750, 1000)
    assert window_sizes(1000, (0.25, 0.5, 0.75, 1.0)) == (250, 500, 750, 1000)
    assert window_sizes(1000, (1.0,)) == (1000,)
    assert window_sizes(3000, (0.1, 1.0)) == (300, 3000)


def test_the_frames_holding_audio_end_where_the_padding_starts():
    noise = np.random.default_rng(0).standard_normal(16000 * 12 // 10).astype(np.float32) * 0.1
    held = audio_frames(log_mel(noise, SPEC))  # 1.2 s: 120 frames, the last ones part padding
    assert 120 <= held <= 123
    assert audio_frames(log_mel(np.tile(noise, 9)[: SPEC.n_samples], SPEC)) == SPEC.n_frames  # no padding
    assert audio_frames(log_mel(np.zeros(16000, np.float32), SPEC)) == 0


@pytest.mark.parametrize("clip", CLIPS)
def test_a_short_window_gives_the_full_windows_text(tiny_bundle, dev_dir, dev_manifest, clip):
    from helpers.engines import make_engine

    from edgeasr.asr.decoding import DecoderSession
    from edgeasr.asr.engine import EngineSessions
    from edgeasr.asr.transcriber import Transcriber
    from edgeasr.audio.files import load_audio

    bundle = load_bundle(tiny_bundle)
    assert OnnxEncoder(bundle, parts=PARTS).frame_sizes == PARTS_FRAMES  # the int8 graph takes any length
    assert OnnxEncoder(bundle, "fp32", parts=PARTS).frame_sizes == ()  # the Hailo-ready one a 10 s window
    row = next(r for r in dev_manifest if r["id"] == clip)
    audio = load_audio(dev_dir / row["file"], bundle.audio.sample_rate)
    full = make_engine(tiny_bundle)  # the full window, as the daemon runs
    cut = OnnxEncoder(bundle, parts=PARTS)
    short = Transcriber(EngineSessions(bundle, cut, DecoderSession(bundle)), full.options)
    mel = log_mel(audio, short.spec)
    size = next(s for s in window_sizes(bundle.audio.n_frames, PARTS) if s * bundle.audio.hop_length >= len(audio))
    assert size < bundle.audio.n_frames, "a clip shorter than the smallest window"
    assert cut.encode(mel).shape == (1, size // 2, bundle.d_model)
    assert full.encoder.encode(mel).shape == (1, bundle.audio.n_positions, bundle.d_model)
    assert short.transcribe(audio).text == full.transcribe(audio).text
