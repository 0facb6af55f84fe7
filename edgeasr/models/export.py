"""`edgeasr models import`: Whisper weights -> a model bundle of ONNX graphs.

Steps: read the checkpoint; export the Hailo-ready encoder (opset 13, static shapes,
simplified) and its int8 CPU variant; the cross-attention K/V graph and the cached
decoder step, fp32 and int8; the seeds' fixed-length Hailo decoder; the tokenizer;
then manifest.json with every number the runtime needs.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from edgeasr import __version__
from edgeasr.asr.features import SILENCE
from edgeasr.bundle import FORMAT, MANIFEST, SILENCE_ROLE, file_entry
from edgeasr.errors import ModelError, OutputError, ToolMissingError
from edgeasr.models.calibrate import apply_known
from edgeasr.models.checkpoint import Checkpoint, load_checkpoint
from edgeasr.models.hailo_decoder import KEPT_AS_IS, export_hailo_decoder, write_token_table

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000  # Whisper's front end: 16 kHz, 25 ms window, 10 ms hop
N_FFT = 400
HOP_LENGTH = 160
ENCODER_OPSET = 13  # what the Hailo DFC parser accepts
DECODER_OPSET = 17  # CPU only: native LayerNormalization
SILENCE_ROWS = "silence_rows.npy"
# log-mel values of silence to compute rows for: from zero audio unclamped up past the
# loudest recordings' clamp level (8 decades below their maximum)
SILENCE_STEP = 0.1
SILENCE_COUNT = 16


def _torch():
    try:
        import onnx  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        raise ToolMissingError(
            f"model export needs the export extra ({exc.name} is missing): pip install 'edgeasr[export]'"
        ) from exc
    return torch


def special_tokens(tokenizer_json: Path, n_vocab: int) -> dict:
    """Special token ids, found by their text in tokenizer.json (they shift by one between
    English-only and multilingual vocabularies)."""
    added = {t["content"]: t["id"] for t in json.loads(tokenizer_json.read_text())["added_tokens"]}

    def tid(*names: str) -> int:
        for n in names:
            if n in added:
                return added[n]
        raise ModelError(f"{tokenizer_json}: special token {names[0]} is missing")

    no_timestamps = tid("<|notimestamps|>")
    multilingual = n_vocab >= 51865
    languages = {}
    if multilingual:
        languages = {
            c[2:-2]: i for c, i in added.items()
            if c.startswith("<|") and c.endswith("|>") and 2 <= len(c) - 4 <= 3 and c[2:-2].isalpha()
            and c[2:-2].islower() and tid("<|startoftranscript|>") < i < tid("<|translate|>")
        }
    return {
        "eot": tid("<|endoftext|>"),
        "sot": tid("<|startoftranscript|>"),
        "translate": tid("<|translate|>"),
        "transcribe": tid("<|transcribe|>"),
        "sot_lm": tid("<|startoflm|>"),
        "sot_prev": tid("<|startofprev|>"),
        "no_speech": tid("<|nospeech|>", "<|nocaptions|>"),
        "no_timestamps": no_timestamps,
        "timestamp_begin": no_timestamps + 1,  # <|0.00|>, whether or not tokenizer.json lists it
        "blank": 220,  # " " in Whisper's GPT-2 byte-level BPE
        "languages": languages,
    }


def _export(torch, module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
            opset: int, dynamic_axes: dict | None = None) -> None:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(), args, str(path), input_names=inputs, output_names=outputs,
            opset_version=opset, dynamic_axes=dynamic_axes, do_constant_folding=True, dynamo=False,
        )


def _simplify(path: Path) -> None:
    import onnx
    from onnxsim import simplify

    # keep one MatMul per projection (no q/k/v fusion, no MatMul+Add -> Gemm rewrites):
    # the graph stays the shape the Hailo DFC's parser and our weight naming expect
    model, ok = simplify(onnx.load(str(path)), skipped_optimizers=list(KEPT_AS_IS))
    if not ok:
        raise ModelError(f"{path.name}: onnxsim could not validate the simplified graph")
    # onnxsim leaves some weights in Constant nodes; parsers (the Hailo DFC's among them)
    # expect weights as initializers
    graph = model.graph
    for node in [n for n in graph.node if n.op_type == "Constant" and n.attribute[0].name == "value"]:
        tensor = onnx.TensorProto()
        tensor.CopyFrom(node.attribute[0].t)
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
        graph.node.remove(node)
    onnx.save(model, str(path))


def _quantize(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs every tensor (and advice) on the root logger
    try:
        quantize_dynamic(str(src), str(dst), op_types_to_quantize=["MatMul"],
                         weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)


class _Steps:
    """Numbered export steps with timings; a progress bar when stderr is a terminal."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="step", disable=not sys.stderr.isatty(), file=sys.stderr)
        self.timings: dict[str, float] = {}

    def run(self, name: str, fn, *args):
        self.bar.set_description(name)
        t0 = time.monotonic()
        out = fn(*args)
        self.timings[name] = round(time.monotonic() - t0, 2)
        log.info("%s: %.1f s", name, self.timings[name])
        self.bar.update()
        return out

    def close(self) -> None:
        self.bar.close()


