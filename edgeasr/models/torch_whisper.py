"""Whisper as plain torch modules shaped for export (export extra only: needs torch).

Our own small graphs instead of transformers' modules, so the exported ONNX is exactly
what the runtimes want: an encoder with Conv2D instead of Conv1D, NHWC input, eager
attention and a constant positional table (Hailo-ready, opset 13); a cross-attention
K/V graph run once per window; a decoder step that reads/writes an explicit self-attention
cache and returns the last position's logits only. Weights come from a Checkpoint
(Hugging Face names), and tests check every graph against transformers' model.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from edgeasr.models.checkpoint import Checkpoint


def _t(a: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


class _Linear(nn.Module):
    def __init__(self, state: dict, name: str, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(_t(state[f"{name}.weight"]), requires_grad=False)
        self.bias = nn.Parameter(_t(state[f"{name}.bias"]), requires_grad=False) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class _Norm(nn.Module):
    def __init__(self, state: dict, name: str) -> None:
        super().__init__()
        self.weight = nn.Parameter(_t(state[f"{name}.weight"]), requires_grad=False)
        self.bias = nn.Parameter(_t(state[f"{name}.bias"]), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, eps=1e-5)


class _Mlp(nn.Module):
    def __init__(self, state: dict, p: str) -> None:
        super().__init__()
        self.norm = _Norm(state, f"{p}.final_layer_norm")
        self.fc1, self.fc2 = _Linear(state, f"{p}.fc1"), _Linear(state, f"{p}.fc2")

    def forward(self, x: Tensor) -> Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class _Projections(nn.Module):
    """q, k, v, out of one attention block (k has no bias in Whisper)."""

    def __init__(self, state: dict, p: str, heads: int) -> None:
        super().__init__()
        self.q = _Linear(state, f"{p}.q_proj")
        self.k = _Linear(state, f"{p}.k_proj", bias=False)
        self.v = _Linear(state, f"{p}.v_proj")
        self.out = _Linear(state, f"{p}.out_proj")
        self.heads = heads
        self.head_dim = self.q.weight.shape[0] // heads
        self.scale = self.head_dim**-0.5

    def split(self, x: Tensor) -> Tensor:  # [n, d] -> [H, n, dh]
        return x.reshape(-1, self.heads, self.head_dim).transpose(0, 1)

    def merge(self, x: Tensor) -> Tensor:  # [H, n, dh] -> [1, n, d]
        return x.transpose(0, 1).reshape(1, -1, self.heads * self.head_dim)


class _EncoderLayer(nn.Module):
    """Keeps the batch axis throughout: rank-4 reshapes/transposes, no Gather (Hailo DFC)."""

    def __init__(self, state: dict, p: str, heads: int) -> None:
        super().__init__()
        self.norm = _Norm(state, f"{p}.self_attn_layer_norm")
        self.attn = _Projections(state, f"{p}.self_attn", heads)
        self.mlp = _Mlp(state, p)

    def heads(self, x: Tensor) -> Tensor:  # [1, T, d] -> [1, H, T, dh]
        a = self.attn
        return x.reshape(1, -1, a.heads, a.head_dim).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(x)  # [1, T, d]
        a = self.attn
        q, k, v = self.heads(a.q(h) * a.scale), self.heads(a.k(h)), self.heads(a.v(h))
        w = torch.softmax(q @ k.transpose(2, 3), dim=-1)  # eager attention, no fused SDPA
        out = (w @ v).transpose(1, 2).reshape(1, -1, a.heads * a.head_dim)
        x = x + a.out(out)
        return self.mlp(x)


class Encoder(nn.Module):
    """NHWC mel [1, 1, n_frames, n_mels] -> audio_features [1, n_frames // 2, d_model]."""

    def __init__(self, ckpt: Checkpoint, n_frames: int) -> None:
        super().__init__()
        s, d = ckpt.state, ckpt.dims
        self.n_positions = n_frames // 2
        if self.n_positions > d.n_audio_ctx:
            raise ValueError(f"{n_frames} frames exceed the model's {d.n_audio_ctx} positions")
        # Conv1D(k=3) == Conv2D(k=(1,3)) on a height-1 image: the Hailo DFC has no 1-D convs.
        self.conv1 = nn.Conv2d(d.n_mels, d.d_model, (1, 3), padding=(0, 1))
        self.conv2 = nn.Conv2d(d.d_model, d.d_model, (1, 3), stride=(1, 2), padding=(0, 1))
        for conv, name in ((self.conv1, "conv1"), (self.conv2, "conv2")):
            conv.weight = nn.Parameter(_t(s[f"model.encoder.{name}.weight"])[:, :, None, :],
                                       requires_grad=False)
            conv.bias = nn.Parameter(_t(s[f"model.encoder.{name}.bias"]), requires_grad=False)
        pos = _t(s["model.encoder.embed_positions.weight"])[: self.n_positions]
        self.register_buffer("positions", pos[None].clone())  # constant Add, no Gather
        self.layers = nn.ModuleList(
            _EncoderLayer(s, f"model.encoder.layers.{i}", d.encoder_heads)
            for i in range(d.encoder_layers)
        )
        self.norm = _Norm(s, "model.encoder.layer_norm")

    def forward(self, mel: Tensor) -> Tensor:
        x = mel.permute(0, 3, 1, 2)  # NHWC -> NCHW [1, n_mels, 1, F]
        x = F.gelu(self.conv2(F.gelu(self.conv1(x))))  # [1, d, 1, F/2]
        x = x.flatten(2).transpose(1, 2) + self.positions  # [1, T, d]
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class CrossKV(nn.Module):
    """audio_features [1, T, d] -> per layer i: cross_k{i} [H, dh, T] (pre-transposed) and
    cross_v{i} [H, T, dh], the step graph's inputs as they are (`cross_io_names`)."""

    def __init__(self, ckpt: Checkpoint) -> None:
        super().__init__()
        s, d = ckpt.state, ckpt.dims
        self.proj = nn.ModuleList(
            _Projections(s, f"model.decoder.layers.{i}.encoder_attn", d.decoder_heads)
            for i in range(d.decoder_layers)
        )

    def forward(self, audio_features: Tensor) -> tuple[Tensor, ...]:
        # one output per tensor, not a stacked [L, ...] pair: stacking copied all of them
        # again (measured: 5.5 -> 3.6 ms per window for tiny)
        h = audio_features[0]
        return tuple(t for p in self.proj for t in (p.split(p.k(h)).transpose(1, 2), p.split(p.v(h))))


def cross_io_names(layers: int) -> list[str]:
    """Outputs of the cross-attention K/V graph, in CrossKV's order."""
    return [f"cross_{kind}{i}" for i in range(layers) for kind in ("k", "v")]


class _DecoderLayer(nn.Module):
    def __init__(self, state: dict, p: str, heads: int) -> None:
        super().__init__()
        self.norm1 = _Norm(state, f"{p}.self_attn_layer_norm")
        self.self_attn = _Projections(state, f"{p}.self_attn", heads)
        self.norm2 = _Norm(state, f"{p}.encoder_attn_layer_norm")
        self.cross_attn = _Projections(state, f"{p}.encoder_attn", heads)
        self.mlp = _Mlp(state, p)

    def forward(self, x, mask, past_k, past_v, cross_k, cross_v, cross_bias):
        a = self.self_attn
        h = self.norm1(x)[0]  # [n, d]
        k_new, v_new = a.k(h), a.v(h)
        k = a.split(torch.cat([past_k, k_new]))  # [H, P+n, dh]
        v = a.split(torch.cat([past_v, v_new]))
        w = torch.softmax((a.split(a.q(h) * a.scale) @ k.transpose(1, 2)) + mask, dim=-1)
        x = x + a.out(a.merge(w @ v))
        c = self.cross_attn
        q = c.split(c.q(self.norm2(x)[0]) * c.scale)
        x = x + c.out(c.merge(torch.softmax(q @ cross_k + cross_bias, dim=-1) @ cross_v))
        return self.mlp(x), k_new, v_new


def step_io_names(layers: int) -> tuple[list[str], list[str]]:
    """Inputs and outputs of the decoder step graph: one cache tensor per layer and kind,
    so that every one is a contiguous slice of the host's buffers (no copy, no Split)."""
    per_layer = [f"{kind}{i}" for i in range(layers) for kind in ("self_k", "self_v", "cross_k", "cross_v")]
    outputs = ["logits"] + [f"{kind}{i}" for i in range(layers) for kind in ("new_k", "new_v")]
    return ["token_embeddings", "offset", "cross_bias", *per_layer], outputs


class DecoderStep(nn.Module):
    """One cached decoder call for n new tokens (the prompt, then 1 token per step), through
    the vocabulary projection of the last position.

    token_embeddings [n, d] are the tokens' rows of the token table, which the host reads
    from token_embedding.npy row by row (the table is the largest tensor of the model and
    a window uses a few dozen rows); offset [1] is the number of cached positions P. Per
    layer i: self_k{i}, self_v{i} [n_text_ctx, d] are the host's whole cache buffers, of
    which the graph reads the first P rows (so the host binds them once, not per step);
    cross_k{i} [H, dh, T] (pre-transposed) and cross_v{i} [H, T, dh] come from CrossKV;
    cross_bias [T] is added to the cross-attention scores (log(count) on the one padding
    row that stands for count rows, see DecoderSession.start). Returns the last position's
    logits [1, n_vocab] and new_k{i}, new_v{i} [n, d] to append to the cache.

    The projection (most of a step's bytes) is in this graph rather than one of its own so
    that a token is one onnxruntime run: one thread pool that can stay awake from token to
    token (see DecoderSession).
    """

    def __init__(self, ckpt: Checkpoint) -> None:
        super().__init__()
        s, d = ckpt.state, ckpt.dims
        self.register_buffer("positions", _t(s["model.decoder.embed_positions.weight"]))
        self.layers = nn.ModuleList(
            _DecoderLayer(s, f"model.decoder.layers.{i}", d.decoder_heads)
            for i in range(d.decoder_layers)
        )
        self.norm = _Norm(s, "model.decoder.layer_norm")
        # [d, V]: MatMul's weight layout, which dynamic int8 quantization handles
        self.register_buffer("proj_t", _t(s["proj_out.weight"]).t().contiguous())

    def forward(self, token_embeddings, offset, cross_bias, *per_layer):
        n, past = token_embeddings.shape[0], offset[0]
        steps = torch.arange(n, dtype=torch.int64)
        x = (token_embeddings + self.positions[offset + steps])[None]  # [1, n, d]
        # causal mask over [cached | new]: new token i sees cached + new[0..i]
        cols = torch.arange(past + n, dtype=torch.int64)
        mask = torch.where(cols[None, :] > (past + steps)[:, None], float("-inf"), 0.0)
        new = []
        for i, layer in enumerate(self.layers):
            self_k, self_v, cross_k, cross_v = per_layer[4 * i : 4 * i + 4]
            x, k, v = layer(x, mask, self_k[:past], self_v[:past], cross_k, cross_v, cross_bias)
            new += [k, v]
        return (self.norm(x[:, -1]) @ self.proj_t, *new)  # [1, V], new_k0, new_v0, ...
