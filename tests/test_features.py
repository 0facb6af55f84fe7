"""edgeasr.asr.features against faster-whisper's front end, on the real dev clips.

faster-whisper's FeatureExtractor is an independent numpy implementation of Whisper's
log-mel (its Slaney filterbank follows librosa, its STFT torch.stft). Called on audio
zero-padded to the window with no padding of its own, it computes what openai/whisper and
Hugging Face compute: the log-mel of zero-padded audio. Its own default (160 zero samples,
then the log-mel padded with 0 by its transcribe) differs only past the speech, as
test_padding_is_the_log_mel_of_silence_not_zero shows. It is a reference here only: the
runtime does not import it.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from faster_whisper.feature_extractor import FeatureExtractor

from edgeasr.asr.features import (
    DYNAMIC_RANGE,
    LOG_FLOOR,
    NORM_OFFSET,
    NORM_SCALE,
    SILENCE,
    MelSpec,
    MelStream,
    log_mel,
    mel_filters,
    silence_level,
)
from edgeasr.errors import ModelError

DEV = Path(__file__).resolve().parents[1].parent / "shared" / "eval" / "dev"
CLIPS = sorted((DEV / "audio").glob("*.wav"))
SAMPLE_RATE = 16_000  # the dev set's rate (its README)
TOLERANCE = 1e-4  # max |difference| allowed against the references


def whisper_spec(n_mels: int = 80, window_s: int = 10) -> MelSpec:
    # Whisper's front end as a bundle manifest states it: 100 frames a second.
    return MelSpec(SAMPLE_RATE, 400, 160, n_mels, window_s * 100)


def reference_layout(mel: np.ndarray) -> np.ndarray:
    """NHWC [1, 1, n_frames, n_mels] -> [n_mels, n_frames], the references' layout."""
    return mel[0, 0].T


def read_clip(name: str) -> np.ndarray:
    audio, rate = sf.read(DEV / "audio" / f"{name}.wav", dtype="float32")
    assert rate == SAMPLE_RATE
    return audio


def reference_extractor(spec: MelSpec) -> FeatureExtractor:
    # its filterbank's top mel is fixed at 8 kHz: right for 16 kHz audio only
    assert spec.sample_rate == 16_000
    return FeatureExtractor(feature_size=spec.n_mels, sampling_rate=spec.sample_rate,
                            hop_length=spec.hop_length, chunk_length=int(spec.window_s), n_fft=spec.n_fft)


def reference_mel_filters(spec: MelSpec) -> np.ndarray:
    """The Slaney filterbank, [n_fft / 2 + 1, n_mels] as ours (float64)."""
    return FeatureExtractor.get_mel_filters(spec.sample_rate, spec.n_fft, spec.n_mels).T


def reference_log_mel(audio: np.ndarray, spec: MelSpec) -> np.ndarray:
    """[n_mels, n_frames]: the log-mel of the audio zero-padded to the window (openai/HF)."""
    padded = np.zeros(spec.n_samples, dtype=np.float32)
    padded[: len(audio)] = audio
    return reference_extractor(spec)(padded, padding=0)


def test_dev_clips_present() -> None:
    assert len(CLIPS) >= 80, f"expected the dev set in {DEV}"


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_faster_whisper(n_mels: int) -> None:
    spec = whisper_spec(n_mels)
    ours = mel_filters(spec.sample_rate, spec.n_fft, spec.n_mels)
    ref = reference_mel_filters(spec)
    assert ours.shape == ref.shape == (201, n_mels)
    assert ours.dtype == np.float32 and not ours.flags.writeable
    assert np.abs(ours - ref).max() < 1e-8


@pytest.mark.parametrize(("n_mels", "window_s"), [(80, 10), (80, 30), (128, 10), (128, 30)])
def test_log_mel_matches_faster_whisper_on_every_clip(n_mels: int, window_s: int) -> None:
    spec = whisper_spec(n_mels, window_s)
    worst = 0.0
    for clip in CLIPS:
        audio = sf.read(clip, dtype="float32")[0][: spec.n_samples]
        ref = reference_log_mel(audio, spec)
        ours = reference_layout(log_mel(audio, spec))
        assert ours.shape == ref.shape == (n_mels, spec.n_frames)
        diff = float(np.abs(ours - ref).max())
        assert diff <= TOLERANCE, f"{clip.name}: max |diff| {diff:.2e}"
        worst = max(worst, diff)
    print(f"\nfaster-whisper {n_mels} mels, {window_s} s: worst max|diff| {worst:.2e}")


