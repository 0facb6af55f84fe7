"""The beam (asr/beam.py, graph decoder_step_batch) against CTranslate2's beam search.

CTranslate2's generate(beam_size=k, patience=1, length_penalty=1) is what faster-whisper
runs; we give both the same encoder output and prompt (no timestamps) and the same two logit
rules (the suppressed tokens, and blank and end-of-text at the start), and ask for the same
hypothesis. Its score is the sum of the log-probabilities (end-of-text's included) over the
length: ours agrees to float32 rounding (sums of ~50 log-probabilities of magnitude ~1,
each good to ~1e-6 of the logits' scale of ~10: we allow 1e-3).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgeasr.asr.beam import BeamDecoder, best_candidates
from edgeasr.asr.decoding import DecoderSession, preset_options
from edgeasr.asr.encoder import OnnxEncoder
from edgeasr.asr.greedy import decode_window
from edgeasr.asr.logits import LogitRules, SuppressBlank, SuppressTokens
from edgeasr.asr.tokenizer import Tokenizer
from edgeasr.audio.files import load_audio
from edgeasr.bundle import load_bundle
from edgeasr.errors import ConfigError, ModelError

SCORE_TOLERANCE = 1e-3
MAX_NEW = 60


def beam_search(bundle, session: DecoderSession, beam: BeamDecoder, features, prompt: list[int]):
    tok = bundle.tokens
    session.start(features, padding=0)
    rules = LogitRules([SuppressTokens(bundle.suppress_tokens), SuppressBlank(tok.blank, tok.eot)])
    return beam.search(session.step(prompt), rules, MAX_NEW)


@pytest.mark.parametrize("size", [2, 3, 5])
def test_beam_matches_ctranslate2_tiny(tiny_bundle, tiny_ct2, dev_dir, size):
    from helpers.ct2_reference import CLIPS, mel_of, prompt_of

    bundle = load_bundle(tiny_bundle)
    encoder, session = OnnxEncoder(bundle, "fp32"), DecoderSession(bundle, "fp32", 2)
    beam = BeamDecoder(bundle, session, size, "fp32", 2)
    for clip in CLIPS:
        features = encoder.encode(mel_of(dev_dir, clip, bundle))
        expected, score = tiny_ct2.beam(features, prompt_of(bundle), size, MAX_NEW, list(bundle.suppress_tokens))
        best, steps = beam_search(bundle, session, beam, features, prompt_of(bundle))
        assert best.tokens == expected, clip
        assert abs(best.normalised() - score) <= SCORE_TOLERANCE, clip
        assert steps >= len(best.tokens)


def test_beam_matches_ctranslate2_base(base_bundle, base_ct2, dev_dir):
    from helpers.ct2_reference import CLIPS, mel_of, prompt_of

    bundle = load_bundle(base_bundle)
    encoder, session = OnnxEncoder(bundle, "fp32"), DecoderSession(bundle, "fp32", 2)
    beam = BeamDecoder(bundle, session, 3, "fp32", 2)
    for clip in CLIPS[:3]:
        features = encoder.encode(mel_of(dev_dir, clip, bundle))
        expected, score = base_ct2.beam(features, prompt_of(bundle), 3, MAX_NEW, list(bundle.suppress_tokens))
        best, _ = beam_search(bundle, session, beam, features, prompt_of(bundle))
        assert best.tokens == expected, clip
        assert abs(best.normalised() - score) <= SCORE_TOLERANCE, clip


def test_the_engine_decodes_with_a_beam(tiny_bundle, dev_dir, dev_manifest):
    """decoder.beam_size through the engine: the timestamp rules and the rest of the preset's
    per hypothesis, the windows' text as good as greedy's."""
    from helpers.engines import make_engine
    from helpers.text import wer

    greedy, beam = make_engine(tiny_bundle), make_engine(tiny_bundle, **{"decoder.beam_size": 3})
    strategy = beam.window_decoder.strategy
    assert isinstance(strategy, BeamDecoder) and strategy.size == 3
    for row in dev_manifest[:6]:
        audio = load_audio(dev_dir / row["file"], 16000)
        ours, theirs = beam.transcribe(audio), greedy.transcribe(audio)
        assert ours.segments and all(s.end > s.start for s in ours.segments)
        assert wer(row["reference"], ours.text) <= wer(row["reference"], theirs.text) + 0.1, row["id"]
        assert ours.decoder_steps >= ours.tokens


def test_the_beam_follows_the_prompt_and_samples_above_temperature_0(tiny_bundle, dev_dir):
    """The transcriber's decode hook with decode_window's arguments: earlier text as prompt
    (the hypotheses start after it), and at a temperature above 0 the fallback's sampling, the
    same draw as decode_window's from the same generator."""
    from helpers.ct2_reference import CLIPS, mel_of

    bundle = load_bundle(tiny_bundle)
    encoder, session = OnnxEncoder(bundle, "int8"), DecoderSession(bundle, "int8", 2)
    beam = BeamDecoder(bundle, session, 3, "int8", 2)
    features = encoder.encode(mel_of(dev_dir, CLIPS[1], bundle))
    options = preset_options("balanced")
    prompt = Tokenizer(bundle).encode(" The printing press.")
    result = beam(session, features, options, 9.0, prompt=prompt)
    assert result.tokens and beam.batch.prompt + beam.batch.length == len(prompt) + 1 + result.timings_ms["steps"]
    warm = replace(options, temperature=0.8)
    sampled = beam(session, features, warm, 9.0, rng=np.random.default_rng(3))
    assert sampled.tokens == decode_window(session, features, warm, 9.0, rng=np.random.default_rng(3)).tokens
    assert sampled.timings_ms["steps"] == len(sampled.tokens) + 1  # greedy's count: no batched step ran


