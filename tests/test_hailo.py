"""edgeasr.asr.hailo through the HailoRT stand-in (tests/hailo_standin, pyhailort 4.23 API).

The stand-in runs the bundle's Hailo-ready encoder ONNX with onnxruntime in float32, so the
NPU path must give the onnxruntime encoder's features; what differs is everything around it:
HailoRT's call sequence, shapes, layouts and failures, which the stand-in reproduces.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgeasr.asr.features import MelSpec, log_mel
from edgeasr.asr.hailo import HailoEncoder, hailo_available
from edgeasr.audio.files import load_audio
from edgeasr.bundle import load_bundle
from edgeasr.errors import ConfigError, DeviceError, MissingInputError, ModelError, ToolMissingError

TOLERANCE = 1e-4  # max |difference| between the NPU path and onnxruntime, both fp32
CLIP = "jfk_inaugural-1961.wav"


@pytest.fixture(scope="module")
def clip_mel(dev_dir: Path, tiny_bundle: Path) -> np.ndarray:
    """The first window of a real dev clip as the daemon computes it: NHWC [1, 1, F, M]."""
    a = load_bundle(tiny_bundle).audio
    spec = MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, a.n_frames)
    return log_mel(load_audio(dev_dir / "audio" / CLIP, a.sample_rate)[: spec.n_samples], spec)


@pytest.fixture(scope="module")
def reference(tiny_bundle: Path, clip_mel: np.ndarray) -> np.ndarray:
    """onnxruntime on the bundle's fp32 encoder.onnx: the CPU backend's features."""
    session = ort.InferenceSession(
        str(Path(tiny_bundle) / "encoder.onnx"), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"mel": clip_mel})[0]


def encoder(bundle_dir: Path, hef: Path, **kwargs) -> HailoEncoder:
    opts = {"timeout_ms": 2000, "scheduler": "round_robin", "service_group": None, **kwargs}
    return HailoEncoder(
        hef, load_bundle(bundle_dir), opts["timeout_ms"], opts["scheduler"], opts["service_group"]
    )


@pytest.mark.parametrize(
    ("version", "scheduler", "api"),
    [
        ("4.23.0", "round_robin", "InferModel"),
        ("4.23.0", "none", "InferModel"),
        ("4.18.0", "round_robin", "InferModel"),
        ("4.17.0", "round_robin", "InferVStreams"),
        ("4.17.0", "none", "InferVStreams"),
    ],
)
def test_npu_features_match_onnxruntime(standin, hailo_bundle, clip_mel, reference, version, scheduler, api):
    standin.set(version=version)
    hef = standin.write_hef(hailo_bundle)
    with encoder(hailo_bundle, hef, scheduler=scheduler) as enc:
        assert enc.api == api
        first = enc.encode(clip_mel)
        again = enc.encode(clip_mel)  # the bindings are reused between calls
    assert first.shape == reference.shape == (1, 500, 384)
    assert first.dtype == np.float32
    assert np.abs(first - reference).max() <= TOLERANCE
    assert np.array_equal(first, again)


def test_hailo8l_hef_runs_on_a_hailo8(standin, hailo_bundle, clip_mel, reference):
    # HailoRT accepts Hailo-8L HEFs on a Hailo-8 (DeviceBase::is_hef_compatible), slower.
    hef = standin.write_hef(hailo_bundle, arch="hailo8l")
    with encoder(hailo_bundle, hef) as enc:
        assert np.abs(enc.encode(clip_mel) - reference).max() <= TOLERANCE


@pytest.mark.parametrize(
    ("version", "status"),
    [("4.23.0", "HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE"), ("4.20.0", "HAILO_INVALID_HEF")],
)
def test_hef_for_another_chip(standin, hailo_bundle, version, status):
    standin.set(version=version, devices="hailo8l")
    hef = standin.write_hef(hailo_bundle, arch="hailo8")
    with pytest.raises(DeviceError) as err:
        encoder(hailo_bundle, hef)
    msg = str(err.value)
    assert "HEF was compiled for hailo8 but the device is hailo8l" in msg
    assert status in msg and "--arch hailo8l" in msg and "\n" not in msg


def test_device_held_by_another_process(standin, hailo_bundle):
    hef = standin.write_hef(hailo_bundle)
    holder = textwrap.dedent(f"""
        import sys
        from edgeasr.bundle import load_bundle
        from edgeasr.asr.hailo import HailoEncoder
        enc = HailoEncoder({str(hef)!r}, load_bundle({str(hailo_bundle)!r}), 2000, "round_robin", None)
        print("holding", flush=True)
        sys.stdin.readline()
        enc.close()
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", holder],
        env=standin.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "holding"
        with pytest.raises(DeviceError) as err:
            encoder(hailo_bundle, hef)
        msg = str(err.value)
        assert "busy" in msg and "HAILO_OUT_OF_PHYSICAL_DEVICES" in msg
        assert "encoder.service_group" in msg and "hailort.service" in msg
    finally:
        proc.communicate("\n", timeout=60)
    assert proc.returncode == 0
    with encoder(hailo_bundle, hef) as enc:  # released: free again
        assert enc.api == "InferModel"


