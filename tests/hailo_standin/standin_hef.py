"""Write a stand-in HEF for a model bundle: what `edgeasr models compile-hef` would produce,
in the form the hailo_platform stand-in (beside this file) understands.

A stand-in HEF is HEF_MAGIC + JSON naming the chip it was "compiled" for, the bundle's
Hailo-ready encoder ONNX it runs (relative path) and its vstreams as HailoRT reports them:
shapes without batch, NHWC frames as (H, W, C):
  input   <net>/input_layer1   (1, n_frames, n_mels)   <- ONNX mel [1, 1, n_frames, n_mels]
  output  <net>/<OUTPUT_LAYER> (1, n_positions, d_model) <- ONNX audio_features [1, T, d]
(an encoder's rank-3 [1, T, d] output is a height-1 NHWC frame to the DFC; the InferVStreams
API then returns it with a batch axis, [1, 1, T, d]).

A HEF written outside the bundle names its ONNX by absolute path, so it can be copied into
another bundle (as `models import --hef` does); `onnx` makes a HEF "compiled" from another
model's encoder (a HEF paired with the wrong weights).
"""

from __future__ import annotations

import json
from pathlib import Path

from hailo_platform.pyhailort._pyhailort import HEF_FORMAT, HEF_MAGIC

NET_NAME = "edgeasr_encoder"  # as compile_hef names the network
OUTPUT_LAYER = "layer_normalization5"  # the DFC names outputs after their last layer


def write_standin_hef(
    bundle_dir: Path,
    out: Path | None = None,
    arch: str = "hailo8",
    input_hwc: tuple[int, int, int] | None = None,
    record: bool = True,
    net_name: str = NET_NAME,
    onnx: Path | None = None,
    output_shape: tuple[int, ...] | None = None,
) -> Path:
    """Write <bundle>/encoder.<arch>.hef (or `out`); record it in the manifest like compile-hef."""
    from edgeasr.bundle import load_bundle
    from edgeasr.models.hef_import import record_hef

    bundle = load_bundle(Path(bundle_dir))
    out = Path(out) if out else bundle.root / f"encoder.{arch}.hef"
    mel = bundle.manifest["tensors"]["encoder"]["inputs"]["mel"]
    feats = bundle.manifest["tensors"]["encoder"]["outputs"]["audio_features"]
    onnx = Path(onnx or bundle.path("encoder")).resolve()
    inside = bundle.root.resolve() in out.resolve().parents
    meta = {
        "format": HEF_FORMAT,
        "arch": arch,
        "network_group": net_name,
        "onnx": _relpath(onnx, out.resolve().parent) if inside else str(onnx),
        "inputs": [
            {"name": f"{net_name}/input_layer1", "shape": list(input_hwc or mel[1:]), "onnx_name": "mel"}
        ],
        "outputs": [
            {"name": f"{net_name}/{OUTPUT_LAYER}", "shape": list(output_shape or (1, *feats[1:])),
             "onnx_name": "audio_features"}
        ],
    }
    out.write_bytes(HEF_MAGIC + json.dumps(meta, indent=1).encode())
    if record:
        vstreams = {
            "input": meta["inputs"][0]["name"],
            "output": meta["outputs"][0]["name"],
            "input_shape": meta["inputs"][0]["shape"],
            "output_shape": meta["outputs"][0]["shape"],
        }
        record_hef(bundle.root, out, arch, vstreams, {"net_name": net_name, "dfc": "stand-in"})
    return out


def _relpath(target: Path, start: Path) -> str:
    import os

    return os.path.relpath(target, start)