@pytest.mark.parametrize(
    ("name", "seconds"),
    [("jfk_inaugural-1961", None), ("cmu_goforward", None), ("ls_test-other_1688-142285-0000", None),
     # log_mel transforms only frames that reach the audio: at the edges of that rule
     ("jfk_inaugural-1961", 0.01), ("jfk_inaugural-1961", 9.987), ("jfk_inaugural-1961", 9.988),
     ("jfk_inaugural-1961", 9.99)],
)
def test_log_mel_matches_faster_whisper_at_any_length(name: str, seconds: float | None) -> None:
    spec = whisper_spec()
    audio = read_clip(name)[: int(seconds * SAMPLE_RATE) if seconds else spec.n_samples]
    assert np.abs(reference_layout(log_mel(audio, spec)) - reference_log_mel(audio, spec)).max() <= TOLERANCE


def test_padding_is_the_log_mel_of_silence_not_zero() -> None:
    # faster-whisper pads the log-mel with 0; openai/HF compute it on zero-padded audio.
    spec = whisper_spec(window_s=30)
    audio = read_clip("jfk_inaugural-1961")
    mel = log_mel(audio, spec)[0, 0]
    speech_frames = len(audio) // spec.hop_length
    # faster-whisper's own default agrees inside the speech (frames clear of the end's padding)
    own = reference_extractor(spec)(audio).T  # [frames, n_mels], then 0 up to the window
    inside = speech_frames - spec.n_fft // spec.hop_length
    assert np.abs(own[:inside] - mel[:inside]).max() <= TOLERANCE
    pad = mel[speech_frames + spec.n_fft // spec.hop_length :]
    peak = NORM_SCALE * float(mel.max()) - NORM_OFFSET  # the window's max log10 power
    floor = (max(math.log10(LOG_FLOOR), peak - DYNAMIC_RANGE) + NORM_OFFSET) / NORM_SCALE
    assert len(pad) > 1000
    assert np.allclose(pad, floor, atol=1e-6)
    assert pad.max() < -0.5  # -0.54 on this clip, as openai/HF give (notes/whisper-weights.md)
    # the level the decoder's padding stands for (tail.SilenceRows) is that value
    assert silence_level(mel[None, None]) == pytest.approx(floor, abs=1e-6)
    assert silence_level(log_mel(np.zeros(1600, np.float32), spec)) == SILENCE == -1.5


def test_layout_is_nhwc() -> None:
    spec = whisper_spec()
    mel = log_mel(read_clip("cmu_goforward"), spec)
    assert mel.shape == (1, 1, 1000, 80) and mel.dtype == np.float32


def test_log_mel_rejects_bad_audio() -> None:
    spec = whisper_spec()
    with pytest.raises(ValueError, match="do not fit a 10 s window"):
        log_mel(np.zeros(spec.n_samples + 1, dtype=np.float32), spec)
    with pytest.raises(ValueError, match="int16"):
        log_mel(np.zeros(100, dtype=np.int16), spec)
    with pytest.raises(ValueError, match="1-D"):
        log_mel(np.zeros((2, 100), dtype=np.float32), spec)


def test_exactly_one_window_and_empty_audio() -> None:
    spec = whisper_spec()
    audio = read_clip("ls_test-other_1688-142285-0000")[: spec.n_samples]  # 15 s clip, cut
    assert len(audio) == spec.n_samples
    assert np.isfinite(log_mel(audio, spec)).all()
    silence = log_mel(np.zeros(0, dtype=np.float32), spec)
    expected = (math.log10(LOG_FLOOR) + NORM_OFFSET) / NORM_SCALE
    np.testing.assert_allclose(silence, expected, atol=1e-6, rtol=0)


def test_mel_spec_sizes_and_validation() -> None:
    spec = whisper_spec()
    assert (spec.n_frames, spec.n_samples, spec.pad, spec.window_s) == (1000, 160_000, 200, 10.0)
    assert whisper_spec(window_s=30).n_frames == 3000
    with pytest.raises(ModelError, match="n_mels must be a positive integer"):
        MelSpec(16_000, 400, 160, 0, 1000)
    with pytest.raises(ModelError, match="hop_length must be a positive integer"):
        MelSpec(16_000, 400, 160.0, 80, 1000)  # type: ignore[arg-type]
    with pytest.raises(ModelError, match="n_fft must be even"):
        MelSpec(16_000, 401, 160, 80, 1000)
    with pytest.raises(ModelError, match="too short"):
        MelSpec(16_000, 400, 160, 80, 1)


# --- MelStream ---------------------------------------------------------------------------


def push_in_chunks(stream: MelStream, audio: np.ndarray, seed: int) -> None:
    rng = np.random.default_rng(seed)
    i = 0
    while i < len(audio):
        n = int(rng.integers(1, 2_000))
        stream.push(audio[i : i + n])
        i += n


def max_tail_frames(spec: MelStream | MelSpec) -> int:
    spec = spec.spec if isinstance(spec, MelStream) else spec
    # The start's reflect-padded frames, those straddling the audio's end, the end's padding.
    return 2 * math.ceil(spec.n_fft / spec.hop_length) + 1


@pytest.mark.parametrize(
    ("name", "n_mels"),
    [
        ("cmu_goforward", 80),
        ("jfk_inaugural-1961", 80),
        ("ls_test-other_1688-142285-0000", 128),  # cut to exactly one window
        ("alsa_front-left", 80),
    ],
)
def test_stream_finish_equals_one_shot(name: str, n_mels: int) -> None:
    spec = whisper_spec(n_mels)
    audio = read_clip(name)[: spec.n_samples]
    stream = MelStream(spec)
    push_in_chunks(stream, audio, seed=len(audio))
    assert stream.end == len(audio)
    assert stream.pending_frames <= max_tail_frames(spec)
    streamed = stream.finish()
    assert streamed.shape == (1, 1, spec.n_frames, n_mels) and streamed.dtype == np.float32
    assert np.abs(streamed - log_mel(audio, spec)).max() <= 1e-5
    assert (stream.start, stream.end) == (0, 0)


def test_stream_work_left_is_the_tail_only() -> None:
    spec = whisper_spec()
    audio = read_clip("jfk_inaugural-1961")[: 5 * spec.sample_rate]
    stream = MelStream(spec)
    assert stream.pending_frames == 0  # nothing pushed: the window is silence
    stream.push(audio[: spec.pad])  # no frame complete yet: every frame touching the audio is left
    assert stream.pending_frames == math.ceil((spec.pad + spec.pad) / spec.hop_length)
    stream.push(audio[spec.pad :])
    assert 0 < stream.pending_frames <= max_tail_frames(spec)


def test_stream_window_mid_stream_then_more_audio() -> None:
    spec = whisper_spec()
    audio = read_clip("ls_test-other_1688-142285-0000")[: spec.n_samples]
    stream = MelStream(spec)
    half = 77_777
    push_in_chunks(stream, audio[:half], seed=1)
    assert np.abs(stream.window() - log_mel(audio[:half], spec)).max() <= 1e-5
    push_in_chunks(stream, audio[half:], seed=2)
    assert np.abs(stream.finish() - log_mel(audio, spec)).max() <= 1e-5


# On the hop grid (a 7.86 s timestamp), off it, and no move at all.
@pytest.mark.parametrize("start", [125_760, 12_345, 0])
def test_stream_window_at_a_later_start(start: int) -> None:
    spec = whisper_spec()
    audio = read_clip("ls_test-other_1688-142285-0000")  # 15 s: more than one window
    stream = MelStream(spec)
    push_in_chunks(stream, audio, seed=3)
    expected = log_mel(audio[start : start + spec.n_samples], spec)
    assert np.abs(stream.window(start) - expected).max() <= 1e-5
    assert stream.start == start
    with pytest.raises(ValueError, match="outside the audio held"):
        stream.window(start - 1)
    if len(audio) - start > spec.n_samples:
        with pytest.raises(ValueError, match="do not fit one window"):
            stream.finish()
    else:
        assert np.abs(stream.finish() - expected).max() <= 1e-5


def test_stream_carries_on_after_a_cut_window() -> None:
    # A window cut at its limit while speech goes on: the next one starts where the
    # transcript's last complete timestamp fell, and audio keeps arriving meanwhile.
    spec = whisper_spec()
    first, second = read_clip("ls_test-other_1688-142285-0000"), read_clip("jfk_inaugural-1961")
    audio = np.concatenate([first, second])
    stream = MelStream(spec)
    stream.push(audio[: spec.n_samples])
    assert np.abs(stream.window(0) - log_mel(audio[: spec.n_samples], spec)).max() <= 1e-5
    consumed = 125_760
    push_in_chunks(stream, audio[spec.n_samples : consumed + spec.n_samples], seed=4)
    assert stream.pending_frames <= max_tail_frames(spec)
    expected = log_mel(audio[consumed : consumed + spec.n_samples], spec)
    assert np.abs(stream.window(consumed) - expected).max() <= 1e-5


def test_stream_is_bounded() -> None:
    spec = whisper_spec()
    stream = MelStream(spec)
    stream.push(np.zeros(2 * spec.n_samples, dtype=np.float32))
    with pytest.raises(ValueError, match="holds at most 320000 samples"):
        stream.push(np.zeros(1, dtype=np.float32))
    stream.window(spec.n_samples)
    stream.push(np.zeros(spec.n_samples, dtype=np.float32))  # room again after moving on
    with pytest.raises(ValueError, match="int16"):
        stream.push(np.zeros(10, dtype=np.int16))


def test_runtime_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, edgeasr.asr.features, edgeasr.audio; "
        "print(sorted({'torch', 'transformers', 'faster_whisper'} & set(sys.modules)))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    out = run.stdout
    assert out.strip() == "[]"