def test_service_group_shares_the_device(standin, hailo_bundle, clip_mel, reference):
    standin.set(service="running")
    hef = standin.write_hef(hailo_bundle)
    with (
        encoder(hailo_bundle, hef, service_group="SHARED") as a,
        encoder(hailo_bundle, hef, service_group="SHARED") as b,
    ):
        assert np.abs(a.encode(clip_mel) - reference).max() <= TOLERANCE
        assert np.abs(b.encode(clip_mel) - reference).max() <= TOLERANCE


def test_service_group_without_hailort_service(standin, hailo_bundle):
    hef = standin.write_hef(hailo_bundle)
    with pytest.raises(DeviceError, match=r"hailort.service is not reachable \(HAILO_RPC_FAILED\)"):
        encoder(hailo_bundle, hef, service_group="SHARED")


@pytest.mark.parametrize("version", ["4.23.0", "4.17.0"])
def test_timeout(standin, hailo_bundle, clip_mel, version):
    standin.set(version=version, latency_ms="400")
    hef = standin.write_hef(hailo_bundle)
    with encoder(hailo_bundle, hef, timeout_ms=50) as enc, pytest.raises(DeviceError) as err:
        enc.encode(clip_mel)
    assert "within encoder.timeout_ms = 50 ms" in str(err.value) and "HAILO_TIMEOUT" in str(err.value)


def test_no_device(standin, hailo_bundle):
    hef = standin.write_hef(hailo_bundle)
    standin.set(devices="")
    with pytest.raises(DeviceError, match="no Hailo device found"):
        encoder(hailo_bundle, hef)


def test_driver_and_library_versions_differ(standin, hailo_bundle):
    standin.set(driver_version="4.20.0")
    hef = standin.write_hef(hailo_bundle)
    with pytest.raises(
        DeviceError,
        match=r"HailoRT 4.23.0 and the hailo PCIe driver are different versions "
        r"\(HAILO_INVALID_DRIVER_VERSION\)",
    ):
        encoder(hailo_bundle, hef)


def test_pyhailort_wheel_and_library_differ(standin, hailo_bundle):
    hef = standin.write_hef(hailo_bundle)
    standin.set(lib_version="4.20.0")
    with pytest.raises(ToolMissingError, match="does not match pyhailort version"):
        encoder(hailo_bundle, hef)


def test_hef_for_another_window(standin, hailo_bundle):
    hef = standin.write_hef(hailo_bundle, input_hwc=(1, 500, 80))  # a 5 s HEF, as Hailo's base
    with pytest.raises(ModelError) as err:
        encoder(hailo_bundle, hef)
    msg = str(err.value)
    assert "edgeasr_encoder/input_layer1 is (1, 500, 80)" in msg and "(1, 1000, 80)" in msg


def test_hef_vstream_names_must_match_the_manifest(standin, hailo_bundle):
    import json

    hef = standin.write_hef(hailo_bundle)
    manifest = hailo_bundle / "manifest.json"
    m = json.loads(manifest.read_text())
    m["hailo"]["vstreams"]["output"] = "edgeasr_encoder/conv52"
    manifest.write_text(json.dumps(m))
    with pytest.raises(ModelError, match="hailo.vstreams.output says 'edgeasr_encoder/conv52'"):
        encoder(hailo_bundle, hef)


