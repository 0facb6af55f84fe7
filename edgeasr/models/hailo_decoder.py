"""The fixed-length, cache-free Whisper decoder in the shape Hailo's decoder HEF has (export extra).

What makes it Hailo-ready (after hailocs/hailo-whisper's patch and the newer HEF generation
that Hailo's speech_recognition app drives):
- a fixed token sequence (32 for tiny, 24 for base) and a fixed number of encoder positions,
  no KV cache: every step re-runs the whole sequence;
- the token-embedding Gather stays on the host: input `token_embeddings` is the table's rows
  for the sequence as [1, 1, L, d] (NHWC: H=1, W=L, C=d, the HEF's input_layer2); the
  positional table is a constant Add inside the graph;
- the embedding reshape patch (transpose / flatten / permute back to [1, L, d]) that Hailo's
  parser is known to accept as the start of the decoder body;
- eager attention with the causal mask as a constant;
- the [d, V] output projection split into 4 MatMuls (the whole one does not fit Hailo-8),
  giving 4 outputs [1, L, V_i] that the host concatenates on axis 2.
Opset 13, static shapes, simplified with onnxsim.
"""

from __future__ import annotations

import itertools
import logging
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from edgeasr.asr.reference_decoder import EMBEDDING_ROLE, EMBEDDINGS_INPUT, FEATURES_INPUT, GRAPH_ROLE
from edgeasr.errors import ModelError
from edgeasr.models.checkpoint import Checkpoint
from edgeasr.models.torch_whisper import _Mlp, _Norm, _Projections, _t

log = logging.getLogger(__name__)

OPSET = 13  # what the Hailo DFC parser accepts
N_OUTPUT_SPLITS = 4  # the vocabulary MatMul in 4 parts, as in Hailo's decoder HEFs
# Tokens per fixed sequence, by d_model: Hailo-8 fits 32 for tiny and 24 for base.
SEQUENCE_LENGTHS = {384: 32, 512: 24}

ONNX_NAME = "hailo_decoder.onnx"
EMBEDDING_NAME = "token_embedding.npy"
INPUTS = (FEATURES_INPUT, EMBEDDINGS_INPUT)  # the runtime's contract (edgeasr.asr.reference_decoder)
OUTPUTS = tuple(f"logits_{i}" for i in range(N_OUTPUT_SPLITS))
KEPT_AS_IS = (  # onnxsim passes not run
    "fuse_qkv", "fuse_matmul_add_bias_into_gemm", "fuse_matmul_add_bias_into_gemm_batched",
)


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


class _FixedDecoderLayer(nn.Module):
    """Self-attention over the whole fixed sequence (constant causal mask), cross-attention, MLP."""

    def __init__(self, state: dict, p: str, heads: int) -> None:
        super().__init__()
        self.norm1 = _Norm(state, f"{p}.self_attn_layer_norm")
        self.self_attn = _Projections(state, f"{p}.self_attn", heads)
        self.norm2 = _Norm(state, f"{p}.encoder_attn_layer_norm")
        self.cross_attn = _Projections(state, f"{p}.encoder_attn", heads)
        self.mlp = _Mlp(state, p)

    @staticmethod
    def _attend(a: _Projections, h: Tensor, kv: Tensor, mask: Tensor | None) -> Tensor:
        def heads(t: Tensor) -> Tensor:  # [1, n, d] -> [1, H, n, dh]
            return t.reshape(1, -1, a.heads, a.head_dim).transpose(1, 2)

        q, k, v = heads(a.q(h) * a.scale), heads(a.k(kv)), heads(a.v(kv))
        w = q @ k.transpose(2, 3)
        if mask is not None:
            w = w + mask
        out = (torch.softmax(w, dim=-1) @ v).transpose(1, 2).reshape(1, -1, a.heads * a.head_dim)
        return a.out(out)

    def forward(self, x: Tensor, xa: Tensor, mask: Tensor) -> Tensor:
        # The batch axis stays throughout (rank-4 heads, as in Hailo's patched model): indexing
        # it away would put Gathers on activations, which the NPU does not run.
        h = self.norm1(x)
        x = x + self._attend(self.self_attn, h, h, mask)
        x = x + self._attend(self.cross_attn, self.norm2(x), xa, None)
        return self.mlp(x)


