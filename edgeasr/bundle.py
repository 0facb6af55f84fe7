"""A model bundle: one directory of ONNX graphs + tokenizer, described by manifest.json.

Everything downstream reads its numbers here (window, mel bins, token ids, tensor
names) instead of from literals. `load_bundle` checks that the manifest and the files
agree (sizes always, sha256 on request) so a half-copied bundle fails at start-up
with one line, not deep inside onnxruntime.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from edgeasr.errors import MissingInputError, ModelError

if TYPE_CHECKING:
    import numpy as np

MANIFEST = "manifest.json"
# sha256 sums already checked, by file size and mtime: a Pi need not hash 100 MB at every start
VERIFIED = ".verified.json"
# 2: per-layer decoder cache tensors, separate head and token table; 3: silence rows;
# 4: per-layer outputs of the cross-attention K/V graph; 5: the step takes the whole
# self-attention cache buffers and the cached length, so the host binds them once;
# 6: the vocabulary projection is part of the step (one run per token, no head graph);
# 7: graphs built node by node from the weights with the onnx package (no torch export),
# every weight a named initializer; the fp32 graphs, the Hailo decoder and the 30 s encoder
# are there only when imported with those extras (manifest `extras`), so a reader can no
# longer count on them; 8: decoder_align (the alignment heads' cross-attention, for word
# timestamps) in the default bundle, int8 but its MLPs (fp32 with the fp32 extra); the beam
# extra: decoder_step_batch, the step for several hypotheses at once, and (optional
# within the format) decoder_score, the step with every position's logits; 9: decoder_step_batch
# reads the prompt's keys and values once for every hypothesis (prefix_k, prefix_v); 10:
# decoder_score projects the positions from its input `first` on (a prompt and a text in one run),
# and (optional within the format: either reads the other's) encoder_int8 may take any number of
# frames, so that a window whose audio ends early is encoded over fewer; optional within the
# format, the shortlist extra (its roles below and the manifest's `shortlist` section); 11:
# tokenizer.json with every merge of its vocabulary (tokenizer_merges.py: base's, as its
# package ships it, had lost one, and spelled every word beginning " t" in pieces)
FORMAT = "edgeasr-bundle/11"
# the format before, read as it is when its tokenizer lost no merge (tiny.en's, any made from a
# Hugging Face directory): the two differ in nothing else
WHOLE_TOKENIZER_FORMAT = "edgeasr-bundle/10"
# The decoder's token table, read by rows on the host (CPU decoder, Hailo reference decoder)
TOKEN_TABLE_ROLE = "token_embedding"
# What the encoder outputs past the window for a 30 s input that goes on in silence: one
# mean row per silence level (manifest `silence_levels`); the decoder pads with it
SILENCE_ROLE = "silence_rows"
# For a window whose audio ends inside it, the map from its encoding to the rows past it
# (asr/tail.py; the manifest's `tail_map` section says how it was fitted). Optional within
# format 10: a bundle without it pads every window with its silence row
TAIL_MAP_ROLE = "tail_map"
# The decoder over a whole sequence, to the alignment heads' cross-attention (word timestamps)
ALIGN_ROLE = "decoder_align"
# The decoder step for a beam's hypotheses in one run (extra `beam`)
BATCH_STEP_ROLE = "decoder_step_batch"
# The decoder step with every position's logits: a text read by teacher forcing in one run (extra `beam`)
SCORE_ROLE = "decoder_score"
# The two-stage vocabulary projection (extra `shortlist`, models/shortlist.py): the step with a
# first pass and the exact tail block, the projection's int8 rows for the host, and a window's
# steps verified at once
SHORTLIST_STEP_ROLE = "decoder_step_shortlist"
PROJECTION_ROWS_ROLE = "projection_rows"
VERIFY_ROLE = "decoder_verify"
# Roles that only a bundle imported with an extra holds (`edgeasr models import --with`)
EXTRA_ROLES = {"encoder": "fp32 or --with hailo", "decoder_cross": "fp32", "decoder_step": "fp32",
               "decoder_align": "fp32", "hailo_decoder": "hailo", "encoder_30s": "30s",
               "decoder_step_batch": "beam", "decoder_step_batch_int8": "beam",
               "decoder_score": "beam", "decoder_score_int8": "beam",
               "decoder_step_shortlist_int8": "shortlist", "projection_rows": "shortlist",
               "decoder_verify_int8": "shortlist"}


@dataclass(frozen=True)
class AudioSpec:
    sample_rate: int
    n_fft: int
    hop_length: int
    n_mels: int
    window_s: float
    n_frames: int  # mel frames per window
    n_positions: int  # encoder output positions per window

    @property
    def n_samples(self) -> int:
        return self.n_frames * self.hop_length

    @property
    def seconds_per_position(self) -> float:
        return self.window_s / self.n_positions


@dataclass(frozen=True)
class Tokens:
    eot: int
    sot: int
    translate: int
    transcribe: int
    sot_lm: int
    sot_prev: int
    no_speech: int
    no_timestamps: int
    timestamp_begin: int
    blank: int
    languages: dict[str, int]  # empty for English-only models


@dataclass(frozen=True)
class Bundle:
    root: Path
    manifest: dict
    name: str
    multilingual: bool
    audio: AudioSpec
    tokens: Tokens
    suppress_tokens: tuple[int, ...]
    begin_suppress_tokens: tuple[int, ...]
    n_vocab: int
    d_model: int
    decoder_layers: int
    decoder_heads: int
    n_text_ctx: int
    n_audio_ctx: int  # positions the decoder was trained on (1500)
    silence_levels: tuple[float, ...]  # log-mel value of silence, one per row of silence_rows
    # decoding settings calibrated for these weights (`edgeasr models calibrate`); {} = none
    decoding: dict
    alignment_heads: tuple[tuple[int, int], ...] = ()  # [layer, head] pairs whose attention follows the audio
    # the two-stage projection's numbers (manifest `shortlist`: rank, candidates, tail, basis); {} = none
    shortlist: dict = field(default_factory=dict)

    def path(self, role: str) -> Path:
        """The file for a role (encoder, encoder_int8, decoder_step, tokenizer, ...)."""
        entry = self.manifest["files"].get(role)
        if entry is None:
            hint = f"; import it with --with {EXTRA_ROLES[role]}" if role in EXTRA_ROLES else ""
            raise ModelError(f"{self.root}: the bundle has no {role} file (manifest.json files.{role}{hint})")
        return self.root / entry["path"]

    def has(self, role: str) -> bool:
        return role in self.manifest["files"]

    def graph(self, role: str, precision: str) -> Path:
        """A graph's file at the precision it runs at (int8 graphs are the roles `ROLE_int8`)."""
        return self.path(_at(role, precision))

    def has_graph(self, role: str, precision: str) -> bool:
        """Is a graph there at the precision it runs at (a bundle imported without the fp32
        extra has only the int8 ones)?"""
        return self.has(_at(role, precision))


