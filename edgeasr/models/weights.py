"""Every weight of a bundle's fp32 graphs, per graph / layer / component, in bf16 or int8.

For inspecting what a lower-precision NPU or CPU build would hold, and how much it loses:
each initializer of encoder.onnx, decoder_cross.onnx, decoder_step.onnx (and
encoder_30s.onnx / hailo_decoder.onnx when present) becomes one .npy file under
out/<graph>/layer_<i>/<component>/<leaf>.npy:
- bf16: uint16 raw bits (round to nearest even), the dtype noted in manifest.json;
- int8: symmetric, one float32 scale per row (rows = the first axis that is not 1)
  in a sibling <leaf>.scale.npy.
Tensors that cannot be quantised (integer shape constants, values such as the causal
mask's -inf) are written as they are, and so are vectors (biases, norms) in int8.
manifest.json lists each tensor once with its shape, dtypes, bytes and round-trip error
(max abs, relative RMS) plus totals.
Every initializer carries the checkpoint's name (edgeasr.models.onnx_builder), so the
files are laid out by those names (see `layout`). numpy + onnx only.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgeasr.bundle import load_bundle
from edgeasr.errors import OutputError, ToolMissingError, UsageError
from edgeasr.models import DTYPES

FORMAT = "edgeasr-weights/1"
MANIFEST = "manifest.json"
GRAPH_ROLES = ("encoder", "encoder_30s", "decoder_cross", "decoder_step", "hailo_decoder")
INT8_MAX = 127  # symmetric int8: -127..127, no -128, so dequantisation is odd-symmetric
STACKS = ("encoder.", "decoder.")  # name prefixes the graph's role already states


@dataclass
class TensorRecord:
    name: str  # <graph>/<layer_i>/<component>/<leaf>
    graph: str
    onnx_name: str
    layer: int | None
    component: str
    shape: list[int]
    dtype: str  # as stored: bf16, int8, or the source dtype when kept as is
    source_dtype: str
    bytes: int  # stored data, scales included (file headers excluded)
    source_bytes: int
    file: str
    scale_file: str | None
    max_abs_error: float
    rel_rms_error: float
    kept: str | None  # why it is stored unquantised, if it is
    err_sq: float  # sum of squared errors and of squared values: the totals' RMS
    ref_sq: float


# ---------------------------------------------------------------- naming


def layout(graph_name: str, name: str) -> tuple[list[str], int | None]:
    """'decoder.layers.0.self_attn.q_proj.weight' in decoder_step ->
    ([decoder_step, 'layer_0', 'self_attn', 'q_proj', 'weight'], 0).

    The graph already says which stack a weight belongs to, so a leading `encoder.` or
    `decoder.` is dropped; the first `<list>.<index>` pair (layers.0) is the layer."""
    for stack in STACKS:
        name = name.removeprefix(stack)
    parts = [p for p in re.split(r"[./]", name) if p]
    layer = None
    for j in range(len(parts) - 1):
        if parts[j + 1].isdigit() and not parts[j].isdigit():
            layer = int(parts[j + 1])
            parts[j : j + 2] = [f"layer_{layer}"]
            break
    safe = [re.sub(r"[^A-Za-z0-9_-]", "_", p) for p in parts]
    return [graph_name, *safe], layer


# ---------------------------------------------------------------- encodings


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits as uint16, rounded to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _rows(x: np.ndarray) -> np.ndarray:
    shape = list(x.shape)
    while len(shape) > 1 and shape[0] == 1:
        shape.pop(0)
    return x.reshape(shape[0] if len(shape) > 1 else 1, -1)


def to_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8 (same shape as x) and float32 scales [rows, 1]."""
    rows = _rows(np.asarray(x, dtype=np.float32))
    scale = np.abs(rows).max(axis=1, keepdims=True) / INT8_MAX
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = np.clip(np.rint(rows / scale), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q.reshape(x.shape), scale


def from_int8(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (_rows(q).astype(np.float32) * scale).reshape(q.shape)


def _kept_because(x: np.ndarray, dtype: str) -> str | None:
    """Why a tensor is stored as it is, or None when it is quantised."""
    if not np.issubdtype(x.dtype, np.floating) or x.size == 0:
        return "not floating point"
    if not np.isfinite(x).all():
        return "non-finite values"
    if dtype == "int8" and _rows(x).shape[0] == 1:
        return "a vector: int8 scales are per row"  # biases, norms: kept exact, as int8 runtimes do
    return None


# ---------------------------------------------------------------- dump


def _prepare(out: Path) -> None:
    """An empty directory, or an earlier dump whose files are removed (a bf16 dump after an
    int8 one must not leave stale .scale.npy files behind)."""
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).exists():
        raise OutputError(f"{out}: exists and is not a weights dump (use an empty directory)")
    try:
        if (out / MANIFEST).exists():
            old = json.loads((out / MANIFEST).read_text())
            for t in old.get("tensors", []):
                for rel in (t.get("file"), t.get("scale_file")):
                    if rel:
                        (out / rel).unlink(missing_ok=True)
        out.mkdir(parents=True, exist_ok=True)
    except (OSError, json.JSONDecodeError) as exc:
        raise OutputError(f"{out}: cannot prepare the weights directory ({exc})") from exc


def _write(out: Path, parts: list[str], x: np.ndarray,
           dtype: str | None) -> tuple[str, str | None, np.ndarray, int]:
    """Store one tensor (dtype None: as it is); returns file, scale file, the values read
    back (dequantised), bytes stored."""
    rel = "/".join(parts) + ".npy"
    path = out / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if dtype is None:
        np.save(path, x)
        return rel, None, x, x.nbytes
    if dtype == "bf16":
        bits = to_bf16(x)
        np.save(path, bits)
        return rel, None, from_bf16(bits), bits.nbytes
    q, scale = to_int8(x)
    scale_rel = "/".join(parts) + ".scale.npy"
    np.save(path, q)
    np.save(out / scale_rel, scale)
    return rel, scale_rel, from_int8(q, scale), q.nbytes + scale.nbytes


def _record(graph: str, onnx_name: str, x: np.ndarray, out: Path, dtype: str) -> TensorRecord:
    parts, layer = layout(graph, onnx_name)
    kept = _kept_because(x, dtype)
    rel, scale_rel, back, nbytes = _write(out, parts, x, None if kept else dtype)
    err_sq = ref_sq = max_abs = rel_rms = 0.0
    if not kept:
        ref = x.astype(np.float64)
        diff = back.astype(np.float64) - ref
        err_sq, ref_sq = float(np.sum(diff * diff)), float(np.sum(ref * ref))
        max_abs = float(np.max(np.abs(diff)))
        rel_rms = float(np.sqrt(err_sq / ref_sq)) if ref_sq > 0 else 0.0
    component_parts = parts[1:-1]
    if layer is not None:
        component_parts = component_parts[1:]
    return TensorRecord(
        name="/".join(parts), graph=graph, onnx_name=onnx_name, layer=layer,
        component="/".join(component_parts), shape=list(x.shape),
        dtype=str(x.dtype) if kept else dtype, source_dtype=str(x.dtype), bytes=nbytes,
        source_bytes=x.nbytes, file=rel, scale_file=scale_rel, max_abs_error=max_abs,
        rel_rms_error=rel_rms, kept=kept, err_sq=err_sq, ref_sq=ref_sq,
    )


def _summary(records: list[TensorRecord]) -> dict:
    by_dtype: dict[str, dict] = defaultdict(lambda: {"tensors": 0, "bytes": 0, "source_bytes": 0})
    by_graph: dict[str, dict] = defaultdict(lambda: {"tensors": 0, "bytes": 0, "source_bytes": 0})
    for r in records:
        for bucket in (by_dtype[r.dtype], by_graph[r.graph]):
            bucket["tensors"] += 1
            bucket["bytes"] += r.bytes
            bucket["source_bytes"] += r.source_bytes
    err_sq, ref_sq = sum(r.err_sq for r in records), sum(r.ref_sq for r in records)
    worst_rel = max(records, key=lambda r: r.rel_rms_error)
    worst_abs = max(records, key=lambda r: r.max_abs_error)
    return {
        "tensors": len(records),
        "bytes": sum(r.bytes for r in records),
        "source_bytes": sum(r.source_bytes for r in records),
        "by_dtype": dict(by_dtype),
        "by_graph": dict(by_graph),
        "rel_rms_error": float(np.sqrt(err_sq / ref_sq)) if ref_sq > 0 else 0.0,
        "max_abs_error": worst_abs.max_abs_error,
        "worst_rel_rms": {"name": worst_rel.name, "rel_rms_error": worst_rel.rel_rms_error},
        "worst_max_abs": {"name": worst_abs.name, "max_abs_error": worst_abs.max_abs_error},
    }


def summary_table(manifest: dict) -> str:
    s = manifest["summary"]
    lines = [f"{'dtype':<10}{'tensors':>9}{'bytes':>16}{'fp32 bytes':>16}"]
    for dtype, b in sorted(s["by_dtype"].items()):
        lines.append(f"{dtype:<10}{b['tensors']:>9}{b['bytes']:>16,}{b['source_bytes']:>16,}")
    lines.append(f"{'total':<10}{s['tensors']:>9}{s['bytes']:>16,}{s['source_bytes']:>16,}")
    lines.append(f"round trip ({manifest['dtype']}): relative RMS {s['rel_rms_error']:.2e} overall, "
                 f"worst {s['worst_rel_rms']['rel_rms_error']:.2e} ({s['worst_rel_rms']['name']}); "
                 f"max abs {s['max_abs_error']:.2e} ({s['worst_max_abs']['name']})")
    return "\n".join(lines)


def dump_weights(bundle_dir: Path, dtype: str, out: Path) -> dict:
    """Write every weight of the bundle's fp32 graphs to `out` in `dtype`; returns the manifest."""
    if dtype not in DTYPES:
        raise UsageError(f"weights dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as exc:
        raise ToolMissingError("dumping weights needs the onnx package: pip install onnx") from exc
    bundle = load_bundle(Path(bundle_dir))
    out = Path(out)
    _prepare(out)
    records: list[TensorRecord] = []
    for role in (r for r in GRAPH_ROLES if bundle.has(r)):
        graph = onnx.load(str(bundle.path(role))).graph
        for init in graph.initializer:
            records.append(_record(role, init.name, numpy_helper.to_array(init), out, dtype))
    manifest = {
        "format": FORMAT,
        "bundle": str(bundle.root),
        "model": bundle.name,
        "dtype": dtype,
        "int8_rows": "the first axis that is not 1; one float32 scale per row" if dtype == "int8" else None,
        "summary": _summary(records),
        "tensors": [{k: v for k, v in asdict(r).items() if k not in ("err_sq", "ref_sq")}
                    for r in records],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    print(summary_table(manifest))
    return manifest
