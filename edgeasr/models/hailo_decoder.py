"""The fixed-length, cache-free Whisper decoder in the shape Hailo's decoder HEF has.

What makes it Hailo-ready (after hailocs/hailo-whisper's patch and the newer HEF generation
that Hailo's speech_recognition app drives):
- a fixed token sequence (32 for tiny, 24 for base) and a fixed number of encoder positions,
  no KV cache: every step re-runs the whole sequence;
- the token-embedding Gather stays on the host: input `token_embeddings` is the table's rows
  for the sequence as [1, 1, L, d] (NHWC: H=1, W=L, C=d, the HEF's input_layer2); the
  positional table is a constant Add inside the graph;
- the embedding reshape patch (transpose / flatten / permute back to [1, L, d]) that Hailo's
  parser is known to accept as the start of the decoder body (node `/Reshape`);
- eager attention with the causal mask as a constant, layer norm written out;
- the [d, V] output projection split into 4 MatMuls (the whole one does not fit Hailo-8),
  giving 4 outputs [1, L, V_i] that the host concatenates on axis 2 (nodes `/MatMul` ..
  `/MatMul_3`, the parser's end nodes).
Opset 13, static shapes, every activation keeps the batch axis (no Gather on activations).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx

from edgeasr.bundle import TOKEN_TABLE_ROLE
from edgeasr.errors import ModelError
from edgeasr.models.checkpoint import Checkpoint
from edgeasr.models.onnx_builder import (
    GraphBuilder,
    attend,
    batch_heads,
    layer_norm,
    linear,
    merge_batch_heads,
    mlp,
    save,
    scaled_query,
)

OPSET = 13  # what the Hailo DFC parser accepts
N_OUTPUT_SPLITS = 4  # the vocabulary MatMul in 4 parts, as in Hailo's decoder HEFs
# Tokens per fixed sequence, by d_model: Hailo-8 fits 32 for tiny and 24 for base.
SEQUENCE_LENGTHS = {384: 32, 512: 24}

# The graph's contract, which the full-NPU reference decoder (edgeasr.lab.hailo) reads.
GRAPH_ROLE = "hailo_decoder"
EMBEDDING_ROLE = TOKEN_TABLE_ROLE  # the bundle's one token table
FEATURES_INPUT = "encoder_hidden_states"  # [1, T, d]: the encoder HEF's output (input_layer1)
EMBEDDINGS_INPUT = "token_embeddings"  # [1, 1, L, d]: host-side lookup (input_layer2)

ONNX_NAME = "hailo_decoder.onnx"
EMBEDDING_NAME = "token_embedding.npy"
OUTPUTS = tuple(f"logits_{i}" for i in range(N_OUTPUT_SPLITS))
NHWC_ROWS_TO_NCHW = [0, 3, 2, 1]  # [1, 1, L, d] -> [1, d, L, 1]


def sequence_length(d_model: int) -> int:
    """The fixed decoder length Hailo's HEFs use for a model of this width."""
    if d_model not in SEQUENCE_LENGTHS:
        sizes = ", ".join(str(k) for k in SEQUENCE_LENGTHS)
        raise ModelError(f"no Hailo decoder length is known for d_model {d_model} (known: {sizes})")
    return SEQUENCE_LENGTHS[d_model]


def split_sizes(n_vocab: int, parts: int = N_OUTPUT_SPLITS) -> list[int]:
    """Vocabulary chunk sizes: equal parts, the last one takes the remainder (Hailo's split)."""
    chunk = n_vocab // parts
    return [chunk] * (parts - 1) + [n_vocab - chunk * (parts - 1)]


