"""edgeasr.lab.hailo.compile_hef without the Hailo DFC (x86-only, Developer Zone): the plan, the
printed commands, the model script, the manifest record, and the exit when the DFC is absent."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers.daemon import run_edgeasr

from edgeasr.bundle import load_bundle
from edgeasr.errors import MissingInputError, ModelError, ToolMissingError, UsageError
from edgeasr.lab.hailo.calibration_set import build_calibration_set
from edgeasr.lab.hailo.compile_hef import NET_NAME, compile_hef, model_script, parse_points
from edgeasr.models.hef_import import record_hef


@pytest.fixture(scope="module")
def calib(dev_dir, tiny_bundle, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("calib") / "calib.npy"
    return build_calibration_set(dev_dir / "audio", 8, out, load_bundle(tiny_bundle).audio)


@pytest.fixture
def no_dfc(monkeypatch, tmp_path):
    """An environment without the DFC: no hailo_sdk_client (not installable here), no `hailo`."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def conv_fed_by_input_transpose(onnx_path: Path) -> tuple[str, str]:
    g = onnx.load(str(onnx_path), load_external_data=False).graph
    transpose = next(n for n in g.node if n.input and n.input[0] == g.input[0].name)
    conv = next(n for n in g.node if transpose.output[0] in n.input)
    end = next(n for n in g.node if g.output[0].name in n.output)
    return conv.name, end.name


def test_parse_starts_at_the_first_conv(tiny_bundle):
    onnx_path = Path(tiny_bundle) / "encoder.onnx"
    start, end, shape = parse_points(onnx_path)
    assert (start, end) == conv_fed_by_input_transpose(onnx_path)
    assert shape == (1, 80, 1, 1000)  # NCHW at the conv; the HEF then takes NHWC (1, 1000, 80)


def test_dry_run_prints_the_dfc_commands(hailo_bundle, calib, no_dfc):
    cmds = compile_hef(hailo_bundle, "hailo8l", calib, None, dry_run=True)
    start, end = conv_fed_by_input_transpose(hailo_bundle / "encoder.onnx")
    work = hailo_bundle / "hailo-build" / "hailo8l"
    assert [shlex.split(c) for c in cmds] == [
        [
            "hailo",
            "parser",
            "onnx",
            str(hailo_bundle / "encoder.onnx"),
            "--net-name",
            NET_NAME,
            "--hw-arch",
            "hailo8l",
            "--start-node-names",
            start,
            "--end-node-names",
            end,
            "--har-path",
            str(work / f"{NET_NAME}.har"),
            "-y",
        ],
        [
            "hailo",
            "optimize",
            str(work / f"{NET_NAME}.har"),
            "--hw-arch",
            "hailo8l",
            "--calib-set-path",
            str(calib),
            "--model-script",
            str(work / f"{NET_NAME}.alls"),
            "--output-har-path",
            str(work / f"{NET_NAME}_optimized.har"),
        ],
        [
            "hailo",
            "compiler",
            str(work / f"{NET_NAME}_optimized.har"),
            "--hw-arch",
            "hailo8l",
            "--output-dir",
            str(work),
        ],
        ["cp", str(work / f"{NET_NAME}.hef"), str(hailo_bundle / "encoder.hailo8l.hef")],
    ]
    assert (work / f"{NET_NAME}.alls").read_text() == model_script(8)
    assert "encoder_hef" not in load_bundle(hailo_bundle).manifest["files"]  # nothing compiled


def test_dry_run_from_the_command_line(hailo_bundle):
    done = run_edgeasr("models", "compile-hef", str(hailo_bundle), "--arch", "hailo8", "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert [shlex.split(c)[:2] for c in lines] == [
        ["hailo", "parser"],
        ["hailo", "optimize"],
        ["hailo", "compiler"],
        ["cp", str(hailo_bundle / "hailo-build" / "hailo8" / f"{NET_NAME}.hef")],
    ]
    assert "--calib-set-path CALIB.npy" in lines[1]  # no --calib: a placeholder to fill in


def test_without_the_dfc(hailo_bundle, calib, no_dfc):
    with pytest.raises(ToolMissingError) as err:
        compile_hef(hailo_bundle, "hailo8", calib, None, dry_run=False)
    assert "Hailo Dataflow Compiler >= 3.27" in str(err.value) and "--dry-run" in str(err.value)
    assert err.value.exit_code == 69


def test_without_the_dfc_from_the_command_line(hailo_bundle, calib, tmp_path):
    # no `hailo` on PATH
    done = run_edgeasr("models", "compile-hef", str(hailo_bundle), "--arch", "hailo8", "--calib", str(calib),
                       env={"PATH": str(tmp_path)})
    assert done.returncode == 69
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("edgeasr: compiling a HEF needs the Hailo Dataflow Compiler >= 3.27")


def test_bad_arguments(hailo_bundle, calib, tmp_path):
    with pytest.raises(UsageError, match="--arch must be one of hailo8, hailo8l"):
        compile_hef(hailo_bundle, "hailo10h", calib, None, dry_run=True)
    with pytest.raises(UsageError, match="--calib FILE is required"):
        compile_hef(hailo_bundle, "hailo8", None, None, dry_run=False)
    with pytest.raises(MissingInputError, match="--calib"):
        compile_hef(hailo_bundle, "hailo8", tmp_path / "none.npy", None, dry_run=True)
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((4, 1, 500, 80), np.float32))  # a 5 s set for a 10 s bundle
    with pytest.raises(ModelError, match=r"expected float32 \(N, 1, 1000, 80\)"):
        compile_hef(hailo_bundle, "hailo8", wrong, None, dry_run=True)


def test_model_script_follows_the_calibration_size():
    big, small = model_script(4000), model_script(8)
    assert "finetune, policy=enabled, dataset_size=3340, epochs=6" in big
    assert "calibration, batch_size=8, calibset_size=1024" in big
    assert "finetune, policy=disabled" in small and "calibset_size=8" in small
    for script in (big, small):
        assert "optimization_level=2, compression_level=0" in script
        assert "optimize_for_batch=1" in script


def test_record_hef_and_run_it(standin, hailo_bundle):
    # The stand-in HEF writer records through record_hef, as compile-hef does after the DFC.
    hef = standin.write_hef(hailo_bundle, arch="hailo8")
    bundle = load_bundle(hailo_bundle, verify_checksums=True)
    entry = bundle.manifest["files"]["encoder_hef"]
    assert entry["path"] == "encoder.hailo8.hef" and entry["arch"] == "hailo8"
    assert bundle.path("encoder_hef") == hef
    assert bundle.manifest["hailo"]["vstreams"]["input_shape"] == [1, 1000, 80]
    outside = hailo_bundle.parent / "elsewhere.hef"
    outside.write_bytes(hef.read_bytes())
    m = record_hef(hailo_bundle, outside, "hailo8l")
    assert m["files"]["encoder_hef"]["path"] == "encoder.hailo8.hef"  # not recorded: outside the bundle
    assert json.loads((hailo_bundle / "manifest.json").read_text()) == m
