"""The engine as the daemon builds it, in the test's process."""

from __future__ import annotations

from pathlib import Path


def make_engine(bundle_dir: Path, sentences=None, **keys):
    """The engine as the daemon builds it, from default config sections plus dotted `keys`
    (e.g. make_engine(b, **{"decoder.preset": "conservative"})); the CPU encoder. `sentences`:
    the home's sentences it reads commands with (home.sentences.sentences_for)."""
    from edgeasr.asr.transcriber import build_engine
    from edgeasr.audio.vad import SpeechJudge
    from edgeasr.bundle import load_bundle
    from edgeasr.config import load_config

    cfg = load_config(None, {"encoder.backend": "onnx", **keys})
    return build_engine(load_bundle(bundle_dir), cfg.model, cfg.encoder, cfg.decoder, SpeechJudge(cfg.vad),
                        words=cfg.output.words, sentences=sentences)