def test_best_candidates_are_the_best_continuations():
    """Against a plain sort of every continuation, on rows as the rules leave them (suppressed
    tokens at -inf, a row with one token left)."""
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((3, 5000)) * 4).astype(np.float32)
    logits[:, :100] = -np.inf
    logits[2, :] = -np.inf
    logits[2, 4321] = 1.0
    scores = np.array([-1.0, -3.5, -0.5])
    got = best_candidates(logits, scores, 8, np.zeros_like(logits))
    logsoftmax = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    total = (logsoftmax + scores[:, None]).ravel()
    best = np.argsort(-total, kind="stable")[:8]
    assert [(c.row, c.token) for c in got] == [divmod(int(i), 5000) for i in best]
    assert got[0].row == 2 and got[0].token == 4321 and got[0].logprob == 0.0
    np.testing.assert_allclose([c.total for c in got], total[best], rtol=1e-6)


def test_beam_sizes_and_bundles_are_checked(tiny_default_bundle):
    from helpers.engines import make_engine

    from edgeasr.config import load_config

    with pytest.raises(ConfigError, match=r"decoder.beam_size: 6 is not allowed \(1..5\)"):
        load_config(None, {"decoder.beam_size": 6})
    with pytest.raises(ModelError, match="no decoder_step_batch_int8 file .*--with beam"):
        make_engine(tiny_default_bundle, **{"decoder.beam_size": 2})


def int8_with_beam(default: Path, full: Path, out: Path) -> Path:
    """The default bundle plus the int8 graphs `--with beam` adds, taken from the bundle with
    every extra (the same files an import writes): a bundle of int8 graphs only, with `beam`."""
    from edgeasr.bundle import EXTRA_ROLES, MANIFEST

    manifest = json.loads((default / MANIFEST).read_text())
    full_files = json.loads((full / MANIFEST).read_text())["files"]
    beam = {role: full_files[role] for role, extra in EXTRA_ROLES.items() if extra == "beam" and role.endswith("_int8")}
    out.mkdir()
    for source, files in ((default, manifest["files"]), (full, beam)):
        for entry in files.values():
            (out / entry["path"]).symlink_to((source / entry["path"]).resolve())
    manifest["files"].update(beam)
    manifest["extras"] = ["beam"]
    (out / MANIFEST).write_text(json.dumps(manifest))
    return out


def test_an_int8_only_bundle_gets_its_optional_graphs(tiny_default_bundle, tiny_bundle, tmp_path):
    """The default bundle holds int8 graphs only (`ROLE_int8`): the grammar's batched search and
    the word judge of decoder.drop_unspoken_words must find them there (they did not before
    0.7.1, and ran unbatched and not at all)."""
    from helpers.engines import make_engine

    from edgeasr.bundle import ALIGN_ROLE, BATCH_STEP_ROLE

    plain = make_engine(tiny_default_bundle)
    assert plain.options.judge_words and plain.sessions.batch() is None  # imported without `beam`
    assert not load_bundle(tiny_default_bundle).has(ALIGN_ROLE)  # the fp32 role: not there
    with_beam = int8_with_beam(tiny_default_bundle, tiny_bundle, tmp_path / "tiny.en-beam")
    assert not load_bundle(with_beam, verify_checksums=True).has(ALIGN_ROLE)
    assert load_bundle(with_beam).has_graph(BATCH_STEP_ROLE, "int8")
    assert make_engine(with_beam).sessions.batch() is not None
    assert not make_engine(with_beam, **{"decoder.drop_unspoken_words": False}).options.judge_words
