"""NPU faults while the engine runs, through HailoRT's stand-in: the supervised encoder must
keep the daemon hearing (before it, one timeout left the Hailo encoder closed for good).

Faults come from the stand-in's control file (tests/hailo_standin/standin_control.py):
a stall (frames slower than encoder.timeout_ms: HAILO_TIMEOUT), a lost device (scan lists
nothing, ioctls fail with HAILO_DRIVER_OPERATION_FAILED). The engine is the daemon's
(CPU decoder) with the supervised Hailo encoder; the backoff sleeps on a fake clock, whose
hooks change the chip at chosen points, so the tests wait only for HailoRT's own timeouts.
Outcomes checked: texts (a retried window gives the text a healthy chip gives), counts, states.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers.engines import make_engine
from helpers.hailo import FakeTime

from edgeasr.asr.encoder import create_encoder
from edgeasr.asr.engine import EngineSessions
from edgeasr.asr.supervision import FAILED, OK, RECOVERING, EncoderFailedError
from edgeasr.asr.transcriber import Transcriber
from edgeasr.audio.files import load_audio
from edgeasr.bundle import load_bundle
from edgeasr.config import load_config

REPO = Path(__file__).resolve().parents[1]
CLIPS = ("ljs_LJ001-0009.wav", "ls_test-other_1998-15444-0004.wav")  # one window each
TIMEOUT_MS = 2000  # a healthy frame takes well under this, even on a busy machine
STALL_MS = 60_000  # a stalled frame: far past the timeout


@pytest.fixture(scope="module")
def clips(dev_dir: Path) -> list[np.ndarray]:
    return [load_audio(dev_dir / "audio" / name, 16000) for name in CLIPS]


def npu_engine(standin, bundle_dir: Path, t: FakeTime, version: str = "4.23.0", **keys):
    """The daemon's engine with the supervised Hailo encoder on the stand-in."""
    standin.set(version=version)
    standin.write_hef(bundle_dir)
    cpu = make_engine(bundle_dir)
    cpu.encoder.close()  # make_engine's CPU encoder, replaced by the NPU one
    cfg = load_config(None, {"encoder.backend": "hailo", "encoder.timeout_ms": TIMEOUT_MS, **keys})
    encoder = create_encoder(load_bundle(bundle_dir), cfg.encoder, clock=t.clock, sleep=t.sleep)
    s = cpu.sessions
    engine = Transcriber(EngineSessions(s.bundle, encoder, s.decoder, s.precision, s.threads), cpu.options, cpu.vad)
    assert engine.encoder.backend == "hailo"
    return engine


@pytest.mark.parametrize("version", ["4.23.0", "4.17.0"])  # InferModel, InferVStreams
def test_a_transient_stall_loses_nothing(standin, hailo_bundle, clips, version):
    t = FakeTime()
    engine = npu_engine(standin, hailo_bundle, t, version)
    healthy = [engine.transcribe(c).text for c in clips]
    assert all(healthy)
    standin.control(latency_ms=STALL_MS)  # the chip stalls ...
    t.hooks[1] = standin.control  # ... and is fast again by the end of the first backoff
    assert engine.transcribe(clips[0]).text == healthy[0]  # the timed-out window, retried
    h = engine.encoder.health()
    assert (h.state, h.failures, h.consecutive_failures, h.reopens) == (OK, 1, 0, 1)
    assert "HAILO_TIMEOUT" in h.last_error
    assert engine.transcribe(clips[1]).text == healthy[1]  # and the next windows transcribe
    assert engine.encoder.health().failures == 1


def test_a_permanent_stall_fails_for_good_after_max_failures(standin, hailo_bundle, clips):
    t = FakeTime()
    engine = npu_engine(standin, hailo_bundle, t, **{"encoder.max_failures": 3})
    assert engine.transcribe(clips[0]).text
    standin.control(latency_ms=STALL_MS)
    with pytest.raises(EncoderFailedError, match="lost this window"):
        engine.transcribe(clips[1])  # the window and its retry time out
    h = engine.encoder.health()
    assert (h.state, h.consecutive_failures, h.reopens) == (RECOVERING, 2, 1)
    with pytest.raises(EncoderFailedError, match=r"failed for good: 3 failure\(s\) in a row"):
        engine.transcribe(clips[0])
    with pytest.raises(EncoderFailedError, match="failed for good"):
        engine.transcribe(clips[1])  # at once: the device is left alone
    h = engine.encoder.health()
    assert (h.state, h.failures, h.reopens) == (FAILED, 3, 2)
    assert t.sleeps == [0.5, 1.0]


