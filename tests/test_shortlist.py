"""The two-stage vocabulary projection (decoder.projection: shortlist) on real speech: the full
projection's logits to the bit, its greedy texts, the steps the shortlist got wrong redone."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.engines import make_engine

from edgeasr.asr.decoding import DecoderSession, logsumexp
from edgeasr.asr.encoder import OnnxEncoder
from edgeasr.asr.features import MelSpec, log_mel, silence_level
from edgeasr.asr.tail import WindowEnd
from edgeasr.audio.files import load_audio
from edgeasr.bundle import load_bundle, shortlist_text_ids
from edgeasr.config import load_config
from edgeasr.errors import ConfigError, ModelError

CLIPS = ["jfk_inaugural-1961", "ls_test-other_1688-142285-0002", "cmu_goforward", "picovoice_test-en"]
SET_UTTERANCES = 16  # of the dev set, besides CLIPS
LOGPROB_TOLERANCE = 1e-4  # nats: the verification sums the text's exp in another order than numpy


def _audio(dev_dir, dev_manifest, clip, bundle):
    row = next(r for r in dev_manifest if r["id"] == clip)
    return load_audio(dev_dir / row["file"], bundle.audio.sample_rate)


def test_import_writes_the_extra_with_the_basis_fitted_for_known_weights(tiny_bundle):
    m = json.loads((tiny_bundle / "manifest.json").read_text())
    bundle = load_bundle(tiny_bundle)
    assert "shortlist" in m["extras"]
    assert {"decoder_step_shortlist_int8", "projection_rows", "decoder_verify_int8"} <= set(m["files"])
    section = bundle.shortlist
    assert section["basis"] == "fit" and section["rank"] == 64 and section["candidates"] == 512
    assert section["tail"] == [bundle.tokens.eot, bundle.tokens.timestamp_begin + bundle.audio.n_positions + 1]


def test_the_shortlist_step_gives_the_full_projections_logits_to_the_bit(tiny_bundle, dev_dir, dev_manifest):
    bundle = load_bundle(tiny_bundle)
    audio = _audio(dev_dir, dev_manifest, CLIPS[0], bundle)
    a = bundle.audio
    mel = log_mel(audio[: a.n_samples], MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, a.n_frames))
    features = OnnxEncoder(bundle, "int8", 2).encode(mel)
    full, short = DecoderSession(bundle), DecoderSession(bundle, projection="shortlist")
    for session in (full, short):
        session.start(features, 1500, WindowEnd(silence_level(mel)))
    logits = full.step([bundle.tokens.sot]).copy()
    np.testing.assert_array_equal(short.step([bundle.tokens.sot]), logits)  # its text, tail and other tokens
    text_ids = shortlist_text_ids(bundle.suppress_tokens, bundle.tokens.eot)
    for _ in range(12):  # greedy on the full row; the shortlist's ids must hold the same values
        token = int(text_ids[np.argmax(logits[text_ids])])
        logits = full.step([token]).copy()
        row = short.step_short([token])
        np.testing.assert_array_equal(row.logits, logits[row.ids])
        assert row.n_text >= 256 and np.all(row.ids[: row.n_text] < bundle.tokens.eot)
        verified = short.shortlist.verify([row])  # type: ignore[union-attr]
        best = int(text_ids[np.argmax(logits[text_ids])])
        assert verified.top_ids[0, 0] == best and verified.top_logits[0, 0] == logits[best]
        assert abs(float(verified.lse_text[0]) - logsumexp(logits[text_ids])) < LOGPROB_TOLERANCE


def _compare(full, short, audio, **kw):
    a, b = full.transcribe(audio, **kw), short.transcribe(audio, **kw)
    assert b.text == a.text
    assert [(s.start, s.end, s.text) for s in b.segments] == [(s.start, s.end, s.text) for s in a.segments]
    for x, y in zip(a.segments, b.segments):
        assert abs(x.avg_logprob - y.avg_logprob) < LOGPROB_TOLERANCE
        assert x.no_speech_prob == y.no_speech_prob  # the prompt's row is the full projection's
    return b


def test_greedy_texts_are_the_full_projections(tiny_bundle, dev_dir, dev_manifest):
    full, short = make_engine(tiny_bundle), make_engine(tiny_bundle, **{"decoder.projection": "shortlist"})
    bundle = load_bundle(tiny_bundle)
    clips = CLIPS + [r["id"] for r in dev_manifest[:SET_UTTERANCES]]
    for clip in clips:
        _compare(full, short, _audio(dev_dir, dev_manifest, clip, bundle))
    counts = short.sessions.decoder.shortlist.counts
    assert counts.windows >= len(clips) and counts.steps > 300
    assert counts.rollbacks <= counts.windows  # the fitted basis: the winner is nearly always a candidate


def test_a_step_the_shortlist_got_wrong_is_redone_from_its_full_row(tiny_bundle, dev_dir, dev_manifest):
    """With 8 candidates the first pass often leaves the winner out: the window's verification
    finds each such step, takes it from the full row and decodes on from there."""
    full, short = make_engine(tiny_bundle), make_engine(tiny_bundle, **{"decoder.projection": "shortlist"})
    projection = short.sessions.decoder.shortlist
    projection.candidates = 8
    bundle = load_bundle(tiny_bundle)
    for clip in CLIPS[:2]:
        _compare(full, short, _audio(dev_dir, dev_manifest, clip, bundle))
    assert projection.counts.rollbacks >= 3 and projection.counts.redone > 0


def test_a_window_with_a_bias_is_decoded_on_the_whole_vocabulary(tiny_bundle, dev_dir, dev_manifest):
    keys = {"decoder.repetition_penalty": 1.3}
    full, short = make_engine(tiny_bundle, **keys), make_engine(tiny_bundle, **keys, **{"decoder.projection": "shortlist"})
    _compare(full, short, _audio(dev_dir, dev_manifest, CLIPS[2], load_bundle(tiny_bundle)))
    assert short.sessions.decoder.shortlist.counts.steps == 0


def test_a_bundle_without_the_extra_says_how_to_import_it(tiny_default_bundle):
    with pytest.raises(ModelError, match="--with shortlist"):
        DecoderSession(load_bundle(tiny_default_bundle), projection="shortlist")


def test_a_projection_that_cannot_run_is_refused_naming_its_key(tiny_bundle):
    with pytest.raises(ConfigError, match=r"^decoder\.projection: 'half' is not allowed \(full, shortlist\)$"):
        load_config(None, {"decoder.projection": "half"})
    with pytest.raises(ConfigError, match=r"^decoder\.projection: shortlist needs decoder\.precision int8$"):
        DecoderSession(load_bundle(tiny_bundle), precision="fp32", projection="shortlist")


def test_a_token_reads_less_than_half_the_bytes(tiny_bundle):
    """The step's layers, the first pass, the tail block, the candidates' rows and the window's
    verification spread over its tokens, against the layers and the whole projection."""
    from edgeasr.lab.evaluation.token_bytes import token_bytes

    bundle = load_bundle(tiny_bundle)
    full, short = (token_bytes(bundle, "int8", p, steps_per_window=22) for p in ("full", "shortlist"))
    assert 27 < full.weights_mb < 30 and short.weights_mb < 14
    assert short.cross_kv_mb == full.cross_kv_mb and short.self_kv_mb == full.self_kv_mb


def test_bench_decoder_measures_it_against_greedy_beside_a_load(tiny_bundle, dev_dir, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "variants.json"
    proc = subprocess.run([sys.executable, "-m", "edgeasr", "bench-decoder", "--dataset", str(dev_dir), "--model",
                           str(tiny_bundle), "--beams", "", "--shortlist", "--limit", "3", "--load", "stream1",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    row = report["rows"]["greedy+shortlist"]
    assert report["load"] == "stream1" and row["texts_unlike_greedy"] == 0 and row["decoder_ms_per_token"] > 0
    assert report["shortlist"]["steps"] > 0 and "two-stage projection:" in proc.stdout
