"""The cached decoder step with a batch axis: the beam's hypotheses in one onnxruntime run.

`decoder_step_batch` is `graphs.decoder_step` for B sequences at once that share one window
and one prompt. Inputs: token_embeddings [B, n, d]; offset [1], the number of each sequence's
own cached tokens after the prompt (every hypothesis has the same length); per layer the
prompt's self-attention keys prefix_k{i} [H, dh, P] and values prefix_v{i} [H, P, dh], once
for all B; the sequences' own caches self_k{i}, self_v{i} [B, n_text_ctx, d] (the host's
whole buffers, of which the first `offset` rows are read); the cross K/V and the score bias
of `decoder_cross`, once for all B. Outputs: logits [B, n_vocab] of each sequence's last
position, their logsumexp [B], and new_k{i}, new_v{i} [B, n, d].

One run for B rows instead of B runs: the weights (the vocabulary projection above all) are
read once per step for every hypothesis. The prompt is read in place like the window: with
it in every row's cache, the step copied and transposed B copies of it per layer (measured:
Transpose, Concat and Slice were half of a 5-row step's kernel time, after a 61-token names
prompt), and the host copied them per step when hypotheses changed places.
"""

from __future__ import annotations

import onnx

from edgeasr.models.checkpoint import Checkpoint
from edgeasr.models.graphs import (
    DECODER_OPSET,
    INT64_MAX,
    NEW_TOKENS_AXIS,
    POSITIONS_AXIS,
    _positions_and_mask,
    declare_step_io,
    step_io_names,
)
from edgeasr.models.onnx_builder import GraphBuilder, attend, layer_norm, linear, mlp, scaled_query

BATCH_AXIS = "batch"  # dynamic: hypotheses of a beam
PREFIX_AXIS = "prefix"  # dynamic: the prompt's positions, shared by the hypotheses


def batch_io_names(layers: int) -> tuple[list[str], list[str]]:
    """The batched step's inputs and outputs: decoder_step's, the prompt's keys and values, and
    each row's log-sum-exp of its logits (the log-softmax's normalizer)."""
    inputs, outputs = step_io_names(layers)
    return inputs + [f"prefix_{kind}{i}" for i in range(layers) for kind in ("k", "v")], [*outputs, "logsumexp"]


def _shapes(d) -> dict[str, list]:
    head_dim = d.d_model // d.decoder_heads
    shapes = {"token_embeddings": [BATCH_AXIS, NEW_TOKENS_AXIS, d.d_model], "offset": [1],
              "cross_bias": [POSITIONS_AXIS], "logits": [BATCH_AXIS, d.n_vocab],
              "logsumexp": [BATCH_AXIS]}
    for i in range(d.decoder_layers):
        shapes.update({
            f"self_k{i}": [BATCH_AXIS, d.n_text_ctx, d.d_model], f"self_v{i}": [BATCH_AXIS, d.n_text_ctx, d.d_model],
            f"cross_k{i}": [d.decoder_heads, head_dim, POSITIONS_AXIS],
            f"cross_v{i}": [d.decoder_heads, POSITIONS_AXIS, head_dim],
            f"prefix_k{i}": [d.decoder_heads, head_dim, PREFIX_AXIS],
            f"prefix_v{i}": [d.decoder_heads, PREFIX_AXIS, head_dim],
            f"new_k{i}": [BATCH_AXIS, NEW_TOKENS_AXIS, d.d_model], f"new_v{i}": [BATCH_AXIS, NEW_TOKENS_AXIS, d.d_model],
        })
    return shapes


