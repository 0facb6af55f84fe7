"""Whisper's encoder and cached decoder as ONNX graphs, built from the checkpoint's weights.

- `encoder`: NHWC mel [1, 1, n_frames, n_mels] -> audio_features [1, n_frames / 2, d]. Hailo
  ready (opset 13, static shapes, Conv2D(1x3) for Whisper's Conv1D, eager attention, the
  positional table as a constant Add, layer norm written out); the CPU runs it too.
- `decoder_cross`: audio_features -> per layer the cross-attention keys and values, once per
  window.
- `decoder_step`: one cached decoder call for n new tokens through the vocabulary
  projection (opset 17, CPU only).
- `decoder_align`: the decoder over a whole token sequence at once, to the cross-attention
  scores of the alignment heads (word timestamps; opset 17, CPU only).
The beam's batched step is in `batch_graph.py`.

Shapes come from the checkpoint's dims; the graph interfaces (`cross_io_names`,
`step_io_names`) are what `edgeasr.asr.decoding.DecoderSession` binds by name.
"""

from __future__ import annotations

import numpy as np
import onnx

from edgeasr.errors import ModelError
from edgeasr.models.checkpoint import Checkpoint
from edgeasr.models.onnx_builder import (
    GraphBuilder,
    attend,
    batch_heads,
    gelu,
    layer_norm,
    linear,
    merge_batch_heads,
    mlp,
    scaled_query,
)

ENCODER_OPSET = 13  # what the Hailo DFC parser accepts
DECODER_OPSET = 17  # CPU only: native LayerNormalization
MEL_INPUT, FEATURES_OUTPUT = "mel", "audio_features"
ALIGN_OUTPUT = "alignment_scores"
NHWC_TO_NCHW = [0, 3, 1, 2]
POSITIONS_AXIS = "positions"  # dynamic: encoder positions of a window (padding included)
FRAMES_AXIS = "frames"  # dynamic: mel frames into the CPU's encoder
NEW_TOKENS_AXIS = "n"  # dynamic: tokens fed to one decoder step
SCORED_AXIS = "scored"  # dynamic: the positions the scoring step projects (from `first` on)
INT64_MAX = 2**63 - 1  # Slice's "to the end"


def cross_io_names(layers: int) -> list[str]:
    """Outputs of the cross-attention K/V graph: one tensor per layer and kind."""
    return [f"cross_{kind}{i}" for i in range(layers) for kind in ("k", "v")]


def step_io_names(layers: int) -> tuple[list[str], list[str]]:
    """Inputs and outputs of the decoder step graph: one cache tensor per layer and kind,
    so that every one is a contiguous slice of the host's buffers (no copy, no Split)."""
    per_layer = [f"{kind}{i}" for i in range(layers) for kind in ("self_k", "self_v", "cross_k", "cross_v")]
    outputs = ["logits"] + [f"{kind}{i}" for i in range(layers) for kind in ("new_k", "new_v")]
    return ["token_embeddings", "offset", "cross_bias", *per_layer], outputs


# ---------------------------------------------------------------- encoder


