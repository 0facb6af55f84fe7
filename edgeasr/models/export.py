"""`edgeasr models import`: Whisper weights -> a model bundle of ONNX graphs.

Steps (`import_model`): read the checkpoint; pick the encoder window; build the encoder, the
cross-attention K/V graph, the cached decoder step and the alignment graph from its weights
(`graphs.py`) and quantize them to int8 for the CPU (`BundleFiles.cpu_graph`); compute the
silence rows with the 30 s encoder in onnxruntime; write the token table and the tokenizer
(`write_graphs`); then manifest.json with every number the runtime needs (`write_manifest`),
and the decoding calibrated for known weights (`known_decoding.apply_known`).

The default bundle holds what the runtime reads (the int8 graphs, the alignment graph for
word timestamps among them; the int8 encoder takes windows of any length), the token table,
the silence rows, the tokenizer). Extras add
graphs for other uses:
- fp32: encoder.onnx, decoder_cross.onnx, decoder_step.onnx, decoder_align.onnx (precision
  fp32, weight dumps);
- beam: decoder_step_batch.int8.onnx (+ .onnx with fp32), the step for a beam's hypotheses
  in one run (decoder.beam_size > 1, the search held to a home's sentences), and
  decoder_score.int8.onnx, the step with every position's logits (texts read by teacher forcing);
- hailo: the Hailo-ready fp32 encoder.onnx (lint-hailo, compile-hef) and hailo_decoder.onnx
  (the full-NPU reference decoder);
- 30s: encoder_30s.onnx (the benchmark's 30 s reference row);
- shortlist: the two-stage vocabulary projection (models/shortlist.py: decoder_step_shortlist
  and decoder_verify, int8, and projection_rows.int8.npy), for decoder.projection: shortlist.
Only numpy, onnx and onnxruntime are needed, so a device can import from its own packages.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeasr import __version__, tokenizer_merges
from edgeasr.asr.features import SILENCE
from edgeasr.bundle import FORMAT, MANIFEST, SILENCE_ROLE, TAIL_MAP_ROLE, file_entry
from edgeasr.errors import ModelError, OutputError, ToolMissingError, UsageError
from edgeasr.models.checkpoint import Checkpoint, Dims, load_checkpoint
from edgeasr.models.known_decoding import apply_known, known_decoding

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000  # Whisper's front end: 16 kHz, 25 ms window, 10 ms hop
N_FFT = 400
HOP_LENGTH = 160
SILENCE_ROWS = "silence_rows.npy"
# log-mel values of silence to compute rows for: from zero audio unclamped up past the
# loudest recordings' clamp level (8 decades below their maximum)
SILENCE_STEP = 0.1
SILENCE_COUNT = 16
EXTRAS = ("fp32", "hailo", "30s", "beam", "shortlist")
DEFAULT_WINDOW_S = 10.0  # the encoder window unless --window-s says otherwise
DEFAULT_TAIL = "auto"  # --tail (models.TAIL_MODES)


def _onnx():
    try:
        import onnx  # noqa: F401
    except ImportError as exc:
        raise ToolMissingError(
            f"model import needs the onnx package ({exc.name} is missing): pip install onnx"
        ) from exc


def check_extras(extras) -> frozenset[str]:
    """The extras asked for, or a UsageError naming the unknown ones."""
    unknown = set(extras) - set(EXTRAS)
    if unknown:
        raise UsageError(f"--with: unknown extra {', '.join(sorted(unknown))} (known: {', '.join(EXTRAS)})")
    return frozenset(extras)


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


def quantize(model, dst: Path, keep_float: list[str] | None = None) -> None:
    """int8 weights for every MatMul with a constant weight (but the nodes named in
    `keep_float`), activations quantized at run time (onnxruntime's dynamic quantization).
    `model` may be changed in place: save it first."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs every tensor (and advice) on the root logger
    try:
        quantize_dynamic(model, str(dst), op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8,
                         nodes_to_exclude=keep_float or [])
    finally:
        root.setLevel(level)


def mlp_matmuls(names: Sequence[str] = ("fc1", "fc2")) -> Callable[[Any], list[str]]:
    """keep_float that keeps the MLPs' MatMul nodes named (fc1, fc2) in float32: GELU's output
    has outliers that int8 activations (one scale per tensor) round away. Measured:
    - the alignment graph, both: the alignment heads' attention moves with them. Against
      CTranslate2 (tiny.en, 1874 token starts) within one position 94.6 % all int8, 98.3 %
      with the MLPs in float32 (98.6 % all float32); tiny's graph 7.8 -> 18.4 MB, ~10 % slower;
    - the decoder steps, as measured per model (`known.json` int8_float), on the dev set,
      greedy, interleaved: base 8.83 -> 7.49 % WER (CER 4.42 -> 3.11 %) with fc2 float, for
      1.19x the decoder time (both MLP MatMuls: 8.20 %; the vocabulary projection: 8.20 % at
      1.51x); tiny.en 9.96 -> 10.46 %, so tiny.en stays all int8."""
    def pick(model) -> list[str]:
        return [n.name for n in model.graph.node
                if n.op_type == "MatMul" and any(f"/mlp/{name}/" in n.name for name in names)]
    return pick


def silence_rows(session, ckpt: Checkpoint, n_positions: int, out: Path) -> list[float]:
    """Per silence level, the 30 s encoder's (`session`'s) mean output past the window for an
    input that holds only that level: what the decoder saw there in training
    (`tail.SilenceRows`)."""
    d = ckpt.dims
    levels = [round(SILENCE + i * SILENCE_STEP, 3) for i in range(SILENCE_COUNT)]
    rows = []
    for level in levels:
        mel = np.full((1, 1, 2 * d.n_audio_ctx, d.n_mels), level, np.float32)
        features = session.run(None, {"mel": mel})[0]
        rows.append(features[0, n_positions:].mean(0))
    np.save(out / SILENCE_ROWS, np.stack(rows).astype(np.float32))
    return levels


class _Steps:
    """Numbered import steps with timings; a progress bar when stderr is a terminal."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="step", disable=not sys.stderr.isatty(), file=sys.stderr)
        self.timings: dict[str, float] = {}

    def run(self, name: str, fn, *args, **kwargs):
        self.bar.set_description(name)
        t0 = time.monotonic()
        out = fn(*args, **kwargs)
        self.timings[name] = round(time.monotonic() - t0, 2)
        log.info("%s: %.1f s", name, self.timings[name])
        self.bar.update()
        return out

    def close(self) -> None:
        self.bar.close()


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


@dataclass(frozen=True)
class EncoderWindow:
    """The encoder's input window: seconds, log-mel frames in, positions out."""

    seconds: float
    n_frames: int
    n_positions: int


def encoder_window(window_s: float, dims: Dims) -> EncoderWindow:
    """The window of `window_s` seconds, or a ModelError when the encoder cannot take it."""
    n_frames = int(round(window_s * SAMPLE_RATE / HOP_LENGTH))
    if n_frames % 2 or n_frames // 2 > dims.n_audio_ctx:
        raise ModelError(f"window of {window_s} s does not fit the encoder ({dims.n_audio_ctx} positions)")
    return EncoderWindow(window_s, n_frames, n_frames // 2)


def _all_int8(model) -> list[str]:
    return []


def decoder_step_float(ckpt: Checkpoint) -> Callable[[Any], list[str]]:
    """keep_float for the decoder steps: the MLP MatMuls `known.json` keeps in float32 for
    these weights (`int8_float`), none for weights it does not know."""
    known = known_decoding(ckpt.source.get("sha256", "")) or {}
    return mlp_matmuls(known.get("int8_float", []))


class BundleFiles:
    """Writes a bundle's files into `out` and records each under its role, in the order
    written: manifest.json lists them in that order, so the steps' order is the manifest's."""

    def __init__(self, out: Path, ckpt: Checkpoint) -> None:
        self.out, self.ckpt = out, ckpt
        self.roles: dict[str, str] = {}
        self.sections: dict[str, dict] = {}  # manifest sections a step adds (`shortlist`, `tail_map`)
        self.encoder_30s: Any = None  # its onnxruntime session, from the silence rows' step to the tail map's

    def cpu_graph(self, role: str, build, *args, keep_fp32: bool,
                  keep_float: Callable[[Any], list[str]] = _all_int8) -> None:
        """Build a graph from the weights, save it in fp32 when that is wanted, then its int8
        variant (but the nodes keep_float(model) names)."""
        from edgeasr.models.onnx_builder import save

        model = build(self.ckpt, *args)
        if keep_fp32:
            save(model, self.out / f"{role}.onnx")
            self.roles[role] = f"{role}.onnx"
        quantize(model, self.out / f"{role}.int8.onnx", keep_float(model))  # last: it may change the model
        self.roles[f"{role}_int8"] = f"{role}.int8.onnx"

    def encoder(self, n_frames: int, keep_fp32: bool) -> None:
        """The fp32 encoder for windows of n_frames (when wanted), the int8 one for any length."""
        from edgeasr.models import graphs
        from edgeasr.models.onnx_builder import save

        if keep_fp32:
            save(graphs.encoder(self.ckpt, n_frames), self.out / "encoder.onnx")
            self.roles["encoder"] = "encoder.onnx"
        quantize(graphs.encoder(self.ckpt, None), self.out / "encoder.int8.onnx")
        self.roles["encoder_int8"] = "encoder.int8.onnx"

    def silence_rows(self, window: EncoderWindow, keep_30s: bool) -> list[float]:
        """The decoder's padding rows, from the 30 s encoder (kept as a file with the 30s
        extra, and in memory for the tail map's step); returns their silence levels."""
        import onnxruntime as ort

        from edgeasr.models import graphs
        from edgeasr.models.onnx_builder import save

        encoder_30s = graphs.encoder(self.ckpt, 2 * self.ckpt.dims.n_audio_ctx)
        if keep_30s:
            save(encoder_30s, self.out / "encoder_30s.onnx")
            self.roles["encoder_30s"] = "encoder_30s.onnx"
        self.roles[SILENCE_ROLE] = SILENCE_ROWS
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        self.encoder_30s = ort.InferenceSession(encoder_30s.SerializeToString(), opts,
                                                providers=["CPUExecutionProvider"])
        return silence_rows(self.encoder_30s, self.ckpt, window.n_positions, self.out)

    def tail_map(self, window: EncoderWindow, mode: str) -> None:
        """The tail map past the window (models/tail_fit.py; `mode` as --tail says): the one
        edgeasr ships for these weights, else one fitted on synthesised speech with the bundle's
        own encoders as teacher and student, else none (the decoder pads with the silence row)."""
        from edgeasr.asr.features import MelSpec
        from edgeasr.models.tail_fit import TAIL_MAP_FILE, Teacher, write_tail_map

        if window.n_positions >= self.ckpt.dims.n_audio_ctx:
            return  # a 30 s window: no positions past it
        spec = MelSpec(SAMPLE_RATE, N_FFT, HOP_LENGTH, self.ckpt.dims.n_mels, window.n_frames)
        section = write_tail_map(self.out, self.ckpt.source.get("sha256", ""), window.n_positions, mode,
                                 lambda: Teacher(self.out / self.roles["encoder_int8"], self.encoder_30s, spec,
                                                 window.n_positions))
        self.encoder_30s = None  # its last use
        if section is not None:
            self.roles[TAIL_MAP_ROLE] = TAIL_MAP_FILE
            self.sections["tail_map"] = section

    def token_table(self, window: EncoderWindow, hailo_decoder: bool) -> None:
        """The token table the decoders read by rows; with `hailo_decoder`, the full-NPU
        reference decoder beside it (its host looks rows up as well)."""
        from edgeasr.models.hailo_decoder import export_hailo_decoder, write_token_table

        if hailo_decoder:
            self.roles.update(export_hailo_decoder(self.ckpt, self.out, window.n_positions))
        else:
            self.roles.update(write_token_table(self.ckpt, self.out))

    def shortlist(self, window: EncoderWindow) -> None:
        """The two-stage projection's files from the int8 step, and its manifest section. The
        first pass's basis is the one fitted on real decodes of these weights where edgeasr ships
        it, else the data-free one (models/shortlist.py)."""
        from edgeasr.models import shortlist

        tokens = special_tokens(self.ckpt.tokenizer_json, self.ckpt.dims.n_vocab)
        basis = shortlist.known_basis(self.ckpt.source.get("sha256", ""))
        kind = "fit" if basis is not None else "svd"
        step = self.out / self.roles["decoder_step_int8"]
        tail = [tokens["eot"], tokens["timestamp_begin"] + window.n_positions + 1]
        if basis is None:
            basis = shortlist.svd_basis(shortlist.text_rows(step, self.ckpt.suppress_tokens, tokens["eot"]))
        roles, weight_scale = shortlist.write_shortlist(step, self.out, self.ckpt.suppress_tokens, tail[0],
                                                        tail[1], basis)
        self.roles.update(roles)
        self.sections["shortlist"] = {"rank": int(basis.shape[1]), "candidates": shortlist.CANDIDATES,
                                      "tail": tail, "weight_scale": weight_scale, "basis": kind}

    def tokenizer(self) -> None:
        """The checkpoint's tokenizer.json, its lost merges put back (edgeasr/tokenizer_merges.py)."""
        restored = tokenizer_merges.write_whole(self.ckpt.tokenizer_json, self.out / "tokenizer.json")
        if restored:
            log.info("%s: %d merge(s) its list had lost put back", self.ckpt.tokenizer_json, restored)
        self.roles["tokenizer"] = "tokenizer.json"

    def entries(self) -> dict[str, dict]:
        """Each file's manifest entry (path, bytes, sha256), by role."""
        return {role: file_entry(self.out, name) for role, name in self.roles.items()}


def write_graphs(files: BundleFiles, window: EncoderWindow, extras: frozenset[str], steps: _Steps,
                 tail: str = DEFAULT_TAIL) -> list[float]:
    """Every ONNX graph the bundle holds, the padding's rows and tail map, the token table and
    the tokenizer, each a step; returns the silence levels of the padding rows."""
    from edgeasr.models import graphs
    from edgeasr.models.batch_graph import decoder_step_batch

    fp32 = "fp32" in extras
    ckpt = files.ckpt
    # the fp32 encoder is the Hailo-ready one (a fixed window): the hailo extra needs it as much
    # as fp32 does; the CPU's int8 one takes any number of frames (the same output for a full window)
    steps.run("encoder", files.encoder, window.n_frames, keep_fp32=bool(extras & {"fp32", "hailo"}))
    levels = steps.run("30 s encoder and silence rows", files.silence_rows, window, keep_30s="30s" in extras)
    steps.run("tail map", files.tail_map, window, tail)
    steps.run("cross-attention K/V", files.cpu_graph, "decoder_cross", graphs.decoder_cross, keep_fp32=fp32)
    step_float = decoder_step_float(ckpt)
    steps.run("decoder step", files.cpu_graph, "decoder_step", graphs.decoder_step,
              keep_fp32=fp32, keep_float=step_float)
    if "shortlist" in extras:
        steps.run("two-stage projection", files.shortlist, window)
    # small (the decoder's layers without the vocabulary projection: 18 MB for tiny, 47 MB
    # for base): in the default bundle, so that output.words works with any bundle
    if ckpt.alignment_heads:
        steps.run("alignment heads", files.cpu_graph, "decoder_align", graphs.decoder_align,
                  ckpt.alignment_heads, keep_fp32=fp32, keep_float=mlp_matmuls())
    else:  # a fine-tuned checkpoint may not say which heads follow the audio
        log.warning("%s lists no alignment heads: the bundle has no word timestamps", ckpt.name)
    if "beam" in extras:
        steps.run("batched decoder step", files.cpu_graph, "decoder_step_batch", decoder_step_batch,
                  keep_fp32=fp32, keep_float=step_float)
        steps.run("scoring decoder step", files.cpu_graph, "decoder_score", graphs.decoder_score,
                  keep_fp32=fp32, keep_float=step_float)
    if "hailo" in extras:
        steps.run("Hailo decoder (fixed length) and token table", files.token_table, window, hailo_decoder=True)
    else:
        steps.run("token table", files.token_table, window, hailo_decoder=False)
    files.tokenizer()
    return levels


def tensor_names(ckpt: Checkpoint, window: EncoderWindow) -> dict:
    """The manifest's `tensors`: each graph's inputs and outputs the runtime binds."""
    from edgeasr.models import graphs

    d = ckpt.dims
    step_inputs, step_outputs = graphs.step_io_names(d.decoder_layers)
    tensors = {
        "encoder": {"inputs": {"mel": [1, 1, window.n_frames, d.n_mels]},
                    "outputs": {"audio_features": [1, window.n_positions, d.d_model]}},
        "decoder_cross": {"inputs": ["audio_features"], "outputs": graphs.cross_io_names(d.decoder_layers)},
        "decoder_step": {"inputs": step_inputs, "outputs": step_outputs},
    }
    if ckpt.alignment_heads:
        tensors["decoder_align"] = dict(zip(("inputs", "outputs"), graphs.align_io_names(ckpt.alignment_heads)))
    return tensors


def write_manifest(files: BundleFiles, window: EncoderWindow, extras: frozenset[str], levels: list[float],
                   timings: dict[str, float]) -> dict:
    """manifest.json: every number the runtime reads, and each file with its sha256."""
    ckpt, d = files.ckpt, files.ckpt.dims
    m = {
        "format": FORMAT,
        "name": ckpt.name,
        "edgeasr_version": __version__,
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "source": ckpt.source,
        "extras": sorted(extras),
        "model": {
            "multilingual": d.multilingual, "n_vocab": d.n_vocab, "d_model": d.d_model,
            "encoder_layers": d.encoder_layers, "decoder_layers": d.decoder_layers,
            "encoder_heads": d.encoder_heads, "decoder_heads": d.decoder_heads,
            "ffn_dim": d.ffn_dim, "n_text_ctx": d.n_text_ctx, "n_audio_ctx": d.n_audio_ctx,
        },
        "audio": {
            "sample_rate": SAMPLE_RATE, "n_fft": N_FFT, "hop_length": HOP_LENGTH,
            "n_mels": d.n_mels, "window_s": window.seconds, "n_frames": window.n_frames,
            "n_positions": window.n_positions,
        },
        "tokens": special_tokens(ckpt.tokenizer_json, d.n_vocab),
        "suppress_tokens": ckpt.suppress_tokens,
        "begin_suppress_tokens": ckpt.begin_suppress_tokens,
        "alignment_heads": ckpt.alignment_heads,
        "silence_levels": levels,
        "tensors": tensor_names(ckpt, window),
        **files.sections,
        "export_timings_s": timings,
        "files": files.entries(),
    }
    (files.out / MANIFEST).write_text(json.dumps(m, indent=2) + "\n")
    return m


def import_model(sources: list[str], out: Path, window_s: float = DEFAULT_WINDOW_S, extras=(),
                 force: bool = False, tail: str = DEFAULT_TAIL) -> dict:
    """Build a bundle in `out` with the default files plus `extras` (see EXTRAS) and the tail
    map `tail` asks for (models.TAIL_MODES); returns the manifest."""
    _onnx()
    extras = check_extras(extras)
    out = Path(out)
    _prepare_out(out, force)
    steps = _Steps(total=9 + 2 * ("beam" in extras) + ("shortlist" in extras))
    t_start = time.monotonic()
    ckpt: Checkpoint = steps.run("read weights", load_checkpoint, sources)
    window = encoder_window(window_s, ckpt.dims)
    files = BundleFiles(out, ckpt)
    levels = write_graphs(files, window, extras, steps, tail)
    m = steps.run("manifest", write_manifest, files, window, extras, levels, dict(steps.timings))
    m = apply_known(out, m)  # decoding settings calibrated for these weights (models/known_decoding.py)
    steps.close()
    log.info("bundle %s written to %s in %.1f s", ckpt.name, out, time.monotonic() - t_start)
    return m
