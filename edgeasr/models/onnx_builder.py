"""Write ONNX graphs node by node with the `onnx` package: the builder and Whisper's blocks.

`GraphBuilder` keeps the nodes, the weights and the graph's inputs and outputs. Weights are
initializers under the checkpoint's own names (Hugging Face names without `model.`), so a
graph can be read and dumped (`edgeasr models weights`) without guessing; nothing is a
Constant node, because the Hailo DFC's parser takes weights as initializers only. Nodes are
named by scope the way torch's exporter names them (`/layers.0/self_attn/MatMul_1`): Hailo's
conversion recipes and our compile step find their start and end nodes by such names.

The blocks below (projections, layer norm, GELU, attention heads) are written once and used
by every graph (`graphs.py`, `hailo_decoder.py`). Their op patterns are the ones torch's
exporter writes, so that onnxruntime's fusions (LayerNormalization, Gelu, MatMul + bias)
find them as before.
"""

from __future__ import annotations

import math
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeasr.errors import ModelError, OutputError

LAYER_NORM_EPS = 1e-5  # Whisper's nn.LayerNorm default
NATIVE_LAYER_NORM_OPSET = 17  # LayerNormalization exists from opset 17 on
_DTYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
           np.dtype(np.int32): TensorProto.INT32, np.dtype(np.uint8): TensorProto.UINT8,
           np.dtype(np.int8): TensorProto.INT8}


def onnx_name(hf_name: str) -> str:
    """'model.encoder.conv1.weight' -> 'encoder.conv1.weight' (proj_out.weight stays)."""
    return hf_name.removeprefix("model.")


class GraphBuilder:
    """Nodes, initializers and graph inputs/outputs of one ONNX model at one opset."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, onnx.TensorProto] = {}
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._scope: list[str] = []
        self._uses: Counter[str] = Counter()  # node names taken, for the _1, _2 suffixes

    # ------------------------------------------------------------ graph interface

    def input(self, name: str, shape: list, dtype=np.float32) -> str:
        """A graph input; shape entries are ints or the names of dynamic axes."""
        self.inputs.append(helper.make_tensor_value_info(name, _DTYPES[np.dtype(dtype)], shape))
        return name

    def output(self, name: str, shape: list, dtype=np.float32) -> None:
        """Declare a graph output; a node must produce a value of that name (op(..., out=name))."""
        self.outputs.append(helper.make_tensor_value_info(name, _DTYPES[np.dtype(dtype)], shape))

    def weight(self, name: str, array: np.ndarray) -> str:
        """A float32 initializer under `name`; asking twice for a name must give the same array."""
        return self._initializer(name, np.ascontiguousarray(array, dtype=np.float32))

    def ints(self, name: str, values) -> str:
        """An int64 initializer (shapes, axes, indices) under `name`."""
        return self._initializer(name, np.asarray(values, dtype=np.int64))

    def scalar(self, name: str, value: float) -> str:
        """A float32 scalar initializer (GELU's and the norms' constants, the attention scale)."""
        return self._initializer(name, np.asarray(value, dtype=np.float32))

    def constant(self, name: str, array: np.ndarray) -> str:
        """An initializer of the array's own dtype (int8 weights, their zero points)."""
        return self._initializer(name, np.asarray(array))

    def _initializer(self, name: str, array: np.ndarray) -> str:
        if name in self.initializers:
            if not np.array_equal(numpy_helper.to_array(self.initializers[name]), array):
                raise ModelError(f"graph builder: two different tensors named {name}")
            return name
        self.initializers[name] = numpy_helper.from_array(array, name)
        return name

    @contextmanager
    def scope(self, name: str):
        """Node names inside get `/name/` in front, as torch's exporter names module scopes."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    def _name(self, op_type: str) -> str:
        """The next node's name: scoped, with a _1, _2 suffix when taken."""
        base = "/".join(["", *self._scope, op_type])
        count = self._uses[base]
        self._uses[base] += 1
        return base if count == 0 else f"{base}_{count}"

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        """Append one node; returns the name of its (single) output."""
        name = self._name(op_type)
        output = out or f"{name}_output_0"
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=name, **attrs))
        return output

    def op_n(self, op_type: str, count: int, *inputs: str, out: list[str | None] | None = None,
             **attrs) -> list[str]:
        """Append one node of `count` outputs (named by `out` where not None); returns their names."""
        name = self._name(op_type)
        outputs = [o or f"{name}_output_{i}" for i, o in enumerate(out or [None] * count)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        return outputs

    def model(self, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs,
                                  list(self.initializers.values()))
        opsets = [helper.make_opsetid("", self.opset)]
        # the IR version that goes with the opset, not the newest the onnx package knows:
        # older onnxruntime builds refuse IR versions newer than theirs
        model = helper.make_model_gen_version(graph, opset_imports=opsets, producer_name="edgeasr")
        onnx.checker.check_model(model)
        return model


def save(model: onnx.ModelProto, path: Path) -> Path:
    """One self-contained .onnx file (the Hailo DFC and onnxruntime both get one file)."""
    try:
        onnx.save(model, str(path))
    except OSError as exc:
        raise OutputError(f"{path}: cannot write the graph ({exc.strerror})") from exc
    return Path(path)


# ---------------------------------------------------------------- Whisper's blocks


def linear(b: GraphBuilder, x: str, state: dict, module: str, bias: bool = True,
           out: str | None = None) -> str:
    """x @ W^T (+ bias) for the checkpoint's Linear `module` (W is [out, in]); `out` names
    the result (a graph output).

    W is stored transposed, [in, out], under the module's weight name: MatMul's own layout,
    which onnxruntime's int8 quantization handles. Whisper's k projections have no bias."""
    name = onnx_name(module)
    with b.scope(name.rsplit(".", 1)[-1]):
        w = b.weight(f"{name}.weight", state[f"{module}.weight"].T)
        if not bias:
            return b.op("MatMul", x, w, out=out)
        y = b.op("MatMul", x, w)
        return b.op("Add", b.weight(f"{name}.bias", state[f"{module}.bias"]), y, out=out)


def layer_norm(b: GraphBuilder, x: str, state: dict, module: str, out: str | None = None) -> str:
    """LayerNorm over the last axis: the native op from opset 17 on, else written out (opset
    13, where the Hailo DFC parses it) as torch's exporter writes it, a pattern onnxruntime
    fuses back into one LayerNormalization. `out` names the result (a graph output)."""
    name = onnx_name(module)
    gamma = b.weight(f"{name}.weight", state[f"{module}.weight"])
    beta = b.weight(f"{name}.bias", state[f"{module}.bias"])
    with b.scope(name.rsplit(".", 1)[-1]):
        if b.opset >= NATIVE_LAYER_NORM_OPSET:
            return b.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=LAYER_NORM_EPS, out=out)
        mean = b.op("ReduceMean", x, axes=[-1])
        centred = b.op("Sub", x, mean)
        variance = b.op("ReduceMean", b.op("Pow", centred, b.scalar("const.two", 2.0)), axes=[-1])
        std = b.op("Sqrt", b.op("Add", variance, b.scalar("const.layer_norm_eps", LAYER_NORM_EPS)))
        return b.op("Add", b.op("Mul", b.op("Div", centred, std), gamma), beta, out=out)


