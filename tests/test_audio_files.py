"""Audio files nobody should feed a transcriber, through the real CLI: each
is refused by `transcribe`, the daemon (`--input`) and `check --input` alike, with one line
naming the file for what it is, and the exit code of its kind (65 unusable audio, 66 not an
audio file at all)."""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from helpers.daemon import run_edgeasr

from edgeasr.audio.sources import FileSource
from edgeasr.errors import AudioError, MissingInputError


def speech_like(seconds: float = 2.0, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def nan_wav(tmp: Path) -> Path:
    audio = speech_like()
    audio[5000:5100] = np.nan
    path = tmp / "nan.wav"
    sf.write(path, audio, 16000, subtype="FLOAT")
    return path


def inf_wav(tmp: Path) -> Path:
    audio = speech_like()
    audio[5000:5100] = np.inf
    audio[6000:6100] = -np.inf
    path = tmp / "inf.wav"
    sf.write(path, audio, 16000, subtype="FLOAT")
    return path


def header_only_wav(tmp: Path) -> Path:
    path = tmp / "header-only.wav"
    sf.write(path, np.zeros((0, 1), np.int16), 16000, subtype="PCM_16")
    assert path.stat().st_size == 44
    return path


def one_hertz_wav(tmp: Path) -> Path:
    """20 KB of samples under a header that declares 1 Hz: 10,000 s if believed."""
    path = tmp / "one-hertz.wav"
    data = (speech_like(0.625) * 32767).astype("<i2").tobytes()  # 10,000 samples
    fmt = struct.pack("<HHIIHH", 1, 1, 1, 2, 2, 16)
    path.write_bytes(b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<I", 16) + fmt
                     + b"data" + struct.pack("<I", len(data)) + data)
    return path


def fifo(tmp: Path) -> Path:
    path = tmp / "pipe.wav"
    os.mkfifo(path)
    return path


CASES: list[tuple[str, Callable[[Path], Path], int, str]] = [
    ("NaN samples", nan_wav, 65, "is corrupt: it holds samples that are not numbers (NaN or infinite)"),
    ("infinite samples", inf_wav, 65, "is corrupt: it holds samples that are not numbers (NaN or infinite)"),
    ("/dev/zero", lambda tmp: Path("/dev/zero"), 66, "is a character device, not an audio file"),
    ("a FIFO", fifo, 66, "is a FIFO (named pipe), not an audio file"),
    ("a header-only WAV", header_only_wav, 65, "holds no audio: its header declares no samples"),
    ("a WAV declaring 1 Hz", one_hertz_wav, 65, "declares a sample rate of 1 Hz: not audio (4000..768000 Hz)"),
]


@pytest.mark.parametrize("make, code, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_transcribe_the_daemon_and_check_name_the_file_for_what_it_is(tiny_bundle, tmp_path, make, code, message):
    path = make(tmp_path)
    runs = {"transcribe": run_edgeasr("transcribe", "--model", str(tiny_bundle), "--backend", "onnx", str(path)),
            "daemon": run_edgeasr("--input", str(path), "--set", f"model.path={tiny_bundle}",
                                  "--set", "encoder.backend=onnx"),
            "check": run_edgeasr("check", "--input", str(path), "--set", f"model.path={tiny_bundle}")}
    for name, proc in runs.items():
        assert "Traceback" not in proc.stderr and "RuntimeWarning" not in proc.stderr, (name, proc.stderr[-2000:])
        assert proc.returncode == code, (name, proc.stdout, proc.stderr[-2000:])
        assert str(path) in proc.stderr and message in proc.stderr, (name, proc.stderr[-2000:])
        assert proc.stdout.count("{") == 0 or name == "check"  # nothing transcribed


@pytest.mark.parametrize("make", [nan_wav, inf_wav])
def test_the_file_source_refuses_nan_where_it_reads_it(tmp_path, make):
    """In process: the daemon's source stops at the block holding NaN or inf, naming the file."""
    path = make(tmp_path)
    source = FileSource(path, realtime=False, block_ms=30)
    with pytest.raises(AudioError, match=f"{path.name} is corrupt"):
        while not source.ended:
            source.read(0.1)


def test_the_file_source_refuses_absurd_headers_before_reading(tmp_path):
    for make, message in ((header_only_wav, "holds no audio"), (one_hertz_wav, "declares a sample rate of 1 Hz")):
        with pytest.raises(AudioError, match=message):
            FileSource(make(tmp_path), realtime=False, block_ms=30)


def test_a_fifo_is_named_without_being_opened(tmp_path):
    """Opening a FIFO blocks until a writer comes: it is refused on what it is, at once."""
    path = fifo(tmp_path)
    done = threading.Event()

    def attempt() -> None:
        with pytest.raises(MissingInputError, match="is a FIFO"):
            FileSource(path, realtime=False, block_ms=30)
        done.set()

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    assert done.wait(5)