def decoder_step_batch(ckpt: Checkpoint) -> onnx.ModelProto:
    """B cached decoder calls in one (see the module docstring)."""
    s, d = ckpt.state, ckpt.dims
    b = GraphBuilder(DECODER_OPSET)
    inputs, outputs = batch_io_names(d.decoder_layers)
    declare_step_io(b, inputs, outputs, _shapes(d))
    x, offset = "token_embeddings", "offset"
    # each row's own positions t..t+n-1 [n] and its causal mask [n, t + n]: the prompt is seen whole
    rows, mask = _positions_and_mask(b, x, offset, axis=1)
    prompt = b.op("Shape", "prefix_k0", start=2, end=3)  # [1]: P
    table = b.weight("decoder.embed_positions.weight", s["model.decoder.embed_positions.weight"])
    x = b.op("Add", x, b.op("Gather", table, b.op("Add", rows, prompt), axis=0))  # [B, n, d] + [n, d]
    for i in range(d.decoder_layers):
        with b.scope(f"layers.{i}"):
            x = _layer(b, x, ckpt, i, offset, mask, prompt)
    last = b.op("Slice", x, b.ints("slice.last", [-1]), b.ints("slice.end", [INT64_MAX]),
                b.ints("axis.1", [1]))  # [B, 1, d]: each sequence's last position
    h = layer_norm(b, last, s, "model.decoder.layer_norm")
    logits = b.op("MatMul", h, b.weight("proj_out.weight", s["proj_out.weight"].T))  # [B, 1, V]
    logits = b.op("Reshape", logits, b.ints("shape.logits", [0, d.n_vocab]), out="logits")
    # [B]: the host's 45 us a row. Written out, not ReduceLogSumExp: onnxruntime's is 7x slower
    # (0.61 against 0.09 ms for 5 rows, measured), a fifth of a search step
    vocabulary = b.ints("axis.-1", [-1])
    peak = b.op("ReduceMax", logits, axes=[-1], keepdims=1)  # [B, 1]: exp() of the rest cannot overflow
    total = b.op("ReduceSum", b.op("Exp", b.op("Sub", logits, peak)), vocabulary, keepdims=1)
    b.op("Squeeze", b.op("Add", b.op("Log", total), peak), vocabulary, out="logsumexp")
    return b.model("whisper_decoder_step_batch")


def _layer(b: GraphBuilder, x: str, ckpt: Checkpoint, i: int, offset: str, mask: str, prompt: str) -> str:
    """decoder_step's layer with the batch axis in front, x [B, n, d], and the prompt's
    keys and values beside each row's own (`prompt`: their number P, [1])."""
    s, d = ckpt.state, ckpt.dims
    layer = f"model.decoder.layers.{i}"
    heads, head_dim = d.decoder_heads, d.d_model // d.decoder_heads
    split = b.ints("shape.heads", [0, -1, heads, head_dim])  # [B, n, d] -> [B, n, H, dh] (0: keep B)
    merge = b.ints("shape.merged", [0, -1, d.d_model])

    def to_heads(t: str, perm: list[int]) -> str:
        return b.op("Transpose", b.op("Reshape", t, split), perm=perm)

    def merged(t: str) -> str:  # [B, H, n, dh] -> [B, n, d]
        return b.op("Reshape", b.op("Transpose", t, perm=[0, 2, 1, 3]), merge)

    attn = f"{layer}.self_attn"
    with b.scope("self_attn"):
        h = layer_norm(b, x, s, f"{layer}.self_attn_layer_norm")
        new_k = linear(b, h, s, f"{attn}.k_proj", bias=False, out=f"new_k{i}")
        new_v = linear(b, h, s, f"{attn}.v_proj", out=f"new_v{i}")
        cached = [b.ints("slice.start", [0]), offset, b.ints("axis.1", [1])]  # own rows 0..t-1 of each
        k = b.op("Concat", b.op("Slice", f"self_k{i}", *cached), new_k, axis=1)
        v = b.op("Concat", b.op("Slice", f"self_v{i}", *cached), new_v, axis=1)
        q = to_heads(scaled_query(b, h, s, attn, head_dim), [0, 2, 1, 3])  # [B, H, n, dh]
        # one softmax over [prompt | own]: the prompt's scores broadcast over the rows, as the window's
        scores = b.op("Concat", b.op("MatMul", q, f"prefix_k{i}"),
                      b.op("Add", b.op("MatMul", q, to_heads(k, [0, 2, 3, 1])), mask), axis=-1)
        weights = b.op("Softmax", scores, axis=-1)  # [B, H, n, P + t + n]
        to = b.ints("slice.end", [INT64_MAX])
        last = b.ints("axis.-1", [-1])
        out = b.op("Add", b.op("MatMul", b.op("Slice", weights, b.ints("slice.start", [0]), prompt, last),
                               f"prefix_v{i}"),
                   b.op("MatMul", b.op("Slice", weights, prompt, to, last), to_heads(v, [0, 2, 1, 3])))
        x = b.op("Add", x, linear(b, merged(out), s, f"{attn}.out_proj"))
    attn = f"{layer}.encoder_attn"
    with b.scope("encoder_attn"):
        h = layer_norm(b, x, s, f"{layer}.encoder_attn_layer_norm")
        q = to_heads(scaled_query(b, h, s, attn, head_dim), [0, 2, 1, 3])
        # [B, H, n, dh] @ [H, dh, T]: the window's K/V broadcast over the hypotheses (measured
        # against one [H, B*n, dh] @ [H, dh, T] product per head: as fast or faster)
        out = attend(b, q, f"cross_k{i}", f"cross_v{i}", "cross_bias")
        x = b.op("Add", x, linear(b, merged(out), s, f"{attn}.out_proj"))
    with b.scope("mlp"):
        return mlp(b, x, s, layer)