def test_a_lost_device_fails_for_good_when_it_does_not_come_back(standin, hailo_bundle, clips, caplog):
    t = FakeTime()
    engine = npu_engine(standin, hailo_bundle, t, **{"encoder.reopen_timeout_s": 8})
    assert engine.transcribe(clips[0]).text
    standin.control(lost=True)
    with pytest.raises(EncoderFailedError, match="could not be reopened within encoder.reopen_timeout_s = 8 s"):
        engine.transcribe(clips[1])
    h = engine.encoder.health()
    assert (h.state, h.failures, h.reopens) == (FAILED, 1, 0) and h.reopen_failures >= 2
    assert "no Hailo device found" in h.last_error
    assert "HAILO_DRIVER_OPERATION_FAILED" in caplog.text  # how the lost device showed itself
    assert t.now <= 8


@pytest.mark.parametrize("version", ["4.23.0", "4.17.0"])
def test_a_lost_device_that_comes_back_within_the_budget(standin, hailo_bundle, clips, version):
    t = FakeTime()
    engine = npu_engine(standin, hailo_bundle, t, version)
    healthy = engine.transcribe(clips[1]).text
    standin.control(lost=True)
    t.hooks[2] = standin.control  # back (re-probed) during the second backoff
    assert engine.transcribe(clips[1]).text == healthy
    h = engine.encoder.health()
    assert (h.state, h.failures, h.reopens, h.reopen_failures) == (OK, 1, 1, 1)
    assert engine.transcribe(clips[0]).text


def test_the_control_file_reaches_a_child_process(standin, hailo_bundle, tmp_path):
    """The daemon runs as a child: the same faults reach it through the control file. The
    child encodes on command with the real clock; the device goes away and comes back while
    it retries (the parent waits for the child's log line, not for a time)."""
    hef = standin.write_hef(hailo_bundle)
    child = textwrap.dedent(f"""
        import hashlib, logging, sys
        import numpy as np
        from edgeasr.asr.encoder import create_encoder
        from edgeasr.bundle import load_bundle
        from edgeasr.config import load_config
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        cfg = load_config(None, {{"encoder.backend": "hailo", "encoder.hef": {str(hef)!r},
                                  "encoder.reopen_timeout_s": 60}})
        enc = create_encoder(load_bundle({str(hailo_bundle)!r}), cfg.encoder)
        mel = np.linspace(-1, 1, 80000, dtype=np.float32).reshape(1, 1, 1000, 80)
        for line in sys.stdin:
            h = enc.health()
            try:
                out = hashlib.sha256(enc.encode(mel).tobytes()).hexdigest()[:16]
            except Exception as exc:
                out = type(exc).__name__
            h = enc.health()
            print(out, h.state, h.failures, h.reopens, h.reopen_failures, flush=True)
        enc.close()
    """)
    env = standin.env()
    env["PYTHONPATH"] += os.pathsep + str(REPO)
    proc = subprocess.Popen([sys.executable, "-c", child], env=env, cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write("encode\n")
        proc.stdin.flush()
        first = proc.stdout.readline().split()
        assert first[1:] == ["ok", "0", "0", "0"], first
        standin.control(lost=True)
        proc.stdin.write("encode\n")
        proc.stdin.flush()
        log = ""
        while "reopening the hailo encoder failed" not in log:  # the child is retrying
            line = proc.stderr.readline()
            assert line, log
            log += line
        assert "HAILO_DRIVER_OPERATION_FAILED" in log and "no Hailo device found" in log
        standin.control()  # the device is back
        again = proc.stdout.readline().split()
        assert again[0] == first[0] and again[1:3] == ["ok", "1"] and again[3] == "1", again
        assert int(again[4]) >= 1
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert proc.returncode == 0