def test_not_a_hef(standin, hailo_bundle):
    bad = hailo_bundle / "encoder.hef"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelError, match="cannot read this HEF \\(HAILO_HEF_NOT_SUPPORTED\\)"):
        encoder(hailo_bundle, bad)
    with pytest.raises(MissingInputError, match="encoder.hef"):
        encoder(hailo_bundle, hailo_bundle / "missing.hef")


def test_bad_settings(standin, hailo_bundle):
    hef = standin.write_hef(hailo_bundle)
    with pytest.raises(ConfigError, match="encoder.scheduler"):
        encoder(hailo_bundle, hef, scheduler="fifo")
    with pytest.raises(ConfigError, match="encoder.service_group needs encoder.scheduler: round_robin"):
        encoder(hailo_bundle, hef, scheduler="none", service_group="SHARED")
    with pytest.raises(ConfigError, match="encoder.timeout_ms"):
        encoder(hailo_bundle, hef, timeout_ms=0)


def test_wrong_input_and_closed_encoder(standin, hailo_bundle, clip_mel):
    enc = encoder(hailo_bundle, standin.write_hef(hailo_bundle))
    with pytest.raises(ValueError, match=r"\(1, 1, 1000, 80\)"):
        enc.encode(clip_mel[:, :, :500])
    enc.close()
    enc.close()
    with pytest.raises(DeviceError, match="closed"):
        enc.encode(clip_mel)


def test_without_hailort(hailo_bundle, tmp_path):
    # No hailo_platform in this environment (the stand-in is not on sys.path here).
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "hailo0").touch()
    assert hailo_available(tmp_path / "dev") is False
    assert hailo_available() is False
    hef = hailo_bundle / "encoder.hef"
    hef.write_bytes(b"x")
    with pytest.raises(ToolMissingError, match="needs HailoRT's Python package hailo_platform"):
        HailoEncoder(hef, load_bundle(hailo_bundle), 2000, "round_robin", None)


def test_hailo_available_with_the_standin(standin, tmp_path):
    empty_dev = tmp_path / "dev"
    empty_dev.mkdir()
    assert hailo_available(empty_dev) is True  # HailoRT's Device.scan() finds the device
    standin.set(devices="")
    assert hailo_available(empty_dev) is False


def test_create_encoder_picks_the_npu(standin, hailo_bundle, clip_mel, reference):
    from edgeasr.asr.encoder import create_encoder
    from edgeasr.config import EncoderConfig

    standin.write_hef(hailo_bundle)
    enc = create_encoder(load_bundle(hailo_bundle), EncoderConfig(backend="auto"))
    try:
        assert enc.backend == "hailo"
        assert np.abs(enc.encode(clip_mel) - reference).max() <= TOLERANCE
    finally:
        enc.close()


def test_standin_follows_hailort(standin, hailo_bundle, clip_mel, reference):
    """The stand-in's own contract, as read from pyhailort 4.23: shapes without batch, the
    vstreams API's batch axis, the exception classes and their status causes."""
    import hailo_platform as hp

    hef_path = standin.write_hef(hailo_bundle, arch="hailo8")
    hef = hp.HEF(str(hef_path))
    info = hef.get_input_vstream_infos()[0]
    assert (info.name, info.shape) == ("edgeasr_encoder/input_layer1", (1, 1000, 80))
    assert hp.VDevice.create_params().scheduling_algorithm == hp.HailoSchedulingAlgorithm.NONE
    params = hp.VDevice.create_params()
    params.scheduling_algorithm = hp.HailoSchedulingAlgorithm.ROUND_ROBIN
    with hp.VDevice(params) as vdevice:
        with pytest.raises(hp.HailoRTException) as busy:
            hp.VDevice(params)
        assert str(busy.value) == "libhailort failed with error: 74 (HAILO_OUT_OF_PHYSICAL_DEVICES)"
        assert busy.value.__cause__.args == ("74",)
        model = vdevice.create_infer_model(str(hef_path))
        assert model.input().shape == [1, 1000, 80] and model.output().shape == [1, 500, 384]
        group = vdevice.configure(hef, hp.ConfigureParams.create_from_hef(hef, hp.HailoStreamInterface.PCIe))[
            0
        ]
        float32 = {"format_type": hp.FormatType.FLOAT32}
        ivp = hp.InputVStreamParams.make(group, **float32)
        ovp = hp.OutputVStreamParams.make(group, **float32)
        with hp.InferVStreams(group, ivp, ovp) as pipeline:
            out = pipeline.infer({info.name: clip_mel})["edgeasr_encoder/layer_normalization5"]
        assert out.shape == (1, 1, 500, 384)  # [batch, *vstream shape]
        assert np.abs(out.reshape(reference.shape) - reference).max() <= TOLERANCE
    standin.set(devices="hailo8l")
    import hailo_platform as hp  # the new system
    from hailo_platform.pyhailort.pyhailort import HailoRTHEFNotCompatibleWithDevice

    with hp.VDevice() as vdevice, pytest.raises(HailoRTHEFNotCompatibleWithDevice) as wrong:
        vdevice.create_infer_model(str(hef_path)).configure()
    assert wrong.value.__cause__.args == ("93",)


