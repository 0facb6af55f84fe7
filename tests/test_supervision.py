"""SupervisedEncoder's policy with a scripted fake device and a fake clock (no waiting).

The same paths run against HailoRT's stand-in in test_hailo_faults.py; here each rule is
pinned down on its own: retry on a reopened device, the failure count, the backoff and its
budget, what is not retried, what is not a device failure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers.hailo import FakeTime

from edgeasr.asr.supervision import (
    FAILED,
    MAX_BACKOFF_S,
    OK,
    RECOVERING,
    EncoderFailedError,
    SupervisedEncoder,
    encoder_health,
)
from edgeasr.errors import ConfigError, DeviceError, ModelError

MEL = np.ones((1, 1, 4, 2), np.float32)


class FakeChip:
    """The device: `stalls` encodes fail (-1: all of them), `present` decides whether it opens."""

    def __init__(self, stalls: int = 0) -> None:
        self.stalls, self.present, self.opens, self.encodes = stalls, True, 0, 0
        self.open_error: Exception | None = None

    def open(self) -> FakeEncoder:
        if self.open_error is not None:
            raise self.open_error
        if not self.present:
            raise DeviceError("no Hailo device found")
        self.opens += 1
        return FakeEncoder(self)


class FakeEncoder:
    backend = "hailo"

    def __init__(self, chip: FakeChip) -> None:
        self.chip, self.closed = chip, False

    def encode(self, mel: np.ndarray) -> np.ndarray:
        assert not self.closed, "encode on a closed device"
        chip = self.chip
        chip.encodes += 1
        if not chip.present:
            raise DeviceError("the Hailo device stopped answering (HAILO_DRIVER_OPERATION_FAILED)")
        if chip.stalls:
            chip.stalls -= 1
            raise DeviceError("the Hailo NPU did not answer (HAILO_TIMEOUT)")
        return mel * 2

    def close(self) -> None:
        self.closed = True


def supervised(chip: FakeChip, t: FakeTime, **kwargs) -> SupervisedEncoder:
    return SupervisedEncoder(chip.open, clock=t.clock, sleep=t.sleep, **kwargs)


def test_a_transient_failure_is_retried_on_a_reopened_device():
    chip, t = FakeChip(stalls=1), FakeTime()
    enc = supervised(chip, t)
    assert np.array_equal(enc.encode(MEL), MEL * 2)  # the window is not lost
    h = enc.health()
    assert (h.state, h.consecutive_failures, h.failures, h.reopens) == (OK, 0, 1, 1)
    assert "HAILO_TIMEOUT" in h.last_error and chip.opens == 2 and t.sleeps == [0.5]
    assert encoder_health(enc) is h and encoder_health(FakeEncoder(chip)).state == OK  # unsupervised: ok


def test_a_window_that_fails_again_is_lost_and_the_next_one_reopens():
    chip, t = FakeChip(stalls=2), FakeTime()
    enc = supervised(chip, t)
    with pytest.raises(EncoderFailedError, match="lost this window"):
        enc.encode(MEL)
    assert enc.health().state == RECOVERING and enc.health().consecutive_failures == 2
    assert np.array_equal(enc.encode(MEL), MEL * 2)  # reopened first, then it works
    h = enc.health()
    assert (h.state, h.consecutive_failures, h.failures, h.reopens) == (OK, 0, 2, 2)
    assert t.sleeps == [0.5, 1.0]  # the backoff grows with the failures in a row


def test_max_failures_in_a_row_fail_for_good():
    chip, t = FakeChip(stalls=-1), FakeTime()
    enc = supervised(chip, t, max_failures=3)
    with pytest.raises(EncoderFailedError, match="lost this window"):
        enc.encode(MEL)
    with pytest.raises(EncoderFailedError, match=r"failed for good: 3 failure\(s\) in a row \(encoder.max_failures\)"):
        enc.encode(MEL)
    encodes = chip.encodes
    with pytest.raises(EncoderFailedError, match="failed for good"):
        enc.encode(MEL)
    assert chip.encodes == encodes  # once failed, the device is left alone
    h = enc.health()
    assert (h.state, h.failures, h.consecutive_failures) == (FAILED, 3, 3) and h.failed


def test_a_device_that_does_not_come_back_fails_for_good_within_the_budget():
    chip, t = FakeChip(), FakeTime()
    enc = supervised(chip, t, reopen_timeout_s=5.0)
    chip.present = False
    with pytest.raises(EncoderFailedError, match=r"could not be reopened within encoder.reopen_timeout_s = 5 s"):
        enc.encode(MEL)
    h = enc.health()
    assert h.state == FAILED and h.failures == 1 and h.reopens == 0 and h.reopen_failures == len(t.sleeps)
    assert t.now <= 5.0 and max(t.sleeps) <= MAX_BACKOFF_S  # bounded retries
    assert "no Hailo device found" in h.last_error


def test_a_device_that_comes_back_within_the_budget():
    chip, t = FakeChip(), FakeTime()
    enc = supervised(chip, t, reopen_timeout_s=10.0)
    chip.present = False
    t.hooks[3] = lambda: setattr(chip, "present", True)  # back during the third backoff
    assert np.array_equal(enc.encode(MEL), MEL * 2)
    h = enc.health()
    assert (h.state, h.failures, h.reopens, h.reopen_failures) == (OK, 1, 1, 2)
    assert t.sleeps == [0.5, 1.0, 2.0]


def test_reopen_timeout_zero_means_one_attempt():
    chip, t = FakeChip(), FakeTime()
    enc = supervised(chip, t, reopen_timeout_s=0)
    chip.present = False
    with pytest.raises(EncoderFailedError, match="failed for good"):
        enc.encode(MEL)
    assert enc.health().reopen_failures == 1 and len(t.sleeps) == 1


def test_a_reopen_that_cannot_work_is_not_retried():
    chip, t = FakeChip(stalls=1), FakeTime()
    enc = supervised(chip, t)
    chip.open_error = ModelError("encoder.hef: HailoRT cannot read this HEF (HAILO_HEF_FILE_CORRUPTED)")
    with pytest.raises(EncoderFailedError, match="cannot be reopened: encoder.hef") as err:
        enc.encode(MEL)
    assert isinstance(err.value.__cause__, ModelError)
    assert enc.health().state == FAILED and enc.health().reopen_failures == 1 and len(t.sleeps) == 1


def test_max_failures_one_gives_up_without_a_retry():
    chip, t = FakeChip(stalls=1), FakeTime()
    enc = supervised(chip, t, max_failures=1)
    with pytest.raises(EncoderFailedError, match=r"1 failure\(s\) in a row"):
        enc.encode(MEL)
    assert chip.opens == 1 and t.sleeps == []


def test_a_bug_is_not_a_device_failure():
    chip, t = FakeChip(), FakeTime()
    enc = supervised(chip, t)
    with pytest.raises(TypeError):
        enc.encode(None)  # what a caller bug looks like: not counted, the device is kept
    assert enc.health() == type(enc.health())() and chip.opens == 1


def test_close():
    chip, t = FakeChip(), FakeTime()
    enc = supervised(chip, t)
    enc.close()
    enc.close()
    with pytest.raises(DeviceError, match="closed") as err:
        enc.encode(MEL)
    assert not isinstance(err.value, EncoderFailedError) and chip.opens == 1


def test_a_device_absent_at_start_fails_the_start():
    chip = FakeChip()
    chip.present = False
    with pytest.raises(DeviceError, match="no Hailo device found"):
        supervised(chip, FakeTime())


def test_config_keys():
    from edgeasr.config import load_config

    cfg = load_config(None, {"encoder.max_failures": 2, "encoder.reopen_timeout_s": 0})
    assert (cfg.encoder.max_failures, cfg.encoder.reopen_timeout_s) == (2, 0.0)
    assert load_config(None).encoder.max_failures == 5
    with pytest.raises(ConfigError, match=r"encoder.max_failures: 0 is not allowed \(1..1000\)"):
        load_config(None, {"encoder.max_failures": 0})
    with pytest.raises(ConfigError, match=r"encoder.reopen_timeout_s: 61 is not allowed \(0..60\)"):
        load_config(None, {"encoder.reopen_timeout_s": 61})


def test_the_cpu_encoder_goes_through_the_same_wrapper(tiny_bundle: Path):
    from edgeasr.asr.encoder import OnnxEncoder, create_encoder
    from edgeasr.bundle import load_bundle
    from edgeasr.config import EncoderConfig

    bundle = load_bundle(tiny_bundle)
    enc = create_encoder(bundle, EncoderConfig(backend="onnx"))
    mel = np.random.default_rng(0).standard_normal((1, 1, 1000, 80)).astype(np.float32)
    try:
        assert isinstance(enc, SupervisedEncoder) and enc.backend == "onnx"
        assert np.array_equal(enc.encode(mel), OnnxEncoder(bundle).encode(mel))
        assert enc.health().state == OK and enc.health().failures == 0
    finally:
        enc.close()


def test_the_daemon_reports_every_device_change_on_error_in_status_and_metrics():
    """Each change of the device's state goes to /error (a recovery marked resolved), also a
    stall the device recovered from between two of the daemon's looks (it shows only in the
    failure count); STATUS names a device that is not ok; /metrics carries its counters."""
    import dataclasses
    from types import SimpleNamespace

    from edgeasr.asr.supervision import DeviceHealth
    from edgeasr.config import load_config
    from edgeasr.daemon import Daemon, Outputs, metrics
    from edgeasr.home.source import VocabularySource
    from edgeasr.worker import WorkerStats

    health = [DeviceHealth()]
    engine = SimpleNamespace(encoder=SimpleNamespace(health=lambda: health[0]))
    errors: list[tuple[str, bool]] = []
    mqtt = SimpleNamespace(publish_error=lambda error, context=None, *, resolved=False: errors.append((error, resolved)),
                           health=lambda: SimpleNamespace(summary=lambda: ""))
    statuses: list[str] = []
    daemon = Daemon(load_config(None), engine=engine, worker=None, pipeline=None, server=None,
                    outputs=Outputs([], mqtt=mqtt), notifier=SimpleNamespace(status=statuses.append),
                    progress=None, model="m", backend="hailo",
                    vocabulary=VocabularySource.from_config(load_config(None)))
    daemon._watch_device()  # the first look
    health[0] = DeviceHealth(RECOVERING, 1, 1, 0, 0, "HAILO_TIMEOUT")
    daemon._watch_device()
    assert statuses[-1] == "listening; NPU recovering (1 failures: HAILO_TIMEOUT)"
    health[0] = DeviceHealth(OK, 0, 1, 1, 0, "HAILO_TIMEOUT")
    daemon._watch_device()
    assert statuses[-1] == "listening"
    health[0] = DeviceHealth(OK, 0, 2, 2, 0, "HAILO_TIMEOUT")  # stalled and recovered unseen
    daemon._watch_device()
    daemon._watch_device()  # nothing new: nothing sent
    assert errors == [("encoder device recovering", False),
                      ("encoder device ok again (1 failed encodes in all, 1 reopens)", True),
                      ("encoder device ok again (2 failed encodes in all, 2 reopens)", True)]
    worker = SimpleNamespace(stats=WorkerStats())
    assert metrics(engine, worker, None, None)["encoder"] == dataclasses.asdict(health[0])
