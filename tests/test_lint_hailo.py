"""edgeasr.lab.hailo.lint: the bundle's real encoder passes; small graphs built with
onnx.helper break one rule each and must be reported by node name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeasr.errors import MissingInputError, ModelError
from edgeasr.lab.hailo.lint import Violation, lint

F, M, D = 100, 80, 16  # a small NHWC mel window and conv width


def tensor(name: str, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def const(name: str, values, dtype=np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def conv2d_graph(
    nodes_after: list | None = None,
    mel_dims: list | None = None,
    opset: int = 13,
    extra_inits: list | None = None,
    out_dims: list | None = None,
) -> onnx.ModelProto:
    """mel NHWC -> Transpose -> Conv2D(1x3) [-> nodes_after] -> out: the encoder's front, valid."""
    w = numpy_helper.from_array(np.zeros((D, M, 1, 3), np.float32), "w")
    nodes = [
        helper.make_node("Transpose", ["mel"], ["nchw"], name="/Transpose", perm=[0, 3, 1, 2]),
        helper.make_node(
            "Conv", ["nchw", "w"], ["conv"], name="/conv1/Conv", kernel_shape=[1, 3], pads=[0, 1, 0, 1]
        ),
    ]
    last = "conv"
    for node in nodes_after or []:
        nodes.append(node)
        last = node.output[0]
    nodes.append(helper.make_node("Identity", [last], ["out"], name="/out"))
    graph = helper.make_graph(
        nodes,
        "g",
        [tensor("mel", mel_dims or [1, 1, F, M])],
        [tensor("out", out_dims or [1, D, 1, F])],
        [w, *(extra_inits or [])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def save(model: onnx.ModelProto, path: Path, **kwargs) -> Path:
    onnx.save(model, str(path), **kwargs)
    return path


def rules(violations: list[Violation]) -> set[str]:
    return {v.rule for v in violations}


def test_bundle_encoder_passes(tiny_bundle):
    assert lint(Path(tiny_bundle) / "encoder.onnx") == []
    assert lint(Path(tiny_bundle)) == []  # a bundle directory means its encoder.onnx


def test_bundle_encoder_is_hailo_shaped(tiny_bundle):
    """Exactly opset 13 (the lint accepts newer ones the DFC may also parse; we write 13), the
    NHWC log-mel [1, 1, frames, mels] in, static shapes, Conv2D and no fused attention."""
    from edgeasr.bundle import load_bundle
    from edgeasr.models.graphs import ENCODER_OPSET

    bundle = load_bundle(Path(tiny_bundle))
    model = onnx.load(str(Path(tiny_bundle) / "encoder.onnx"), load_external_data=False)
    assert ENCODER_OPSET == 13 and {o.domain: o.version for o in model.opset_import}[""] == ENCODER_OPSET
    (mel,) = model.graph.input
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in mel.type.tensor_type.shape.dim]
    assert dims == [1, 1, bundle.audio.n_frames, bundle.audio.n_mels]
    ops = {n.op_type for n in model.graph.node}
    assert "Conv" in ops and not ops & {"Attention", "MultiHeadAttention", "Conv1D"}


def test_valid_small_graph_passes(tmp_path):
    assert lint(save(conv2d_graph(), tmp_path / "ok.onnx")) == []


def test_conv1d_is_named(tmp_path):
    # Whisper's original front end: Conv1d(k=3) on [1, n_mels, F].
    w1 = numpy_helper.from_array(np.zeros((D, M, 3), np.float32), "w1")
    nodes = [
        helper.make_node("Transpose", ["mel"], ["nchw"], name="/Transpose", perm=[0, 3, 1, 2]),
        helper.make_node("Reshape", ["nchw", "shape"], ["ncw"], name="/Reshape"),
        helper.make_node(
            "Conv", ["ncw", "w1"], ["out"], name="/encoder/conv1d", kernel_shape=[3], pads=[1, 1]
        ),
    ]
    graph = helper.make_graph(
        nodes, "g", [tensor("mel", [1, 1, F, M])], [tensor("out", [1, D, F])], [w1, const("shape", [1, M, F])]
    )
    found = lint(
        save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "c.onnx")
    )
    assert [(v.node, v.op, v.rule) for v in found] == [("/encoder/conv1d", "Conv", "conv1d")]
    assert "/encoder/conv1d [Conv] conv1d: 1-D convolution" in str(found[0])


def test_dynamic_axis_fails(tmp_path):
    model = conv2d_graph(mel_dims=[1, 1, "frames", M], out_dims=[1, D, 1, "frames"])
    found = lint(save(model, tmp_path / "dyn.onnx"), expected_input=None)
    static = [v for v in found if v.rule == "static-shape"]
    assert {v.node for v in static} >= {"mel", "out", "/conv1/Conv"}
    assert any("'frames'" in v.message for v in static)


def test_disallowed_op_fails(tmp_path):
    cumsum = helper.make_node("CumSum", ["conv", "axis"], ["summed"], name="/weird/CumSum")
    found = lint(save(conv2d_graph([cumsum], extra_inits=[const("axis", 3)]), tmp_path / "op.onnx"))
    assert [(v.node, v.rule) for v in found] == [("/weird/CumSum", "unsupported-op")]


def test_shape_dependent_ops_fail(tmp_path):
    nodes = [
        helper.make_node("Shape", ["conv"], ["shape"], name="/Shape"),
        helper.make_node("Reshape", ["conv", "shape"], ["same"], name="/Reshape"),
    ]
    found = lint(save(conv2d_graph(nodes), tmp_path / "shape.onnx"))
    assert ("/Shape", "dynamic-shape-op") in {(v.node, v.rule) for v in found}
    reshape = [v for v in found if v.node == "/Reshape" and v.rule == "dynamic-shape-op"]
    assert (
        len(reshape) == 1
        and "input 1 (shape, from /Shape [Shape]) is computed at run time" in reshape[0].message
    )


def test_nchw_input_fails(tmp_path):
    # hailo-whisper's own export takes NCHW [1, n_mels, 1, F]; edgeasr feeds NHWC.
    w = numpy_helper.from_array(np.zeros((D, M, 1, 3), np.float32), "w")
    node = helper.make_node(
        "Conv", ["mel", "w"], ["out"], name="/conv1/Conv", kernel_shape=[1, 3], pads=[0, 1, 0, 1]
    )
    graph = helper.make_graph([node], "g", [tensor("mel", [1, M, 1, F])], [tensor("out", [1, D, 1, F])], [w])
    found = lint(
        save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "nchw.onnx")
    )
    assert [(v.node, v.rule) for v in found] == [("mel", "nhwc-input")]


def test_input_shape_must_match_the_manifest(tiny_bundle):
    found = lint(Path(tiny_bundle) / "encoder.onnx", expected_input=(1, 1, 500, 80))
    assert [(v.node, v.rule) for v in found] == [("mel", "nhwc-input")]
    assert "[1, 1, 500, 80]" in found[0].message


def test_opset_too_new(tmp_path):
    found = lint(save(conv2d_graph(opset=18), tmp_path / "o18.onnx"))
    assert rules(found) == {"opset"}


def test_external_data_fails(tmp_path):
    path = save(
        conv2d_graph(),
        tmp_path / "ext.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.data",
        size_threshold=0,
    )
    found = lint(path)
    assert ("w", "external-data") in {(v.node, v.rule) for v in found}


def test_unreadable_files(tmp_path):
    with pytest.raises(MissingInputError, match="not found"):
        lint(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf \xff\xfe")
    with pytest.raises(ModelError, match="not a readable ONNX model"):
        lint(bad)