def encoder(ckpt: Checkpoint, n_frames: int | None) -> onnx.ModelProto:
    """The Hailo-ready encoder for windows of n_frames mel frames (1000 = 10 s, 3000 = 30 s);
    n_frames None: the CPU's encoder for any even number of frames up to the trained 30 s, so
    that short audio is encoded over the frames that hold it (whisper.cpp's audio_ctx)."""
    s, d = ckpt.state, ckpt.dims
    if n_frames is not None and (n_frames % 2 or not 0 < n_frames // 2 <= d.n_audio_ctx):
        raise ModelError(f"{n_frames} mel frames do not fit the encoder ({d.n_audio_ctx} positions)")
    positions = -1 if n_frames is None else n_frames // 2  # conv2 has stride 2; -1: Reshape infers it
    b = GraphBuilder(ENCODER_OPSET)
    mel = b.input(MEL_INPUT, [1, 1, FRAMES_AXIS if n_frames is None else n_frames, d.n_mels])
    # NHWC -> NCHW [1, n_mels, 1, F]: compile_hef starts the HEF at the Conv after this Transpose
    x = b.op("Transpose", mel, perm=NHWC_TO_NCHW)
    x = gelu(b, _conv(b, x, s, "conv1", stride=1))
    x = gelu(b, _conv(b, x, s, "conv2", stride=2))  # [1, d, 1, T]
    x = b.op("Reshape", x, b.ints("shape.conv_out", [1, d.d_model, positions]))
    x = b.op("Transpose", x, perm=[0, 2, 1])  # [1, T, d]
    x = b.op("Add", x, _positional_rows(b, ckpt, x, n_frames))
    for i in range(d.encoder_layers):
        with b.scope(f"layers.{i}"):
            x = _encoder_layer(b, x, ckpt, f"model.encoder.layers.{i}", positions)
    b.output(FEATURES_OUTPUT, [1, POSITIONS_AXIS if n_frames is None else positions, d.d_model])
    layer_norm(b, x, s, "model.encoder.layer_norm", out=FEATURES_OUTPUT)
    return b.model("whisper_encoder")


def _positional_rows(b: GraphBuilder, ckpt: Checkpoint, x: str, n_frames: int | None) -> str:
    """The positional table's first T rows: a constant for a fixed window (no Gather on the
    NPU), else sliced to the positions of x [1, T, d]."""
    table = ckpt.state["model.encoder.embed_positions.weight"]
    if n_frames is not None:
        return b.weight("encoder.embed_positions.weight", table[: n_frames // 2][None])
    t = b.op("Slice", b.op("Shape", x), b.ints("positions.start", [1]), b.ints("positions.end", [2]))
    return b.op("Slice", b.weight("encoder.embed_positions.weight", table[None]), b.ints("positions.zero", [0]),
                t, b.ints("positions.axis", [1]))


def _conv(b: GraphBuilder, x: str, state: dict, name: str, stride: int) -> str:
    """Whisper's Conv1d(k=3, padding 1) as Conv2d(k=(1, 3)) on a height-1 image: the Hailo
    DFC has no 1-D convolutions. The weight [out, in, 3] becomes [out, in, 1, 3]."""
    w = state[f"model.encoder.{name}.weight"][:, :, None, :]
    kernel = w.shape[-1]
    with b.scope(name):
        return b.op("Conv", x, b.weight(f"encoder.{name}.weight", w),
                    b.weight(f"encoder.{name}.bias", state[f"model.encoder.{name}.bias"]),
                    kernel_shape=[1, kernel], pads=[0, kernel // 2, 0, kernel // 2],
                    strides=[1, stride], dilations=[1, 1], group=1)


def _encoder_layer(b: GraphBuilder, x: str, ckpt: Checkpoint, layer: str, positions: int) -> str:
    """x + self_attn(norm(x)), then the MLP; rank-4 heads keep the batch axis (Hailo DFC)."""
    s, d = ckpt.state, ckpt.dims
    heads, head_dim = d.encoder_heads, d.d_model // d.encoder_heads
    attn = f"{layer}.self_attn"
    with b.scope("self_attn"):
        h = layer_norm(b, x, s, f"{layer}.self_attn_layer_norm")
        q = batch_heads(b, scaled_query(b, h, s, attn, head_dim), heads, head_dim, positions)
        k = batch_heads(b, linear(b, h, s, f"{attn}.k_proj", bias=False), heads, head_dim, positions,
                        keys=True)
        v = batch_heads(b, linear(b, h, s, f"{attn}.v_proj"), heads, head_dim, positions)
        out = merge_batch_heads(b, attend(b, q, k, v), d.d_model, positions)
        x = b.op("Add", x, linear(b, out, s, f"{attn}.out_proj"))
    with b.scope("mlp"):
        return mlp(b, x, s, layer)


# ---------------------------------------------------------------- cross-attention K/V


def decoder_cross(ckpt: Checkpoint) -> onnx.ModelProto:
    """audio_features [1, T, d] -> per layer i: cross_k{i} [H, dh, T] (already transposed for
    q @ k) and cross_v{i} [H, T, dh], the step graph's inputs as they are. T is dynamic: the
    window's positions plus the one padding row (DecoderSession.start). One output per
    tensor, not a stacked [L, ...] pair: stacking copied all of them again (measured: 5.5 ->
    3.6 ms per window for tiny)."""
    s, d = ckpt.state, ckpt.dims
    heads, head_dim = d.decoder_heads, d.d_model // d.decoder_heads
    b = GraphBuilder(DECODER_OPSET)
    features = b.input(FEATURES_OUTPUT, [1, POSITIONS_AXIS, d.d_model])
    split = b.ints("shape.heads", [-1, heads, head_dim])  # [T, H, dh], T from the input
    for i in range(d.decoder_layers):
        attn = f"model.decoder.layers.{i}.encoder_attn"
        b.output(f"cross_k{i}", [heads, head_dim, POSITIONS_AXIS])
        b.output(f"cross_v{i}", [heads, POSITIONS_AXIS, head_dim])
        with b.scope(f"layers.{i}"), b.scope("encoder_attn"):
            k = b.op("Reshape", linear(b, features, s, f"{attn}.k_proj", bias=False), split)
            b.op("Transpose", k, perm=[1, 2, 0], out=f"cross_k{i}")
            v = b.op("Reshape", linear(b, features, s, f"{attn}.v_proj"), split)
            b.op("Transpose", v, perm=[1, 0, 2], out=f"cross_v{i}")
    return b.model("whisper_decoder_cross")


# ---------------------------------------------------------------- decoder step


def declare_step_io(b: GraphBuilder, inputs: list[str], outputs: list[str],
                    shapes: dict[str, list]) -> None:
    """A decoder step's inputs and outputs by name (`offset`, and the scoring step's `first`, int64)."""
    for name in inputs:
        b.input(name, shapes[name], dtype=np.int64 if name in ("offset", "first") else np.float32)
    for name in outputs:
        b.output(name, shapes[name])


def decoder_score(ckpt: Checkpoint) -> onnx.ModelProto:
    """`decoder_step` through the vocabulary projection of every position from input `first`
    [1] on: logits [n - first, n_vocab]. A text read by teacher forcing (asr/decoding.score_texts)
    is one run, whose projection reads its weights once for all the text's tokens, not once a
    token; and a prompt and a text after it are one run (decoding.prime with a text) that
    projects only the text's positions."""
    return decoder_step(ckpt, every_position=True)


def decoder_step(ckpt: Checkpoint, every_position: bool = False) -> onnx.ModelProto:
    """One cached decoder call for n new tokens (the prompt, then 1 token per step), through
    the vocabulary projection of the last position.

    Inputs: token_embeddings [n, d], the tokens' rows of the token table, which the host
    reads from token_embedding.npy (the table is the model's largest tensor and a window
    uses a few dozen rows); offset [1], the number of cached positions P. Per layer i:
    self_k{i}, self_v{i} [n_text_ctx, d], the host's whole cache buffers, of which the graph
    reads the first P rows (so the host binds them once, not per step); cross_k{i} [H, dh, T]
    and cross_v{i} [H, T, dh] from decoder_cross; cross_bias [T], added to the cross-attention
    scores (log(count) on the one padding row that stands for count rows). Outputs: logits
    [1, n_vocab] of the last position, new_k{i}, new_v{i} [n, d] to append to the cache.

    The projection (most of a step's bytes) is in this graph so that a token is one
    onnxruntime run: one thread pool that stays awake from token to token (DecoderSession).
    """
    s, d = ckpt.state, ckpt.dims
    b = GraphBuilder(DECODER_OPSET)
    inputs, outputs = step_io_names(d.decoder_layers)
    shapes = _step_shapes(d)
    if every_position:
        inputs.append("first")
        shapes.update(first=[1], logits=[SCORED_AXIS, d.n_vocab])
    declare_step_io(b, inputs, outputs, shapes)
    x, offset, cross_bias = "token_embeddings", "offset", "cross_bias"

    rows, mask = _positions_and_mask(b, x, offset)
    table = b.weight("decoder.embed_positions.weight", s["model.decoder.embed_positions.weight"])
    x = b.op("Add", x, b.op("Gather", table, rows, axis=0))  # [n, d]
    for i in range(d.decoder_layers):
        with b.scope(f"layers.{i}"):
            x = _decoder_layer(b, x, ckpt, i, offset, mask, cross_bias)
    # [1, d]: only the last position's logits are needed; scoring, those from `first` on
    x = b.op("Slice", x, "first" if every_position else b.ints("slice.last", [-1]), b.ints("slice.end", [INT64_MAX]),
             b.ints("axis.0", [0]))
    h = layer_norm(b, x, s, "model.decoder.layer_norm")
    # the tied embedding as the projection's [d, V] MatMul weight, stored once
    b.op("MatMul", h, b.weight("proj_out.weight", s["proj_out.weight"].T), out="logits")
    return b.model("whisper_decoder_score" if every_position else "whisper_decoder_step")


def _step_shapes(d) -> dict[str, list]:
    """Every input and output of the step graph by name (dynamic axes by their names)."""
    head_dim = d.d_model // d.decoder_heads
    shapes = {"token_embeddings": [NEW_TOKENS_AXIS, d.d_model], "offset": [1],
              "cross_bias": [POSITIONS_AXIS], "logits": [1, d.n_vocab]}
    for i in range(d.decoder_layers):
        shapes.update({
            f"self_k{i}": [d.n_text_ctx, d.d_model], f"self_v{i}": [d.n_text_ctx, d.d_model],
            f"cross_k{i}": [d.decoder_heads, head_dim, POSITIONS_AXIS],
            f"cross_v{i}": [d.decoder_heads, POSITIONS_AXIS, head_dim],
            f"new_k{i}": [NEW_TOKENS_AXIS, d.d_model], f"new_v{i}": [NEW_TOKENS_AXIS, d.d_model],
        })
    return shapes


def _positions_and_mask(b: GraphBuilder, tokens: str, offset: str, axis: int = 0) -> tuple[str, str]:
    """The new tokens' positions P..P+n-1 [n], and the causal mask [n, P+n] over
    [cached | new]: new token j sees the cache and new tokens 0..j (0), not later ones (-inf).
    n is the size of the tokens' `axis`."""
    n = b.op("Shape", tokens, start=axis, end=axis + 1)  # [1]
    scalar = b.ints("shape.scalar", [])
    start = b.op("Reshape", offset, scalar)
    end = b.op("Reshape", b.op("Add", offset, n), scalar)
    one, zero = b.ints("const.int_one", 1), b.ints("const.int_zero", 0)
    rows = b.op("Range", start, end, one)  # [n]
    columns = b.op("Range", zero, end, one)  # [P + n]
    later = b.op("Greater", b.op("Unsqueeze", columns, b.ints("axis.0", [0])),
                 b.op("Unsqueeze", rows, b.ints("axis.1", [1])))
    mask = b.op("Where", later, b.scalar("const.minus_inf", float("-inf")), b.scalar("const.zero", 0.0))
    return rows, mask


def _decoder_layer(b: GraphBuilder, x: str, ckpt: Checkpoint, i: int, offset: str, mask: str,
                   cross_bias: str) -> str:
    """Self-attention over [cache | new], cross-attention over the window, the MLP; x [n, d]."""
    x = _self_attention(b, x, ckpt, i, mask, offset)
    with b.scope("encoder_attn"):
        q = _cross_query(b, x, ckpt, i)
        x = _cross_output(b, x, ckpt, i, attend(b, q, f"cross_k{i}", f"cross_v{i}", cross_bias))
    with b.scope("mlp"):
        return mlp(b, x, ckpt.state, f"model.decoder.layers.{i}")


class _Heads:
    """[n, d] <-> per-head tensors of one decoder layer (no batch axis)."""

    def __init__(self, b: GraphBuilder, ckpt: Checkpoint) -> None:
        d = ckpt.dims
        self.b, self.head_dim = b, d.d_model // d.decoder_heads
        self.split = b.ints("shape.heads", [-1, d.decoder_heads, self.head_dim])  # [n, H, dh]
        self.merge = b.ints("shape.merged", [-1, d.d_model])

    def split_as(self, t: str, perm: list[int]) -> str:
        """[n, d] -> [H, n, dh] (perm [1, 0, 2]) or [H, dh, n] for keys (perm [1, 2, 0])."""
        return self.b.op("Transpose", self.b.op("Reshape", t, self.split), perm=perm)

    def merged(self, t: str) -> str:  # [H, n, dh] -> [n, d]
        return self.b.op("Reshape", self.b.op("Transpose", t, perm=[1, 0, 2]), self.merge)


def _self_attention(b: GraphBuilder, x: str, ckpt: Checkpoint, i: int, mask: str,
                    offset: str | None) -> str:
    """x + self_attn(norm(x)). With `offset` (the step) the keys are [cache | new] and the new
    rows are the outputs new_k{i}, new_v{i}; without (the whole sequence at once) the new
    tokens alone."""
    s = ckpt.state
    attn = f"model.decoder.layers.{i}.self_attn"
    heads = _Heads(b, ckpt)
    with b.scope("self_attn"):
        h = layer_norm(b, x, s, f"model.decoder.layers.{i}.self_attn_layer_norm")
        if offset is None:
            k = linear(b, h, s, f"{attn}.k_proj", bias=False)
            v = linear(b, h, s, f"{attn}.v_proj")
        else:
            # the new rows are graph outputs as they are: the host appends them to its cache
            new_k = linear(b, h, s, f"{attn}.k_proj", bias=False, out=f"new_k{i}")
            new_v = linear(b, h, s, f"{attn}.v_proj", out=f"new_v{i}")
            cached = [b.ints("slice.start", [0]), offset, b.ints("axis.0", [0])]  # rows 0..P-1
            k = b.op("Concat", b.op("Slice", f"self_k{i}", *cached), new_k, axis=0)
            v = b.op("Concat", b.op("Slice", f"self_v{i}", *cached), new_v, axis=0)
        q = heads.split_as(scaled_query(b, h, s, attn, heads.head_dim), [1, 0, 2])  # [H, n, dh]
        out = attend(b, q, heads.split_as(k, [1, 2, 0]), heads.split_as(v, [1, 0, 2]), mask)
        return b.op("Add", x, linear(b, heads.merged(out), s, f"{attn}.out_proj"))


def _cross_query(b: GraphBuilder, x: str, ckpt: Checkpoint, i: int) -> str:
    """The cross-attention's scaled queries [H, n, dh] of layer i."""
    layer = f"model.decoder.layers.{i}"
    h = layer_norm(b, x, ckpt.state, f"{layer}.encoder_attn_layer_norm")
    heads = _Heads(b, ckpt)
    return heads.split_as(scaled_query(b, h, ckpt.state, f"{layer}.encoder_attn", heads.head_dim), [1, 0, 2])


def _cross_output(b: GraphBuilder, x: str, ckpt: Checkpoint, i: int, out: str) -> str:
    """x + out_proj(the heads' weighted values [H, n, dh])."""
    merged = _Heads(b, ckpt).merged(out)
    return b.op("Add", x, linear(b, merged, ckpt.state, f"model.decoder.layers.{i}.encoder_attn.out_proj"))


# ---------------------------------------------------------------- alignment heads


def heads_by_layer(heads: list[list[int]]) -> dict[int, list[int]]:
    """The manifest's [layer, head] pairs as {layer: heads}, in ascending order."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in sorted(map(tuple, heads)):
        by_layer.setdefault(layer, []).append(head)
    return by_layer


def align_io_names(heads: list[list[int]]) -> tuple[list[str], list[str]]:
    """Inputs and outputs of the alignment graph: the layers up to the last alignment head's
    read the cross K/V (that last layer its keys only)."""
    last = max(heads_by_layer(heads))
    cross = [f"cross_{kind}{i}" for i in range(last + 1) for kind in ("k", "v") if i < last or kind == "k"]
    return ["token_embeddings", "cross_bias", *cross], [ALIGN_OUTPUT]


def decoder_align(ckpt: Checkpoint, heads: list[list[int]]) -> onnx.ModelProto:
    """The decoder over a whole token sequence at once (positions 0..n-1, causal), without a
    cache: the cross-attention scores of the alignment heads, for word timestamps.

    Inputs: token_embeddings [n, d] (the sequence's rows of the token table), cross_bias [T]
    and the cross K/V of decoder_cross (the step's own buffers, read in place). Output:
    alignment_scores [A, n, T], the scaled q.k of the A heads (in the order of
    `heads_by_layer`) before the bias and the softmax: the host takes the softmax over the
    window's real positions only (openai's and CTranslate2's method), so the padding row and
    its bias are left out there. The graph stops at the last alignment head's scores: the
    layers above it, the final norm and the vocabulary projection are not needed.
    """
    if not heads:
        raise ModelError(f"{ckpt.name}: the checkpoint lists no alignment heads (no word timestamps)")
    s, d = ckpt.state, ckpt.dims
    by_layer = heads_by_layer(heads)
    last = max(by_layer)
    if last >= d.decoder_layers or max(h for hs in by_layer.values() for h in hs) >= d.decoder_heads:
        raise ModelError(f"{ckpt.name}: alignment heads {heads} do not fit the decoder")
    b = GraphBuilder(DECODER_OPSET)
    head_dim = d.d_model // d.decoder_heads
    inputs, _ = align_io_names(heads)
    b.input("token_embeddings", [NEW_TOKENS_AXIS, d.d_model])
    b.input("cross_bias", [POSITIONS_AXIS])
    for name in inputs[2:]:
        shape = [d.decoder_heads, head_dim, POSITIONS_AXIS] if name.startswith("cross_k") else \
            [d.decoder_heads, POSITIONS_AXIS, head_dim]
        b.input(name, shape)
    b.output(ALIGN_OUTPUT, [sum(map(len, by_layer.values())), NEW_TOKENS_AXIS, POSITIONS_AXIS])

    rows, mask = _positions_and_mask(b, "token_embeddings", b.ints("const.offset_zero", [0]))
    table = b.weight("decoder.embed_positions.weight", s["model.decoder.embed_positions.weight"])
    x = b.op("Add", "token_embeddings", b.op("Gather", table, rows, axis=0))  # [n, d]
    picked = []
    for i in range(last + 1):
        with b.scope(f"layers.{i}"):
            x = _self_attention(b, x, ckpt, i, mask, offset=None)
            with b.scope("encoder_attn"):
                q = _cross_query(b, x, ckpt, i)
                scores = b.op("MatMul", q, f"cross_k{i}")  # [H, n, T]
                if i in by_layer:
                    picked.append(b.op("Gather", scores, b.ints(f"heads.{i}", by_layer[i]), axis=0))
                if i == last:
                    break
                probs = b.op("Softmax", b.op("Add", scores, "cross_bias"), axis=-1)
                x = _cross_output(b, x, ckpt, i, b.op("MatMul", probs, f"cross_v{i}"))
            with b.scope("mlp"):
                x = mlp(b, x, s, f"model.decoder.layers.{i}")
    b.op("Concat", *picked, axis=0, out=ALIGN_OUTPUT)
    return b.model("whisper_decoder_align")
