"""`models import ... --hef FILE`: a HEF built elsewhere (Hailo's published encoders) paired with
imported weights, through HailoRT's stand-in (with and without a device) and without HailoRT.

A "published HEF" here is a stand-in HEF written outside the bundle (as a download would be)
that runs an encoder ONNX: the bundle's own (the right weights), or a copy with its weights
shuffled (a HEF compiled from another model of the same shape, like Hailo's multilingual tiny
HEF next to tiny.en weights).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgeasr.bundle import load_bundle
from edgeasr.errors import MissingInputError, ModelError, UsageError
from edgeasr.models.hef_import import (
    HEF_MAGIC,
    MIN_SIMILARITY,
    attach_hef,
    guess_arch,
    precheck_hef,
    similarity,
)

PUBLISHED = "tiny-whisper-encoder-10s_15dB.hef"  # Hailo's name for its Hailo-8 tiny encoder


@pytest.fixture(scope="module")
def other_weights(tiny_bundle: Path, tmp_path_factory) -> Path:
    """tiny.en's encoder graph with every weight matrix's rows shuffled: another model."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(Path(tiny_bundle) / "encoder.onnx"))
    rng = np.random.default_rng(1)
    for init in model.graph.initializer:
        w = numpy_helper.to_array(init)
        if w.ndim >= 2 and w.size > 1000:
            shuffled = rng.permutation(w.reshape(w.shape[0], -1)).reshape(w.shape)
            init.CopyFrom(numpy_helper.from_array(shuffled, init.name))
    out = tmp_path_factory.mktemp("other") / "encoder.onnx"
    onnx.save(model, str(out))
    return out


def download(standin, bundle: Path, tmp_path: Path, name: str = PUBLISHED, **kwargs) -> Path:
    (tmp_path / "downloads").mkdir(exist_ok=True)
    return standin.write_hef(bundle, out=tmp_path / "downloads" / name, record=False, **kwargs)


def test_a_published_hef_is_checked_on_the_device_and_recorded(standin, hailo_bundle, tmp_path):
    from edgeasr.asr.encoder import create_encoder
    from edgeasr.config import EncoderConfig

    hef = download(standin, hailo_bundle, tmp_path)
    attached = attach_hef(hailo_bundle, hef)
    assert attached.path == hailo_bundle / "encoder.hailo8.hef" and attached.arch == "hailo8"
    assert "shapes fit (input (1, 1000, 80), output (1, 500, 384))" in attached.checked
    assert "features match the ONNX encoder's (similarity 1.000)" in attached.checked
    m = json.loads((hailo_bundle / "manifest.json").read_text())
    assert m["files"]["encoder_hef"]["path"] == "encoder.hailo8.hef"
    assert m["hailo"]["source"] == {"file": PUBLISHED, "kind": "published"}
    assert m["hailo"]["vstreams"]["input_shape"] == [1, 1000, 80]
    enc = create_encoder(load_bundle(hailo_bundle), EncoderConfig(backend="auto"))  # the daemon's way
    try:
        assert enc.backend == "hailo"
        assert enc.encode(np.zeros((1, 1, 1000, 80), np.float32)).shape == (1, 500, 384)
    finally:
        enc.close()


def test_a_hef_compiled_from_other_weights_is_refused(standin, hailo_bundle, tmp_path, other_weights):
    hef = download(standin, hailo_bundle, tmp_path, onnx=other_weights)
    before = (hailo_bundle / "manifest.json").read_text()
    with pytest.raises(ModelError) as err:
        attach_hef(hailo_bundle, hef)
    msg = str(err.value)
    assert "features do not match the bundle's encoder" in msg and "other weights" in msg
    assert float(msg.split("similarity ")[1].split(",")[0]) < MIN_SIMILARITY
    assert not (hailo_bundle / "encoder.hailo8.hef").exists()
    assert (hailo_bundle / "manifest.json").read_text() == before


def test_a_5_s_hef_needs_window_s_5(standin, hailo_bundle, tmp_path):
    hef = download(standin, hailo_bundle, tmp_path, name="base-whisper-encoder-5s.hef",
                   input_hwc=(1, 500, 80), output_shape=(1, 250, 384))
    with pytest.raises(UsageError, match=r"takes 500 mel frames \(5 s windows\).*--window-s 5$"):
        precheck_hef(hef, 10.0)  # before the import: nothing built yet
    assert precheck_hef(hef, 5.0).input == (1, 500, 80)
    with pytest.raises(ModelError, match=r"the bundle would take 1000 \(10 s\): import with --window-s 5"):
        attach_hef(hailo_bundle, hef)


