"""`edgeasr models fit-shortlist`: the two-stage projection's first pass fitted on real decodes.

The first pass ranks the text tokens in a rank-64 basis of the final hidden state. The basis
that keeps the exact pick among the candidates most often is fitted on the hidden states the
decoder really has (models/shortlist.fit_basis, from their second moment); the data-free one,
the projection's own singular directions, misses far more winners and the window's
verification then redoes more steps. The hidden states are recorded while the bundle's own
shortlist step greedily decodes labelled speech in every language the bundle is to serve (a
basis fitted on English alone made base's French, Dutch, Spanish and Italian commands roll
back in 266 of 284 windows). The bundle's shortlist files are written again with the new
basis; `--known` also keeps it for these weights in edgeasr/models/shortlist/, so that
`edgeasr models import` of the same weights gets it at once.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgeasr.bundle import MANIFEST, file_entry, load_bundle


def record_moment(bundle_dir: Path, set_dirs: list[Path], threads: int) -> tuple[np.ndarray, int]:
    """The second moment E[h h^T] of the final hidden states of every shortlisted step of a
    greedy transcription of the sets (a `language` column names each row's), and the steps."""
    from edgeasr.audio.files import load_audio
    from edgeasr.config import load_config
    from edgeasr.daemon import engine_for
    from edgeasr.lab.evaluation.scoring import manifest_of, read_manifest

    bundle = load_bundle(bundle_dir)
    cfg = load_config(None, {"encoder.backend": "onnx", "model.path": str(bundle_dir), "decoder.threads": threads,
                             "encoder.threads": threads, "decoder.projection": "shortlist"})
    engine = engine_for(cfg, bundle)
    projection = engine.sessions.decoder.shortlist
    assert projection is not None  # noqa: S101 (decoder.projection: shortlist)
    moment = np.zeros((bundle.d_model, bundle.d_model), np.float64)
    count = 0
    take = projection.row

    def row(scores, tail, q, scale, zp):
        nonlocal moment, count
        h = (q.astype(np.float64) - zp) * scale
        moment += np.outer(h, h)
        count += 1
        return take(scores, tail, q, scale, zp)

    projection.row = row  # type: ignore[method-assign]
    for set_dir in set_dirs:
        for r in read_manifest(set_dir):
            audio = load_audio(manifest_of(set_dir).parent / r["file"], bundle.audio.sample_rate)
            engine.transcribe(audio, language=r.get("language") or None)
    if not count:
        raise ValueError("no shortlisted step: the sets decoded to nothing")
    return moment / count, count


def fit(bundle_dir: Path, set_dirs: list[Path], threads: int, known: bool) -> dict:
    """Fit the basis on the sets, write the bundle's shortlist files again with it; returns the
    manifest's new `shortlist` section."""
    from edgeasr.models import shortlist

    bundle = load_bundle(bundle_dir)
    moment, steps = record_moment(bundle_dir, set_dirs, threads)
    step = bundle.graph("decoder_step", "int8")
    eot = bundle.tokens.eot
    basis = shortlist.fit_basis(shortlist.text_rows(step, list(bundle.suppress_tokens), eot), moment,
                                int(bundle.shortlist["rank"]))
    tail = bundle.shortlist["tail"]
    roles, _ = shortlist.write_shortlist(step, bundle.root, list(bundle.suppress_tokens), tail[0], tail[1], basis)
    manifest = json.loads((bundle.root / MANIFEST).read_text())
    manifest["files"].update({role: file_entry(bundle.root, name) for role, name in roles.items()})
    section = {**manifest["shortlist"], "basis": "fit", "fit_on": [p.name for p in set_dirs], "fit_steps": steps}
    manifest["shortlist"] = section
    (bundle.root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if known:
        shortlist.KNOWN_BASES.mkdir(exist_ok=True)
        np.save(shortlist.KNOWN_BASES / f"{manifest['source']['sha256']}.npy", basis.astype(np.float16))
    return section
