"""Hugging Face transformers' Whisper built from a Checkpoint: the reference the exports are checked against."""

from __future__ import annotations

import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration

from edgeasr.models.checkpoint import Checkpoint


def hf_model(ckpt: Checkpoint, n_audio_ctx: int | None = None) -> WhisperForConditionalGeneration:
    """transformers' model with our weights; n_audio_ctx=500 gives the 10 s encoder."""
    d = ckpt.dims
    n_audio_ctx = n_audio_ctx or d.n_audio_ctx
    config = WhisperConfig(
        vocab_size=d.n_vocab, num_mel_bins=d.n_mels, d_model=d.d_model,
        encoder_layers=d.encoder_layers, decoder_layers=d.decoder_layers,
        encoder_attention_heads=d.encoder_heads, decoder_attention_heads=d.decoder_heads,
        encoder_ffn_dim=d.ffn_dim, decoder_ffn_dim=d.ffn_dim,
        max_source_positions=n_audio_ctx, max_target_positions=d.n_text_ctx,
        activation_function="gelu", scale_embedding=False, tie_word_embeddings=True,
    )
    config._attn_implementation = "eager"  # the exports use eager attention too
    model = WhisperForConditionalGeneration(config).eval()
    state = {k: torch.from_numpy(v) for k, v in ckpt.state.items()}
    state["model.encoder.embed_positions.weight"] = state["model.encoder.embed_positions.weight"][:n_audio_ctx]
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "proj_out.weight"]
    if missing or unexpected:
        raise AssertionError(f"weights do not map onto transformers: {missing} {unexpected}")
    return model