def test_a_hef_for_another_model_size(standin, hailo_bundle, tmp_path):
    hef = download(standin, hailo_bundle, tmp_path, output_shape=(1, 500, 512))
    with pytest.raises(ModelError) as err:
        attach_hef(hailo_bundle, hef)
    msg = str(err.value)
    assert "512-wide features (Whisper base)" in msg and "Whisper tiny (384 wide)" in msg
    assert "openai/whisper-base" in msg


def test_a_hef_for_other_mel_bins(standin, hailo_bundle, tmp_path):
    hef = download(standin, hailo_bundle, tmp_path, input_hwc=(1, 1000, 128))
    with pytest.raises(ModelError, match="takes 128 mel bins, the model 80"):
        attach_hef(hailo_bundle, hef)


def test_without_a_device_the_shapes_are_still_checked(standin, hailo_bundle, tmp_path):
    hef = download(standin, hailo_bundle, tmp_path, name="tiny-whisper-encoder-10s_15dB_h8l.hef", arch="hailo8l")
    standin.set(devices="")
    attached = attach_hef(hailo_bundle, hef)
    assert attached.arch == "hailo8l" and attached.path.name == "encoder.hailo8l.hef"
    assert "shapes fit" in attached.checked and "features not compared (no Hailo device here)" in attached.checked


def test_without_hailort_the_hef_is_recorded_for_the_daemon_to_check(hailo_bundle, tmp_path):
    hef = tmp_path / PUBLISHED
    hef.write_bytes(HEF_MAGIC + bytes(range(256)) * 4)
    assert precheck_hef(hef, 10.0) is None
    attached = attach_hef(hailo_bundle, hef)
    assert attached.checked == "not checked here (no HailoRT): the daemon checks its shapes when it opens it"
    m = load_bundle(hailo_bundle).manifest
    assert m["files"]["encoder_hef"]["bytes"] == hef.stat().st_size and "vstreams" not in m["hailo"]
    assert (hailo_bundle / "encoder.hailo8.hef").read_bytes() == hef.read_bytes()


def test_not_a_hef(hailo_bundle, tmp_path):
    page = tmp_path / PUBLISHED
    page.write_text("<html><body>AccessDenied</body></html>")
    with pytest.raises(ModelError, match="not a HEF .*a failed download"):
        precheck_hef(page, 10.0)
    with pytest.raises(MissingInputError, match="--hef"):
        attach_hef(hailo_bundle, tmp_path / "missing.hef")


def test_guess_arch_and_similarity():
    assert guess_arch(Path("base-whisper-encoder-5s_h8l.hef")) == "hailo8l"
    assert guess_arch(Path("base-whisper-encoder-5s.hef")) == "hailo8"
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 50, 8)) + 10  # a shared offset does not count as agreement
    assert similarity(a, a) == pytest.approx(1.0)
    assert abs(similarity(a, rng.standard_normal((1, 50, 8)) + 10)) < 0.3


def test_the_import_command_takes_hef(standin, hailo_bundle, tmp_path, monkeypatch, capsys):
    """The CLI's wiring: a window that cannot fit fails before the import; otherwise the HEF
    is attached after it (the import itself is stubbed: the tiny bundle is copied)."""
    from edgeasr import cli
    from edgeasr.models import export

    imported = []

    def fake_import(sources, out, **kwargs):
        imported.append(kwargs["window_s"])
        shutil.copytree(hailo_bundle, out, symlinks=True)
        return load_bundle(out).manifest

    monkeypatch.setattr(export, "import_model", fake_import)
    five = download(standin, hailo_bundle, tmp_path, name="base-whisper-encoder-5s.hef",
                    input_hwc=(1, 500, 80), output_shape=(1, 250, 384))
    out = tmp_path / "imported"
    assert cli.main(["models", "import", "some-hf-dir", "--out", str(out), "--hef", str(five)]) == 64
    assert "--window-s 5" in capsys.readouterr().err and imported == []
    hef = download(standin, hailo_bundle, tmp_path)
    assert cli.main(["models", "import", "some-hf-dir", "--out", str(out), "--hef", str(hef)]) == 0
    printed = capsys.readouterr().out
    assert imported == [10.0] and f"encoder HEF for hailo8: {out / 'encoder.hailo8.hef'}; shapes fit" in printed