def shortlist_text_ids(suppress_tokens, eot: int) -> np.ndarray:
    """The text tokens the two-stage projection's first pass ranks: those below end-of-text that
    no rule suppresses (the model's suppress_tokens), ascending."""
    import numpy as np

    return np.setdiff1d(np.arange(eot, dtype=np.int64), np.asarray(list(suppress_tokens), np.int64))


def _at(role: str, precision: str) -> str:
    return role + ("_int8" if precision == "int8" else "")


def sha256_files(paths: list[Path]) -> str:
    """sha256 of the files' concatenation (a split model.bin hashes as the whole)."""
    h = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    return sha256_files([path])


def file_entry(root: Path, name: str) -> dict:
    p = root / name
    return {"path": name, "bytes": p.stat().st_size, "sha256": sha256_file(p)}


def verify_files(root: Path, files: dict) -> None:
    """Every file's sha256 against the manifest; sums checked before are trusted while the
    file's size and mtime are unchanged (kept in VERIFIED when the bundle is writable)."""
    cache_path = root / VERIFIED
    try:
        cached = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cached = {}
    verified = {}
    for role, entry in files.items():
        p = root / entry["path"]
        st = p.stat()
        stamp = [st.st_size, st.st_mtime_ns, entry["sha256"]]
        if cached.get(entry["path"]) != stamp and sha256_file(p) != entry["sha256"]:
            raise ModelError(f"{p}: its sha256 does not match manifest.json ({role}): the file is corrupt "
                             "or was replaced; re-create the bundle with `edgeasr models import`")
        verified[entry["path"]] = stamp
    if verified != cached:
        try:
            cache_path.write_text(json.dumps(verified))
        except OSError:
            pass  # a read-only bundle is hashed at every start: slower, as safe