def gelu(b: GraphBuilder, x: str) -> str:
    """Exact GELU, x * 0.5 * (1 + erf(x / sqrt 2)): Whisper's activation (not the tanh one).
    No Gelu op before opset 20; onnxruntime fuses this pattern into one."""
    inner = b.op("Erf", b.op("Div", x, b.scalar("const.sqrt2", math.sqrt(2.0))))
    return b.op("Mul", b.op("Mul", x, b.op("Add", inner, b.scalar("const.one", 1.0))),
                b.scalar("const.half", 0.5))


def mlp(b: GraphBuilder, x: str, state: dict, layer: str) -> str:
    """x + fc2(gelu(fc1(norm(x)))): the pre-norm feed-forward block of every layer."""
    h = layer_norm(b, x, state, f"{layer}.final_layer_norm")
    h = linear(b, gelu(b, linear(b, h, state, f"{layer}.fc1")), state, f"{layer}.fc2")
    return b.op("Add", x, h)


def scaled_query(b: GraphBuilder, h: str, state: dict, attn: str, head_dim: int) -> str:
    """q_proj(h) * head_dim^-0.5: the scale on the query, as Hugging Face and CTranslate2 apply it."""
    return b.op("Mul", linear(b, h, state, f"{attn}.q_proj"), b.scalar(f"const.scale_{head_dim}",
                                                                      head_dim**-0.5))


def batch_heads(b: GraphBuilder, x: str, heads: int, head_dim: int, positions: int,
                keys: bool = False) -> str:
    """[1, n, d] -> [1, H, n, dh], or [1, H, dh, n] for keys (ready for q @ k): the batch axis
    stays in front, as the Hailo DFC needs (no Gather on activations)."""
    shape = b.ints(f"shape.heads_{positions}", [1, positions, heads, head_dim])
    return b.op("Transpose", b.op("Reshape", x, shape), perm=[0, 2, 3, 1] if keys else [0, 2, 1, 3])


def merge_batch_heads(b: GraphBuilder, x: str, d_model: int, positions: int) -> str:
    """[1, H, n, dh] -> [1, n, d]."""
    shape = b.ints(f"shape.merged_{positions}", [1, positions, d_model])
    return b.op("Reshape", b.op("Transpose", x, perm=[0, 2, 1, 3]), shape)


def attend(b: GraphBuilder, q: str, k: str, v: str, bias: str | None = None) -> str:
    """softmax(q @ k + bias) @ v with k already transposed: eager attention, no fused op."""
    scores = b.op("MatMul", q, k)
    if bias is not None:
        scores = b.op("Add", scores, bias)
    return b.op("MatMul", b.op("Softmax", scores, axis=-1), v)
