"""edgeasr.models.weights on the real tiny.en bundle: every initializer once, attributable
names, sizes that add up, and bf16 / int8 round trips within their precision."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from edgeasr.bundle import load_bundle
from edgeasr.errors import OutputError, UsageError
from edgeasr.models.weights import (
    GRAPH_ROLES,
    INT8_MAX,
    MANIFEST,
    dump_weights,
    from_bf16,
    from_int8,
    to_bf16,
    to_int8,
)

BF16_REL_RMS = 5e-3  # 8 significant bits: about 2^-9 relative per value
INT8_REL_RMS = 2e-2  # all int8 tensors together
# per tensor: Whisper's token embedding has a few outlier channels (a row's max is ~13x its
# RMS), which per-row scales cannot avoid; measured 3.1e-2 for tiny.en
INT8_REL_RMS_TENSOR = 4e-2


@pytest.fixture(scope="module")
def graphs(tiny_bundle) -> dict[str, dict[str, np.ndarray]]:
    bundle = load_bundle(tiny_bundle)
    out = {}
    for role in GRAPH_ROLES:
        if bundle.has(role):
            g = onnx.load(str(bundle.path(role))).graph
            out[role] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    assert {"encoder", "decoder_cross", "decoder_step", "hailo_decoder"} <= set(out)
    return out


@pytest.fixture(scope="module", params=["bf16", "int8"])
def dump(request, tiny_bundle, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp(f"weights_{request.param}")
    return out, dump_weights(tiny_bundle, request.param, out)


def read_back(out: Path, entry: dict) -> np.ndarray:
    stored = np.load(out / entry["file"])
    if entry["dtype"] == "bf16":
        assert stored.dtype == np.uint16
        return from_bf16(stored)
    if entry["dtype"] == "int8":
        assert stored.dtype == np.int8
        return from_int8(stored, np.load(out / entry["scale_file"]))
    return stored


def test_every_initializer_is_listed_once(dump, graphs):
    out, m = dump
    assert json.loads((out / MANIFEST).read_text()) == m
    listed = Counter((t["graph"], t["onnx_name"]) for t in m["tensors"])
    expected = Counter((g, name) for g, inits in graphs.items() for name in inits)
    assert listed == expected
    names = [t["name"] for t in m["tensors"]]
    assert len(names) == len(set(names))
    for t in m["tensors"]:
        assert t["shape"] == list(graphs[t["graph"]][t["onnx_name"]].shape)
        assert t["file"].startswith(t["graph"] + "/") and (out / t["file"]).is_file()


def test_every_weight_is_found_under_its_layer_and_module(dump, graphs):
    """The graphs name every initializer after the checkpoint's module, so the dump lays each
    one out under its graph, layer and module (k projections, which have no bias, too)."""
    _, m = dump
    for t in m["tensors"]:
        leaf = t["name"].rsplit("/", 1)[1]
        if len([d for d in t["shape"] if d > 1]) >= 2 and t["source_dtype"] == "float32":
            # every matrix is a module's weight (the positional tables included) or the mask
            assert leaf in ("weight", "causal_mask"), t
    components = {(t["graph"], t["layer"], t["component"]) for t in m["tensors"]}
    for graph in graphs:
        for layer in range(4):
            attention = "encoder_attn" if graph == "decoder_cross" else "self_attn"
            assert (graph, layer, f"{attention}/k_proj") in components, (graph, layer)
    by_name = {t["name"]: t for t in m["tensors"]}
    for layer in range(4):
        t = by_name[f"hailo_decoder/layer_{layer}/encoder_attn/k_proj/weight"]
        assert t["onnx_name"] == f"decoder.layers.{layer}.encoder_attn.k_proj.weight"
        assert t["shape"] == [384, 384] and t["layer"] == layer


def test_sizes_add_up(dump):
    out, m = dump
    s, tensors = m["summary"], m["tensors"]
    assert s["tensors"] == len(tensors)
    assert s["bytes"] == sum(t["bytes"] for t in tensors) == sum(b["bytes"] for b in s["by_dtype"].values())
    assert s["source_bytes"] == sum(t["source_bytes"] for t in tensors)
    assert sum(b["bytes"] for b in s["by_graph"].values()) == s["bytes"]
    for t in tensors:
        n = int(np.prod(t["shape"]))
        data = np.load(out / t["file"])
        scales = np.load(out / t["scale_file"]) if t["scale_file"] else np.zeros(0, np.float32)
        assert t["bytes"] == data.nbytes + scales.nbytes
        if t["dtype"] == "bf16":
            assert t["bytes"] == 2 * n and t["source_bytes"] == 4 * n
        elif t["dtype"] == "int8":
            assert scales.dtype == np.float32 and t["bytes"] == n + 4 * scales.shape[0]
        else:
            assert t["kept"] and t["bytes"] == t["source_bytes"]
    fraction = s["bytes"] / s["source_bytes"]
    print(f"\n{m['dtype']}: {s['bytes'] / 1e6:.1f} MB of {s['source_bytes'] / 1e6:.1f} MB fp32"
          f" ({fraction:.2f})")
    assert fraction < (0.51 if m["dtype"] == "bf16" else 0.26)


def test_round_trip_errors_are_what_is_stored(dump, graphs):
    out, m = dump
    for t in m["tensors"]:
        x = graphs[t["graph"]][t["onnx_name"]]
        back = read_back(out, t)
        if t["kept"]:
            np.testing.assert_array_equal(back, x)
            continue
        diff = back.astype(np.float64) - x
        assert np.max(np.abs(diff)) == pytest.approx(t["max_abs_error"], rel=1e-6, abs=1e-12)
        ref_sq = np.sum(x.astype(np.float64) ** 2)  # 0 for a zero constant: the dump says 0 then
        rel = np.sqrt(np.sum(diff**2) / ref_sq) if ref_sq > 0 else 0.0
        assert rel == pytest.approx(t["rel_rms_error"], rel=1e-5, abs=1e-12)


def test_round_trip_errors_are_small(dump):
    _, m = dump
    s = m["summary"]
    quantised = [t for t in m["tensors"] if not t["kept"]]
    assert len(quantised) > 100
    worst = max(t["rel_rms_error"] for t in quantised)
    print(f"\n{m['dtype']}: relative RMS {s['rel_rms_error']:.2e} overall, worst tensor {worst:.2e}")
    if m["dtype"] == "bf16":
        assert s["rel_rms_error"] < BF16_REL_RMS and worst < BF16_REL_RMS
        # only integer constants and the causal mask's -inf stay as they are
        assert {t["kept"] for t in m["tensors"] if t["kept"]} <= {"not floating point", "non-finite values"}
    else:
        assert s["rel_rms_error"] < INT8_REL_RMS and worst < INT8_REL_RMS_TENSOR
        assert all(len([d for d in t["shape"] if d > 1]) >= 2 for t in quantised)


def test_int8_error_is_at_most_half_a_step_per_row(graphs):
    w = graphs["decoder_step"]["decoder.layers.0.self_attn.q_proj.weight"]
    q, scale = to_int8(w)
    assert q.dtype == np.int8 and scale.shape == (w.shape[0], 1)
    assert np.abs(q).max() == INT8_MAX  # each row's largest value maps to the end of the range
    # float32 rounding of q * scale may add a hair to an exact half-step tie
    assert np.all(np.abs(from_int8(q, scale) - w) <= scale / 2 * (1 + 1e-4))


def test_bf16_rounds_to_nearest_even():
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, 0.0, 3.0e38], np.float32)
    back = from_bf16(to_bf16(x))
    # ties go to the even mantissa: 1 + 2^-8 -> 1, 1 + 3*2^-8 -> 1 + 2^-6
    np.testing.assert_array_equal(back, np.array([1.0, 1.0, 1.0 + 2**-6, -2.5, 0.0, back[5]], np.float32))
    assert abs(back[5] / x[5] - 1) < 2**-8


def test_a_new_dump_replaces_an_earlier_one(tiny_bundle, tmp_path):
    out = tmp_path / "w"
    dump_weights(tiny_bundle, "int8", out)
    assert list(out.rglob("*.scale.npy"))
    m = dump_weights(tiny_bundle, "bf16", out)
    assert not list(out.rglob("*.scale.npy"))
    assert len(list(out.rglob("*.npy"))) == len(m["tensors"])


def test_bad_dtype_and_foreign_directory_are_refused(tiny_bundle, tmp_path):
    with pytest.raises(UsageError, match="fp8"):
        dump_weights(tiny_bundle, "fp8", tmp_path / "w")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not a weights dump"):
        dump_weights(tiny_bundle, "bf16", tmp_path / "other")