def test_standin_faults_follow_hailort(standin, hailo_bundle, clip_mel):
    """Faults injected through the control file, as HailoRT 4.23 shows them (standin_control.py):
    a lost device empties the scan, refuses new VDevices (74) and fails every call on an open
    one (36, the driver's ENODEV) even once it is back; a stall is HAILO_TIMEOUT for as many
    frames as asked."""
    import json

    import hailo_platform as hp
    from hailo_platform.pyhailort.pyhailort import HailoRTDriverOperationFailedException, HailoRTTimeout

    hef = str(standin.write_hef(hailo_bundle))
    params = hp.VDevice.create_params()
    params.scheduling_algorithm = hp.HailoSchedulingAlgorithm.ROUND_ROBIN

    def run(vdevice) -> np.ndarray:
        model = vdevice.create_infer_model(hef)
        model.input().set_format_type(hp.FormatType.FLOAT32)
        model.output().set_format_type(hp.FormatType.FLOAT32)
        configured = model.configure()
        out = np.zeros(model.output().shape, np.float32)
        bindings = configured.create_bindings(output_buffers={model.output().name: out})
        bindings.input().set_buffer(np.ascontiguousarray(clip_mel.reshape(model.input().shape)))
        configured.run([bindings], 2000)
        return out

    with hp.VDevice(params) as before:
        healthy = run(before)
        standin.control(lost=True)
        assert hp.Device.scan() == []
        with pytest.raises(hp.HailoRTException, match=r"74 \(HAILO_OUT_OF_PHYSICAL_DEVICES\)"):
            hp.VDevice(params)
        with pytest.raises(HailoRTDriverOperationFailedException) as gone:
            run(before)
        assert gone.value.__cause__.args == ("36",)
        standin.control()  # back on the bus: a new board, the old handle stays dead
        with pytest.raises(HailoRTDriverOperationFailedException):
            run(before)
    with hp.VDevice(params) as after:
        assert np.array_equal(run(after), healthy)
        standin.control(latency_ms=60_000, for_frames=1)
        with pytest.raises(HailoRTTimeout):
            run(after)
        assert json.loads(standin.control_file.read_text()) == {"latency_ms": 60_000, "for_frames": 0}
        assert np.array_equal(run(after), healthy)


def test_status_names_across_hailort_versions():
    """status_name reads pyhailort's classes whose text names no status, in 4.18-4.23."""
    from edgeasr.asr.hailo_errors import DEVICE_GONE, status_name

    class HailoRTPCIeDriverException(Exception):  # 4.18/4.19: status 36 was HAILO_DRIVER_FAIL
        pass

    class HailoRTDriverOperationFailedException(Exception):  # 4.20+: HAILO_DRIVER_OPERATION_FAILED
        pass

    old = HailoRTPCIeDriverException("PCIe driver failure. run 'dmesg | grep hailo' for more information")
    new = HailoRTDriverOperationFailedException("Failure in hailort driver ioctl.")
    assert {status_name(old), status_name(new)} <= DEVICE_GONE
    assert status_name(RuntimeError("libhailort failed with error: 74 (HAILO_OUT_OF_PHYSICAL_DEVICES)")) == (
        "HAILO_OUT_OF_PHYSICAL_DEVICES")
    assert status_name(RuntimeError("no status here")) is None
