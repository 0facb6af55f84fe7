"""`edgeasr models lint-hailo`: will the Hailo Dataflow Compiler (DFC) take this encoder ONNX?

A static check, run before the (hours-long, x86-only) DFC: one small rule class per
requirement, applied in a loop; each finding names the node.

Rules and where they come from:
- opset: the DFC 3.x ONNX parser reads the default ONNX domain only, up to opset 17 (DFC User
  Guide, "Translating Tensorflow and ONNX Models"; the guide is behind the Hailo Developer
  Zone login and was not re-read for this module). edgeasr exports opset 13, the opset of
  Hailo's own Whisper export (hailocs/hailo-whisper: export/export_whisper_model.py).
- static shapes: every graph input/output and every tensor after onnx.shape_inference has a
  fixed shape (the HEF is compiled for one shape).
- no 1-D convolutions: the DFC has none; Whisper's Conv1d(k=3) must be Conv2d(k=(1,3)) on a
  height-1 image, as hailo-whisper's hailo-compatibility-changes.patch and our graphs.py do.
- NHWC input: one rank-4 input [1, 1, n_frames, n_mels] (batch 1, height 1, mels as channels),
  the layout edgeasr.asr.features produces and Hailo's Whisper app feeds the encoder HEF.
- supported ops: HAILO_ONNX_OPS below, the ONNX operators the DFC's parser maps to Hailo
  layers per the DFC User Guide v3.27-3.33, section "Supported Layers" / ONNX operators list,
  as summarised here (not re-verified against the login-only guide); the subset edgeasr's
  encoder uses (Conv, Gemm, MatMul, Add/Sub/Mul/Div, Pow, Sqrt, Erf, ReduceMean, Softmax,
  Reshape, Transpose, Gather with a constant index) is the one hailocs/hailo-whisper's encoder
  (DFC >= 3.31) parses.
- no external data: the DFC is given one .onnx file.
- nothing shape-dependent at run time: Shape/Size/NonZero/Range/ConstantOfShape/control flow,
  and shape-like inputs (Reshape shape, Gather indices, Slice bounds, ...) that are not
  constants.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgeasr.errors import MissingInputError, ModelError, ToolMissingError

MAX_OPSET = 17
ONNX_DOMAINS = ("", "ai.onnx")

HAILO_ONNX_OPS = frozenset(
    # convolution, dense, pooling
    "Conv ConvTranspose Gemm MatMul MaxPool AveragePool GlobalAveragePool GlobalMaxPool "
    # element-wise arithmetic and activations
    "Add Sub Mul Div Neg Abs Pow Sqrt Exp Log Erf Relu LeakyRelu PRelu Elu Sigmoid HardSigmoid "
    "HardSwish Tanh Softplus Clip Min Max "
    # normalisation and reductions
    "BatchNormalization InstanceNormalization LayerNormalization ReduceMean ReduceMax ReduceSum "
    "ReduceL2 Softmax ArgMax "
    # layout (with constant shapes)
    "Reshape Transpose Flatten Squeeze Unsqueeze Concat Split Slice Gather Pad Resize DepthToSpace "
    "SpaceToDepth Tile Expand "
    # no-ops the parser folds
    "Identity Dropout Constant".split()
)

# Ops whose output shape or value depends on run-time data.
DYNAMIC_OPS = frozenset(
    ["Shape", "Size", "NonZero", "Range", "ConstantOfShape", "Loop", "If", "Scan", "Where", "TopK", "NonMaxSuppression", "Unique", "Compress", "EyeLike"]
)

# (op, input index) that must be constants for a static graph.
SHAPE_INPUTS = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Gather": (1,),
    "Slice": (1, 2, 3, 4),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Pad": (1, 2),
    "Resize": (1, 2, 3),
    "Split": (1,),
    "ReduceMean": (1,),
    "ReduceSum": (1,),
    "ReduceMax": (1,),
    "ReduceL2": (1,),
    "Clip": (1, 2),
}


@dataclass(frozen=True)
class Violation:
    node: str  # node name (or tensor/initializer name for graph-level findings)
    op: str  # op type, or "graph"
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.node or '<unnamed>'} [{self.op}] {self.rule}: {self.message}"


class _Graph:
    """What the rules read: the model, its shapes after inference, producers and constants."""

    def __init__(self, model, inferred, expected_input: tuple[int, ...] | None) -> None:
        g = model.graph
        self.model, self.graph, self.expected_input = model, g, expected_input
        self.initializers = {i.name: i for i in g.initializer}
        self.inputs = [i for i in g.input if i.name not in self.initializers]
        self.producer = {o: n for n in g.node for o in n.output}
        self.constants = set(self.initializers) | {
            o for n in g.node if n.op_type == "Constant" for o in n.output
        }
        ig = inferred.graph
        self.shapes = {v.name: v for v in list(ig.value_info) + list(ig.input) + list(ig.output)}

    def node_of(self, tensor: str) -> tuple[str, str]:
        n = self.producer.get(tensor)
        return (n.name, n.op_type) if n is not None else (tensor, "graph")


def _dims(value_info) -> list[int | str | None]:
    t = value_info.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return [None]
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.tensor_type.shape.dim
    ]


def _static(dims: list) -> bool:
    return all(isinstance(d, int) and d > 0 for d in dims)


class OpsetRule:
    name = "opset"

    def check(self, g: _Graph) -> Iterator[Violation]:
        for imp in g.model.opset_import:
            if imp.domain in ONNX_DOMAINS:
                if imp.version > MAX_OPSET:
                    yield Violation(
                        "",
                        "graph",
                        self.name,
                        f"opset {imp.version} is newer than the DFC parser takes (at most {MAX_OPSET})",
                    )
            else:
                yield Violation(
                    "",
                    "graph",
                    self.name,
                    f"custom operator domain {imp.domain!r} (DFC parses ONNX ops only)",
                )


class ExternalDataRule:
    name = "external-data"

    def check(self, g: _Graph) -> Iterator[Violation]:
        from onnx import TensorProto

        for init in g.graph.initializer:
            if init.data_location == TensorProto.EXTERNAL:
                yield Violation(
                    init.name,
                    "initializer",
                    self.name,
                    "weights are stored outside the .onnx file; save the model as one file",
                )


class StaticShapeRule:
    name = "static-shape"

    def check(self, g: _Graph) -> Iterator[Violation]:
        for io, kind in ((g.inputs, "input"), (list(g.graph.output), "output")):
            for v in io:
                dims = _dims(v)
                if not _static(dims):
                    yield Violation(
                        v.name, "graph", self.name, f"graph {kind} {v.name} has shape {dims}: fix every axis"
                    )
        for node in g.graph.node:
            for out in node.output:
                if not out or node.op_type == "Constant":
                    continue
                info = g.shapes.get(out)
                dims = _dims(info) if info is not None else [None]
                if not _static(dims):
                    yield Violation(
                        node.name,
                        node.op_type,
                        self.name,
                        f"output {out} has shape {dims} after shape inference (not static)",
                    )
                    break


class Conv1dRule:
    name = "conv1d"

    def check(self, g: _Graph) -> Iterator[Violation]:
        for node in g.graph.node:
            if node.op_type not in ("Conv", "ConvTranspose") or len(node.input) < 2:
                continue
            w = node.input[1]
            rank = (
                len(g.initializers[w].dims)
                if w in g.initializers
                else len(_dims(g.shapes[w]))
                if w in g.shapes
                else None
            )
            if rank == 3:
                yield Violation(
                    node.name,
                    node.op_type,
                    self.name,
                    "1-D convolution (rank-3 weight); the DFC has none: use Conv2D with kernel (1, k)",
                )


class InputLayoutRule:
    name = "nhwc-input"

    def check(self, g: _Graph) -> Iterator[Violation]:
        if len(g.inputs) != 1:
            yield Violation(
                "", "graph", self.name, f"{len(g.inputs)} graph inputs; the encoder takes one (mel)"
            )
            return
        v = g.inputs[0]
        dims = _dims(v)
        want = g.expected_input
        if len(dims) != 4 or dims[0] != 1 or dims[1] != 1:
            yield Violation(
                v.name,
                "graph",
                self.name,
                f"input {v.name} is {dims}; expected NHWC [1, 1, n_frames, n_mels]"
                + (f" = {list(want)}" if want else ""),
            )
        elif want is not None and tuple(dims) != tuple(want):
            yield Violation(
                v.name, "graph", self.name, f"input {v.name} is {dims}, the bundle manifest says {list(want)}"
            )


class SupportedOpRule:
    name = "unsupported-op"

    def check(self, g: _Graph) -> Iterator[Violation]:
        for node in g.graph.node:
            if node.domain not in ONNX_DOMAINS:
                yield Violation(node.name, node.op_type, self.name, f"custom op of domain {node.domain!r}")
            elif node.op_type not in HAILO_ONNX_OPS and node.op_type not in DYNAMIC_OPS:
                yield Violation(
                    node.name,
                    node.op_type,
                    self.name,
                    f"{node.op_type} is not among the ONNX operators the Hailo DFC parses",
                )


class DynamicShapeRule:
    name = "dynamic-shape-op"

    def check(self, g: _Graph) -> Iterator[Violation]:
        for node in g.graph.node:
            if node.op_type in DYNAMIC_OPS:
                yield Violation(
                    node.name,
                    node.op_type,
                    self.name,
                    f"{node.op_type} depends on run-time shapes or values; fold it into a constant or remove it",
                )
                continue
            for i in SHAPE_INPUTS.get(node.op_type, ()):
                if i < len(node.input) and node.input[i] and node.input[i] not in g.constants:
                    src, op = g.node_of(node.input[i])
                    yield Violation(
                        node.name,
                        node.op_type,
                        self.name,
                        f"input {i} ({node.input[i]}, from {src} [{op}]) is computed at run time; "
                        "it must be a constant",
                    )


RULES = (
    OpsetRule(),
    ExternalDataRule(),
    StaticShapeRule(),
    Conv1dRule(),
    InputLayoutRule(),
    SupportedOpRule(),
    DynamicShapeRule(),
)


def _onnx():
    try:
        import onnx
    except ImportError as exc:
        raise ToolMissingError("lint-hailo needs the onnx package: pip install onnx") from exc
    return onnx


def _manifest_input(onnx_path: Path) -> tuple[int, ...] | None:
    """The mel shape the bundle's manifest states, when the ONNX sits in a bundle."""
    manifest = onnx_path.parent / "manifest.json"
    try:
        mel = json.loads(manifest.read_text())["tensors"]["encoder"]["inputs"]["mel"]
        return tuple(int(d) for d in mel)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lint(onnx_path: Path, expected_input: tuple[int, ...] | None = None) -> list[Violation]:
    """Every Hailo-DFC problem in an ONNX file (a bundle directory means its encoder.onnx).

    expected_input: the NHWC mel shape to require; by default the one in the bundle manifest
    next to the file, if there is one.
    """
    onnx = _onnx()
    path = Path(onnx_path)
    if path.is_dir():
        path = path / "encoder.onnx"
    if not path.is_file():
        raise MissingInputError(f"{path}: ONNX file not found")
    try:
        model = onnx.load(str(path), load_external_data=False)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - protobuf/onnx raise many types for a bad file
        raise ModelError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from exc
    graph = _Graph(model, inferred, expected_input or _manifest_input(path))
    return [v for rule in RULES for v in rule.check(graph)]