def silence_rows(torch, ckpt: Checkpoint, n_positions: int, out: Path) -> list[float]:
    """Per silence level, the 30 s encoder's mean output past the window for an input that
    holds only that level: what the decoder saw there in training (`decoding.SilenceRows`)."""
    from edgeasr.models import torch_whisper as tw

    d = ckpt.dims
    levels = [round(SILENCE + i * SILENCE_STEP, 3) for i in range(SILENCE_COUNT)]
    encoder = tw.Encoder(ckpt, 2 * d.n_audio_ctx)
    rows = []
    with torch.no_grad():
        for level in levels:
            features = encoder(torch.full((1, 1, 2 * d.n_audio_ctx, d.n_mels), level))
            rows.append(features[0, n_positions:].mean(0).numpy())
    np.save(out / SILENCE_ROWS, np.stack(rows).astype(np.float32))
    return levels


def _prepare_out(out: Path, force: bool) -> None:
    if out.exists() and any(out.iterdir()) and not force and not (out / MANIFEST).exists():
        raise OutputError(f"{out}: exists and is not an edgeasr bundle (use an empty directory)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"{out}: cannot write the bundle here ({exc.strerror})") from exc


def import_model(sources: list[str], out: Path, window_s: float = 10.0, with_30s: bool = False,
                 hailo_decoder: bool = True, force: bool = False) -> dict:
    """Build a bundle in `out`; returns the manifest."""
    torch = _torch()
    from edgeasr.models import torch_whisper as tw

    out = Path(out)
    _prepare_out(out, force)
    steps = _Steps(total=10 + int(with_30s))
    t_start = time.monotonic()
    ckpt: Checkpoint = steps.run("read weights", load_checkpoint, sources)
    d = ckpt.dims
    n_frames = int(round(window_s * SAMPLE_RATE / HOP_LENGTH))
    if n_frames % 2 or n_frames // 2 > d.n_audio_ctx:
        raise ModelError(f"window of {window_s} s does not fit the encoder ({d.n_audio_ctx} positions)")
    n_positions = n_frames // 2
    files: dict[str, str] = {}

    def encoder(frames: int, name: str) -> None:
        mel = torch.zeros(1, 1, frames, d.n_mels)
        _export(torch, tw.Encoder(ckpt, frames), (mel,), out / name, ["mel"], ["audio_features"],
                ENCODER_OPSET)
        _simplify(out / name)

    steps.run("encoder", encoder, n_frames, "encoder.onnx")
    files["encoder"] = "encoder.onnx"
    steps.run("encoder int8", _quantize, out / "encoder.onnx", out / "encoder.int8.onnx")
    files["encoder_int8"] = "encoder.int8.onnx"
    if with_30s:
        full = d.n_audio_ctx * 2
        steps.run("encoder 30 s", encoder, full, "encoder_30s.onnx")
        files["encoder_30s"] = "encoder_30s.onnx"

    levels = steps.run("silence rows", silence_rows, torch, ckpt, n_positions, out)
    files[SILENCE_ROLE] = SILENCE_ROWS

    L = d.decoder_layers
    feats = torch.zeros(1, n_positions, d.d_model)

    cross_outputs = tw.cross_io_names(L)
    # cross_k{i} [H, dh, T], cross_v{i} [H, T, dh]: outputs of one graph, inputs of the next
    cross_axes = {name: {2 if name.startswith("cross_k") else 1: "positions"} for name in cross_outputs}

    def cross_kv() -> None:
        _export(torch, tw.CrossKV(ckpt), (feats,), out / "decoder_cross.onnx", ["audio_features"],
                cross_outputs, DECODER_OPSET, {"audio_features": {1: "positions"}, **cross_axes})
        _simplify(out / "decoder_cross.onnx")

    steps.run("cross-attention K/V", cross_kv)
    files["decoder_cross"] = "decoder_cross.onnx"
    steps.run("cross-attention K/V int8", _quantize, out / "decoder_cross.onnx",
              out / "decoder_cross.int8.onnx")
    files["decoder_cross_int8"] = "decoder_cross.int8.onnx"

    step_inputs, step_outputs = tw.step_io_names(L)

    def step(quantized: bool, name: str) -> None:
        with torch.no_grad():
            cross = tw.CrossKV(ckpt)(feats)
        cache = torch.zeros(d.n_text_ctx, d.d_model)  # whole buffers, 3 positions cached
        per_layer = [t for i in range(L) for t in (cache, cache, cross[2 * i], cross[2 * i + 1])]
        args = (torch.zeros(2, d.d_model), torch.tensor([3]), torch.zeros(n_positions), *per_layer)
        dyn = {"token_embeddings": {0: "n"}, "cross_bias": {0: "positions"}, **cross_axes}
        for i in range(L):
            dyn.update({f"new_k{i}": {0: "n"}, f"new_v{i}": {0: "n"}})
        target = out / (name + ".tmp" if quantized else name)
        _export(torch, tw.DecoderStep(ckpt), args, target, step_inputs, step_outputs, DECODER_OPSET, dyn)
        if quantized:
            _quantize(target, out / name)
            target.unlink()

    ckpt_tokens = special_tokens(ckpt.tokenizer_json, d.n_vocab)
    steps.run("decoder step", step, False, "decoder_step.onnx")
    files["decoder_step"] = "decoder_step.onnx"
    steps.run("decoder step int8", step, True, "decoder_step.int8.onnx")
    files["decoder_step_int8"] = "decoder_step.int8.onnx"

    if hailo_decoder:  # it writes the token table too (its host looks rows up as well)
        files.update(steps.run("Hailo decoder (fixed length) and token table", export_hailo_decoder,
                               ckpt, out, n_positions))
    else:
        files.update(steps.run("token table", write_token_table, ckpt, out))
    shutil.copyfile(ckpt.tokenizer_json, out / "tokenizer.json")
    files["tokenizer"] = "tokenizer.json"

    def manifest() -> dict:
        m = {
            "format": FORMAT,
            "name": ckpt.name,
            "edgeasr_version": __version__,
            "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "source": ckpt.source,
            "model": {
                "multilingual": d.multilingual, "n_vocab": d.n_vocab, "d_model": d.d_model,
                "encoder_layers": d.encoder_layers, "decoder_layers": d.decoder_layers,
                "encoder_heads": d.encoder_heads, "decoder_heads": d.decoder_heads,
                "ffn_dim": d.ffn_dim, "n_text_ctx": d.n_text_ctx, "n_audio_ctx": d.n_audio_ctx,
            },
            "audio": {
                "sample_rate": SAMPLE_RATE, "n_fft": N_FFT, "hop_length": HOP_LENGTH,
                "n_mels": d.n_mels, "window_s": window_s, "n_frames": n_frames,
                "n_positions": n_positions,
            },
            "tokens": ckpt_tokens,
            "suppress_tokens": ckpt.suppress_tokens,
            "begin_suppress_tokens": ckpt.begin_suppress_tokens,
            "alignment_heads": ckpt.alignment_heads,
            "silence_levels": levels,
            "tensors": {
                "encoder": {"inputs": {"mel": [1, 1, n_frames, d.n_mels]},
                            "outputs": {"audio_features": [1, n_positions, d.d_model]}},
                "decoder_cross": {"inputs": ["audio_features"], "outputs": cross_outputs},
                "decoder_step": {"inputs": step_inputs, "outputs": step_outputs},
            },
            "export_timings_s": steps.timings,
            "files": {role: file_entry(out, name) for role, name in files.items()},
        }
        (out / MANIFEST).write_text(json.dumps(m, indent=2) + "\n")
        return m

    m = steps.run("manifest", manifest)
    m = apply_known(out, m)  # decoding settings calibrated for these weights (models/calibrate.py)
    steps.close()
    log.info("bundle %s written to %s in %.1f s", ckpt.name, out, time.monotonic() - t_start)
    return m