def hailo_decoder(ckpt: Checkpoint, n_positions: int, n_tokens: int) -> onnx.ModelProto:
    """encoder_hidden_states [1, T, d], token_embeddings [1, 1, L, d] -> 4 x logits [1, L, V_i]."""
    s, d = ckpt.state, ckpt.dims
    if not 0 < n_tokens <= d.n_text_ctx:
        raise ModelError(f"a Hailo decoder of {n_tokens} tokens does not fit {d.n_text_ctx} positions")
    b = GraphBuilder(OPSET)
    features = b.input(FEATURES_INPUT, [1, n_positions, d.d_model])
    tokens = b.input(EMBEDDINGS_INPUT, [1, 1, n_tokens, d.d_model])
    positions = s["model.decoder.embed_positions.weight"][:n_tokens][None, None]  # [1, 1, L, d]
    x = b.op("Add", tokens, b.weight("decoder.embed_positions.weight", positions))
    # Hailo's reshape patch: NHWC rows -> NCHW -> [1, d, L] -> [1, L, d]
    x = b.op("Transpose", x, perm=NHWC_ROWS_TO_NCHW)
    x = b.op("Reshape", x, b.ints("shape.flat", [1, d.d_model, n_tokens]))
    x = b.op("Transpose", x, perm=[0, 2, 1])
    # -inf strictly above the diagonal: position i sees tokens 0..i
    mask = b.weight("decoder.causal_mask", np.triu(np.full((n_tokens, n_tokens), -np.inf, np.float32), 1))
    for i in range(d.decoder_layers):
        with b.scope(f"layers.{i}"):
            x = _layer(b, x, features, ckpt, f"model.decoder.layers.{i}", mask, n_tokens, n_positions)
    x = layer_norm(b, x, s, "model.decoder.layer_norm")
    # the tied output projection, sliced and transposed: one [d, V_i] weight per MatMul
    proj = s["proj_out.weight"]
    bounds = np.cumsum([0, *split_sizes(d.n_vocab)])
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        b.output(OUTPUTS[i], [1, n_tokens, int(hi - lo)])
        b.op("MatMul", x, b.weight(f"proj_out.part_{i}.weight", proj[lo:hi].T), out=OUTPUTS[i])
    return b.model("whisper_hailo_decoder")


def _layer(b: GraphBuilder, x: str, features: str, ckpt: Checkpoint, layer: str, mask: str,
           n_tokens: int, n_positions: int) -> str:
    """Self-attention over the whole sequence (constant causal mask), cross-attention over the
    encoder positions, MLP; the heads are rank 4 with the batch axis in front."""
    s, d = ckpt.state, ckpt.dims
    heads, head_dim = d.decoder_heads, d.d_model // d.decoder_heads

    def attention(h: str, kv: str, attn: str, kv_positions: int, bias: str | None) -> str:
        q = batch_heads(b, scaled_query(b, h, s, attn, head_dim), heads, head_dim, n_tokens)
        k = batch_heads(b, linear(b, kv, s, f"{attn}.k_proj", bias=False), heads, head_dim,
                        kv_positions, keys=True)
        v = batch_heads(b, linear(b, kv, s, f"{attn}.v_proj"), heads, head_dim, kv_positions)
        out = merge_batch_heads(b, attend(b, q, k, v, bias), d.d_model, n_tokens)
        return linear(b, out, s, f"{attn}.out_proj")

    with b.scope("self_attn"):
        h = layer_norm(b, x, s, f"{layer}.self_attn_layer_norm")
        x = b.op("Add", x, attention(h, h, f"{layer}.self_attn", n_tokens, mask))
    with b.scope("encoder_attn"):
        h = layer_norm(b, x, s, f"{layer}.encoder_attn_layer_norm")
        x = b.op("Add", x, attention(h, features, f"{layer}.encoder_attn", n_positions, None))
    with b.scope("mlp"):
        return mlp(b, x, s, layer)


def export_hailo_decoder(ckpt: Checkpoint, out_dir: Path, n_positions: int,
                         n_tokens: int | None = None) -> dict[str, str]:
    """Write hailo_decoder.onnx and the host's token-embedding table; returns {role: file name}.

    n_positions: encoder positions per window (500 for 10 s); n_tokens: the fixed sequence
    length, by default Hailo's for the model size.
    """
    n_tokens = n_tokens or sequence_length(ckpt.dims.d_model)
    save(hailo_decoder(ckpt, n_positions, n_tokens), Path(out_dir) / ONNX_NAME)
    return {GRAPH_ROLE: ONNX_NAME, **write_token_table(ckpt, out_dir)}


def write_token_table(ckpt: Checkpoint, out_dir: Path) -> dict[str, str]:
    """The token table as float32 .npy, which the host reads by rows (both decoders)."""
    table = np.ascontiguousarray(ckpt.state["model.decoder.embed_tokens.weight"], dtype=np.float32)
    np.save(Path(out_dir) / EMBEDDING_NAME, table)
    return {EMBEDDING_ROLE: EMBEDDING_NAME}
