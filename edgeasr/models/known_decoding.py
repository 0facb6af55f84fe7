"""The decoding settings calibrated per weights file, and their place in a bundle's manifest.

`known.json` keeps each calibration (`edgeasr models calibrate`) by the sha256 of the weights
it was measured on, so that `edgeasr models import` gives a new bundle of those weights its
settings at once. The runtime reads them from the manifest's `decoding` section.
"""

from __future__ import annotations

import json
from pathlib import Path

from edgeasr.bundle import MANIFEST

KNOWN = Path(__file__).with_name("known.json")


def write_decoding(root: Path, decoding: dict) -> dict:
    """Store a `decoding` section in the bundle's manifest; returns the manifest."""
    path = Path(root) / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["decoding"] = decoding
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def known_decoding(weights_sha256: str) -> dict | None:
    """The calibration recorded for these weights (edgeasr/models/known.json), if any."""
    return json.loads(KNOWN.read_text()).get(weights_sha256)


def apply_known(root: Path, manifest: dict) -> dict:
    """Give a freshly imported bundle the calibration recorded for its weights."""
    decoding = known_decoding(manifest.get("source", {}).get("sha256", ""))
    return write_decoding(root, decoding) if decoding is not None else manifest
