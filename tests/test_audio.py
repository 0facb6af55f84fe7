"""edgeasr.audio.load_audio on real dev clips re-encoded the ways users' files come."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

from edgeasr.audio.files import load_audio
from edgeasr.errors import AudioError, MissingInputError

DEV_AUDIO = Path(__file__).resolve().parents[1].parent / "shared" / "eval" / "dev" / "audio"
SPEECH = DEV_AUDIO / "jfk_inaugural-1961.wav"
OTHER_SPEECH = DEV_AUDIO / "ls_test-other_1688-142285-0000.wav"
MODEL_RATE = 16_000  # the dev set's rate, and Whisper's


def original() -> np.ndarray:
    audio, rate = sf.read(SPEECH, dtype="float32")
    assert rate == MODEL_RATE
    return audio


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    n = min(len(a), len(b))
    return float(np.corrcoef(a[:n], b[:n])[0, 1])


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    n = min(len(a), len(b))
    return float(np.sqrt(np.mean((a[:n] - b[:n]) ** 2) / np.mean(b[:n] ** 2)))


def test_dev_wav_loads_unchanged() -> None:
    audio = load_audio(SPEECH, MODEL_RATE)
    assert audio.dtype == np.float32 and audio.ndim == 1
    np.testing.assert_array_equal(audio, original())


def test_stereo_flac_at_44k1_is_averaged_and_resampled(tmp_path: Path) -> None:
    speech = original()
    # Left and right differ by another voice, which cancels in the channel average.
    other = sf.read(OTHER_SPEECH, dtype="float32")[0][: len(speech)]
    other = np.pad(other, (0, len(speech) - len(other)))
    stereo = np.stack([speech + 0.3 * other, speech - 0.3 * other], axis=1)
    path = tmp_path / "jfk-44k1-stereo.flac"
    stereo_44k1 = soxr.resample(stereo, MODEL_RATE, 44_100, quality="VHQ")
    sf.write(path, stereo_44k1, 44_100, subtype="PCM_24")
    assert sf.info(path).channels == 2 and sf.info(path).samplerate == 44_100

    audio = load_audio(path, MODEL_RATE)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - len(speech)) <= 1
    assert correlation(audio, speech) > 0.999
    assert relative_error(audio, speech) < 0.01


def test_ogg_vorbis_at_48k(tmp_path: Path) -> None:
    speech = original()
    path = tmp_path / "jfk-48k.ogg"
    speech_48k = soxr.resample(speech, MODEL_RATE, 48_000, quality="VHQ")
    sf.write(path, speech_48k, 48_000, format="OGG", subtype="VORBIS")
    audio = load_audio(path, MODEL_RATE)
    assert abs(len(audio) - len(speech)) <= 1
    assert correlation(audio, speech) > 0.99  # Vorbis is lossy
    assert relative_error(audio, speech) < 0.15


def test_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.wav"
    with pytest.raises(MissingInputError, match=f"{re.escape(str(path))} does not exist") as err:
        load_audio(path, MODEL_RATE)
    assert err.value.exit_code == 66
    with pytest.raises(MissingInputError, match="is a directory"):
        load_audio(tmp_path, MODEL_RATE)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (lambda wav: wav[:30], "No 'data' chunk"),  # a header cut short
        (lambda wav: np.random.default_rng(7).bytes(8_000), "Format not recognised"),
    ],
    ids=["truncated-header", "random-bytes"],
)
def test_corrupt_file_names_file_and_reason(tmp_path: Path, content, reason: str) -> None:
    path = tmp_path / "broken.wav"
    path.write_bytes(content(SPEECH.read_bytes()))
    expected = rf"{re.escape(str(path))} cannot be decoded: .*{reason}"
    with pytest.raises(AudioError, match=expected) as err:
        load_audio(path, MODEL_RATE)
    assert err.value.exit_code == 65


def test_empty_file_holds_no_audio(tmp_path: Path) -> None:
    path = tmp_path / "empty.wav"
    path.touch()
    with pytest.raises(AudioError, match=f"{re.escape(str(path))} holds no audio"):
        load_audio(path, MODEL_RATE)


def test_wav_without_samples_holds_no_audio(tmp_path: Path) -> None:
    path = tmp_path / "no-frames.flac"
    sf.write(path, np.zeros((0, 1), dtype=np.float32), MODEL_RATE)
    with pytest.raises(AudioError, match=f"{re.escape(str(path))} holds no audio"):
        load_audio(path, MODEL_RATE)


def test_all_zero_wav_is_digital_silence(tmp_path: Path) -> None:
    path = tmp_path / "silence.wav"
    sf.write(path, np.zeros(3 * MODEL_RATE, dtype=np.int16), MODEL_RATE, subtype="PCM_16")
    with pytest.raises(AudioError, match=f"{re.escape(str(path))} is digital silence"):
        load_audio(path, MODEL_RATE)


def test_float_wav_with_nan_is_corrupt(tmp_path: Path) -> None:
    speech = original()
    speech[1000] = np.nan
    path = tmp_path / "nan.wav"
    sf.write(path, speech, MODEL_RATE, subtype="FLOAT")
    with pytest.raises(AudioError, match=f"{re.escape(str(path))} is corrupt"):
        load_audio(path, MODEL_RATE)
