"""What the benchmarks share: a row's configuration, a set's rows, faster-whisper on the
weights a bundle was imported from."""

from __future__ import annotations

import csv
from pathlib import Path

from edgeasr.errors import MissingInputError, ToolMissingError


def row_config(args, keys: dict):
    """The configuration of a benchmark row: the command line's, on the row's bundle and threads."""
    from edgeasr.commands.common import load

    return load(args, {"model.path": args.model, "encoder.threads": args.threads,
                       "decoder.threads": args.threads, **keys})


def read_set(set_dir: Path, limit: int = 0) -> list[dict]:
    manifest = set_dir / "manifest.tsv"
    if not manifest.is_file():
        raise MissingInputError(f"{manifest}: no manifest.tsv in the benchmark set")
    with manifest.open(newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return rows[:limit] if limit else rows


def ct2_files(bundle) -> dict[str, bytes] | None:
    """The CTranslate2 model the bundle was imported from, as faster-whisper's in-memory
    files: model.bin joined from its parts, with the files beside the first part."""
    source = bundle.manifest["source"]
    parts = [Path(f) for f in source.get("files", [])]
    if source.get("kind") != "ctranslate2" or not parts or not all(p.is_file() for p in parts):
        return None
    files = {"model.bin": b"".join(p.read_bytes() for p in parts)}
    for name in ("config.json", "vocabulary.txt", "vocabulary.json"):
        if (parts[0].parent / name).is_file():
            files[name] = (parts[0].parent / name).read_bytes()
    # the bundle's tokenizer, its lost merges put back (edgeasr/tokenizer_merges.py): a prompt
    # is then written alike for both
    files["tokenizer.json"] = bundle.path("tokenizer").read_bytes()
    return files


def faster_whisper(bundle, threads: int):
    """faster-whisper's int8 model on the bundle's weights, None without them."""
    try:
        from faster_whisper import WhisperModel
    except ImportError as exc:
        raise ToolMissingError("faster-whisper needs the bench extra: pip install 'edgeasr[bench]'") from exc
    files = ct2_files(bundle)
    if files is None:
        return None
    return WhisperModel(bundle.name, device="cpu", compute_type="int8", cpu_threads=threads, files=files)