def _check_tokenizer(root: Path, manifest: dict) -> None:
    """A bundle of the format before reads only when its tokenizer lost no merge."""
    from edgeasr.tokenizer_merges import lost_from

    path = root / manifest.get("files", {}).get("tokenizer", {}).get("path", "tokenizer.json")
    lost = lost_from(path) if path.is_file() else 0
    if lost:
        raise ModelError(f"{root / MANIFEST}: format {WHOLE_TOKENIZER_FORMAT!r}, and its {path.name} lost {lost} "
                         f"merge(s), which misspells words to the command reading (re-create it with `edgeasr "
                         f"models import`)")


def load_bundle(root: Path, verify_checksums: bool = False) -> Bundle:
    root = Path(root)
    mpath = root / MANIFEST
    if not root.is_dir():
        raise MissingInputError(f"{root}: model bundle directory not found")
    if not mpath.is_file():
        raise ModelError(f"{root}: not a model bundle ({MANIFEST} is missing)")
    try:
        m = json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{mpath}: unreadable manifest ({exc})") from exc
    if m.get("format") == WHOLE_TOKENIZER_FORMAT:
        _check_tokenizer(root, m)
    elif m.get("format") != FORMAT:
        raise ModelError(f"{mpath}: format {m.get('format')!r} is not {FORMAT!r} "
                         "(re-create it with `edgeasr models import`)")
    for role, entry in m["files"].items():
        p = root / entry["path"]
        if not p.is_file():
            raise ModelError(f"{root}: {entry['path']} ({role}) is listed in {MANIFEST} but missing")
        if p.stat().st_size != entry["bytes"]:
            raise ModelError(
                f"{p}: {p.stat().st_size} bytes, the manifest says {entry['bytes']} (truncated or replaced)"
            )
    if verify_checksums:
        verify_files(root, m["files"])
    try:
        model, tok = m["model"], m["tokens"]
        return Bundle(
            root=root,
            manifest=m,
            name=m["name"],
            multilingual=model["multilingual"],
            audio=AudioSpec(**m["audio"]),
            tokens=Tokens(**tok),
            suppress_tokens=tuple(m["suppress_tokens"]),
            begin_suppress_tokens=tuple(m["begin_suppress_tokens"]),
            n_vocab=model["n_vocab"],
            d_model=model["d_model"],
            decoder_layers=model["decoder_layers"],
            decoder_heads=model["decoder_heads"],
            n_text_ctx=model["n_text_ctx"],
            n_audio_ctx=model["n_audio_ctx"],
            silence_levels=tuple(m["silence_levels"]),
            decoding=dict(m.get("decoding", {}).get("values", {})),
            alignment_heads=tuple((int(layer), int(head)) for layer, head in m["alignment_heads"]),
            shortlist=dict(m.get("shortlist", {})),
        )
    except (KeyError, TypeError) as exc:
        raise ModelError(f"{mpath}: incomplete manifest ({exc})") from exc