class HailoDecoder(nn.Module):
    """encoder_hidden_states [1, T, d], token_embeddings [1, 1, L, d] -> 4 x logits [1, L, V_i]."""

    def __init__(self, ckpt: Checkpoint, n_tokens: int) -> None:
        super().__init__()
        s, d = ckpt.state, ckpt.dims
        if not 0 < n_tokens <= d.n_text_ctx:
            raise ModelError(f"a Hailo decoder of {n_tokens} tokens does not fit {d.n_text_ctx} positions")
        self.n_tokens = n_tokens
        pos = _t(s["model.decoder.embed_positions.weight"])[:n_tokens]
        self.register_buffer("positions", pos[None, None].clone())  # [1, 1, L, d], a constant Add
        mask = torch.full((n_tokens, n_tokens), float("-inf")).triu(1)
        self.register_buffer("mask", mask)
        self.layers = nn.ModuleList(
            _FixedDecoderLayer(s, f"model.decoder.layers.{i}", d.decoder_heads)
            for i in range(d.decoder_layers)
        )
        self.norm = _Norm(s, "model.decoder.layer_norm")
        # the tied output projection, pre-sliced and pre-transposed: one [d, V_i] constant per MatMul
        proj = _t(s["proj_out.weight"])
        bounds = np.cumsum([0, *split_sizes(d.n_vocab)])
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            self.register_buffer(f"proj_{i}", proj[lo:hi].t().contiguous())

    def forward(self, encoder_hidden_states: Tensor, token_embeddings: Tensor) -> tuple[Tensor, ...]:
        x = token_embeddings + self.positions  # [1, 1, L, d]
        # Hailo's reshape patch: NHWC rows -> NCHW -> [1, L, d]
        x = x.transpose(1, -1).flatten(2).permute(0, 2, 1)
        for layer in self.layers:
            x = layer(x, encoder_hidden_states, self.mask)
        x = self.norm(x)
        return tuple(x @ getattr(self, f"proj_{i}") for i in range(N_OUTPUT_SPLITS))


def _simplify(path: Path) -> None:
    import onnx
    from onnxsim import simplify

    # Keep one MatMul (+ Add) per projection, as Hailo's parser expects and as the weights are
    # named: no fused QKV + Split, no Reshape-Gemm-Reshape around every Linear.
    model, ok = simplify(onnx.load(str(path)), skipped_optimizers=list(KEPT_AS_IS))
    if not ok:
        raise ModelError(f"{path.name}: onnxsim could not validate the simplified graph")
    onnx.save(model, str(path))


def export_hailo_decoder(ckpt: Checkpoint, out_dir: Path, n_positions: int,
                         n_tokens: int | None = None) -> dict[str, str]:
    """Write hailo_decoder.onnx and the host's token-embedding table; returns {role: file name}.

    n_positions: encoder positions per window (500 for 10 s); n_tokens: the fixed sequence
    length, by default Hailo's for the model size.
    """
    d = ckpt.dims
    n_tokens = n_tokens or sequence_length(d.d_model)
    out_dir = Path(out_dir)
    module = HailoDecoder(ckpt, n_tokens).eval()
    args = (torch.zeros(1, n_positions, d.d_model), torch.zeros(1, 1, n_tokens, d.d_model))
    t0 = time.monotonic()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        # TorchScript exporter: static shapes, seconds; dynamo is not needed for this graph
        torch.onnx.export(module, args, str(out_dir / ONNX_NAME), input_names=list(INPUTS),
                          output_names=list(OUTPUTS), opset_version=OPSET,
                          do_constant_folding=True, dynamo=False)
    t1 = time.monotonic()
    _simplify(out_dir / ONNX_NAME)
    log.info("Hailo decoder: export %.1f s, onnxsim %.1f s", t1 - t0, time.monotonic() - t1)
    return {GRAPH_ROLE: ONNX_NAME, **write_token_table(ckpt, out_dir)}


def write_token_table(ckpt: Checkpoint, out_dir: Path) -> dict[str, str]:
    """The token table as float32 .npy, which the host reads by rows (both decoders)."""
    table = np.ascontiguousarray(ckpt.state["model.decoder.embed_tokens.weight"], dtype=np.float32)
    np.save(Path(out_dir) / EMBEDDING_NAME, table)
    return {EMBEDDING_ROLE: EMBEDDING_NAME}
