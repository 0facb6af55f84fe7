"""The tail past the window (asr/tail.py, tail.PaddingRows, models/tail_fit.py): a window
whose audio ends inside it is padded with the tail map's rows, predicted from its encoding,
which are nearer the 30 s encoder's output past the window than the silence row on speech the
map never heard; a window cut in running speech and an older bundle keep the silence row."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from edgeasr.asr.decoding import DecoderSession
from edgeasr.asr.encoder import OnnxEncoder
from edgeasr.asr.features import MelSpec, log_mel, silence_level
from edgeasr.asr.tail import TailMap, WindowEnd
from edgeasr.asr.windows import WindowWalker
from edgeasr.audio.files import load_audio
from edgeasr.bundle import TAIL_MAP_ROLE, Bundle, load_bundle
from edgeasr.errors import ModelError, ToolMissingError
from edgeasr.models import tail_fit

# held-out speech: dev clips up to a window, of speakers and sources the map never heard (it
# was fitted on synthesised speech only)
HELD_OUT = ["cmu_goforward", "picovoice_test-en", "ls_test-other_1688-142285-0002", "ls_test-other_1998-15444-0002",
            "ljs_LJ001-0001", "ljs_LJ001-0004", "alsa_front-left"]
LONG = "ls_test-other_1688-142285-0000"  # 14.9 s: a window cut in running speech, then the rest


def relative_error(rows: np.ndarray, bands: np.ndarray) -> float:
    return float(np.linalg.norm(rows - bands) / np.linalg.norm(bands))


def teacher(bundle: Bundle) -> tail_fit.Teacher:
    """The bundle's own encoders as the fit reads them (its 30 s encoder: the tiny bundle's extra)."""
    from edgeasr.asr.encoder import ort_session

    a = bundle.audio
    spec = MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, a.n_frames)
    return tail_fit.Teacher(bundle.path("encoder_int8"), ort_session(bundle.path("encoder_30s"), 2), spec,
                            a.n_positions)


def held_out(bundle: Bundle, dev_dir, dev_manifest) -> list[np.ndarray]:
    rows = {r["id"]: r for r in dev_manifest}
    return [load_audio(dev_dir / rows[clip]["file"], bundle.audio.sample_rate) for clip in HELD_OUT]


def errors(tail: TailMap, samples: list[tail_fit.Sample], bundle: Bundle) -> tuple[float, float]:
    """The median relative error of the map's rows and of the silence row against the teacher's
    band means."""
    silence = DecoderSession(bundle).padding_rows.silence
    rows = tail.predict(np.stack([s.pooled for s in samples]), np.array([s.silence for s in samples]))
    fitted = [relative_error(r, s.bands) for r, s in zip(rows, samples)]
    flat = [relative_error(np.tile(silence.row(s.silence), (len(r), 1)), s.bands) for r, s in zip(rows, samples)]
    return float(np.median(fitted)), float(np.median(flat))


def shipped_map(bundle: Bundle) -> TailMap:
    path = tail_fit.shipped(bundle.manifest["source"]["sha256"], bundle.audio.n_positions)
    assert path is not None, "edgeasr ships a tail map for tiny.en's weights"
    return TailMap.load(path)


@pytest.fixture(scope="module")
def held_out_samples(tiny_bundle, dev_dir, dev_manifest):
    bundle = load_bundle(tiny_bundle)
    t = teacher(bundle)
    return [t.sample(audio[: t.spec.n_frames * t.spec.hop_length], clip)
            for clip, audio in zip(HELD_OUT, held_out(bundle, dev_dir, dev_manifest))]


def test_the_shipped_rows_are_nearer_the_30s_encoders_than_the_silence_row(tiny_bundle, held_out_samples):
    """Against the 30 s encoder's output past the window, band by band, on real speech the map
    never heard: the shipped map's rows err by a fraction of the silence row's."""
    bundle = load_bundle(tiny_bundle)
    fitted, flat = errors(shipped_map(bundle), held_out_samples, bundle)
    print(f"\nmedian relative error past the window: tail map {fitted:.3f}, silence row {flat:.3f}")
    assert flat > 0.4 and fitted < flat / 3


def test_a_map_fitted_on_synthesised_speech_reads_real_speech(tiny_bundle, held_out_samples):
    """The import's fit (fewer windows and components here, for time) on espeak-ng's speech
    alone: nearer the 30 s encoder than the silence row on the real held-out speech."""
    bundle = load_bundle(tiny_bundle)
    t = teacher(bundle)
    samples = []
    for audio, voice in tail_fit.fitting_speech(("espeak",), t.spec.n_frames * t.spec.hop_length):
        samples.append(t.sample(audio, voice))
        if len(samples) == 20:
            break
    tail, quality = tail_fit.fit(samples, t.n_positions, t.edges, rank=4)
    assert quality["windows"] == 20 and quality["voices"] > 5 and quality["penalty"] in tail_fit.PENALTIES
    fitted, flat = errors(tail, held_out_samples, bundle)
    print(f"\n20 windows of espeak-ng: tail map {fitted:.3f}, silence row {flat:.3f} (cv R2 {quality['cv_r2']})")
    assert fitted < flat / 2


def test_the_rows_come_from_the_encoding_through_the_saved_file(tiny_bundle, held_out_samples, tmp_path):
    """TailMap.rows on a window's encoding equals the map read back from its file (float16)."""
    bundle = load_bundle(tiny_bundle)
    m = shipped_map(bundle)
    m.save(tmp_path / "copy.npz", {"speech": "test"})
    again = TailMap.load(tmp_path / "copy.npz")
    encoding = np.random.default_rng(0).standard_normal((m.n_positions, bundle.d_model)).astype(np.float32)
    assert np.allclose(m.rows(encoding, -1.0), again.rows(encoding, -1.0), atol=1e-5)
    assert tail_fit.fitted_info(tmp_path / "copy.npz") == {"speech": "test"}
    assert m.rows(encoding, -1.0).shape == (8, bundle.d_model)
    assert np.allclose(np.exp(m.log_counts), 125)  # 1000 positions past a 10 s window in 8 bands


def with_and_without_tail(tiny_bundle, tmp_path) -> tuple:
    """The session's bundle as an older one (no tail map: its role and section removed) and with
    the shipped map, linked file by file (a bundle checks listed files only)."""
    bundle = load_bundle(tiny_bundle)
    made = []
    for name, tail in (("older", None), ("tailed", tail_fit.shipped(bundle.manifest["source"]["sha256"], 500))):
        root = tmp_path / name
        root.mkdir()
        m = json.loads((tiny_bundle / "manifest.json").read_text())
        m["files"].pop(TAIL_MAP_ROLE, None)
        m.pop("tail_map", None)
        for entry in m["files"].values():
            os.symlink(tiny_bundle / entry["path"], root / entry["path"])
        if tail is not None:
            (root / "tail_map.npz").write_bytes(tail.read_bytes())
            m["files"][TAIL_MAP_ROLE] = {"path": "tail_map.npz", "bytes": tail.stat().st_size, "sha256": ""}
        (root / "manifest.json").write_text(json.dumps(m))
        made.append(root)
    return tuple(made)


def test_an_older_bundle_pads_with_the_silence_row(tiny_bundle, dev_dir, dev_manifest, tmp_path):
    """A bundle without a tail map loads and pads every window with one silence row (score bias
    log(1000)); one with it, a window whose audio ends inside it with the map's 8 rows."""
    older, tailed = (load_bundle(p) for p in with_and_without_tail(tiny_bundle, tmp_path))
    audio = held_out(older, dev_dir, dev_manifest)[0]
    mel = log_mel(audio, MelSpec(16000, 400, 160, 80, 1000))
    features = OnnxEncoder(older).encode(mel)
    end = WindowEnd(silence_level(mel), inside=True)
    old, new = DecoderSession(older), DecoderSession(tailed)
    assert old.padding_rows.tail is None and new.padding_rows.tail is not None
    old.start(features, 1500, end)
    new.start(features, 1500, end)
    assert np.allclose(old.cross_bias[500:], [np.log(1000)])
    assert np.allclose(new.cross_bias[500:], np.log(125)) and len(new.cross_bias) == 508
    new.start(features, 700, end)  # padding to other than the 30 s window: the silence row
    assert np.allclose(new.cross_bias[500:], [np.log(200)])


def test_a_window_cut_in_running_speech_keeps_the_silence_row(tiny_bundle, dev_dir, dev_manifest, tmp_path):
    """Long speech without a VAD: the first window is cut at the model's length in running
    speech (its audio does not end inside it) and keeps the silence row; the last window's audio
    ends inside it and gets the tail map's rows. The walk says so; the decoder pads so."""
    from edgeasr.asr.transcriber import build_engine
    from edgeasr.config import load_config

    _, tailed = with_and_without_tail(tiny_bundle, tmp_path)
    bundle = load_bundle(tailed)
    row = next(r for r in dev_manifest if r["id"] == LONG)
    audio = load_audio(dev_dir / row["file"], bundle.audio.sample_rate)
    walker = WindowWalker(MelSpec(16000, 400, 160, 80, 1000))
    assert not walker.window(audio, 0, final=True).ends_inside
    assert walker.window(audio, 16000 * 8, final=True).ends_inside
    cfg = load_config(None, {"encoder.backend": "onnx"})
    engine = build_engine(bundle, cfg.model, cfg.encoder, cfg.decoder)  # no VAD: no pause looked for
    decoder, padded = engine.sessions.decoder, []
    start = decoder.start

    def recording(features, padding, end=None):
        start(features, padding, end)
        padded.append((end.inside if end is not None else None, len(decoder.cross_bias)))

    decoder.start = recording
    result = engine.transcribe(audio)
    assert result.windows == 2 and "blood" in result.text.lower()
    firsts = [p for p in padded if p[0] is False]
    lasts = [p for p in padded if p[0] is True]
    assert firsts and all(n == 501 for _, n in firsts)
    assert lasts and all(n == 508 for _, n in lasts)


def test_a_5s_window_cut_in_running_speech_takes_the_map_too(tiny_bundle, dev_dir, dev_manifest, tmp_path):
    """In a bundle of 5 s windows (base on the Hailo-8) most windows are cut in running speech,
    and there the map pads them too (tail.CUT_WINDOWS_MAX_S); the same window of a 10 s bundle
    keeps the silence row."""
    older, tailed = with_and_without_tail(tiny_bundle, tmp_path)
    ten = load_bundle(tailed)
    m = shipped_map(ten)
    short = TailMap(250, tail_fit.band_edges(1250, 8), m.last, m.feature_mean, m.feature_basis, m.coef)
    (tailed / "tail_map.npz").unlink()
    short.save(tailed / "tail_map.npz")
    manifest = json.loads((tailed / "manifest.json").read_text())
    manifest["files"][TAIL_MAP_ROLE]["bytes"] = (tailed / "tail_map.npz").stat().st_size
    manifest["audio"].update(window_s=5.0, n_frames=500, n_positions=250)
    (tailed / "manifest.json").write_text(json.dumps(manifest))
    audio = held_out(ten, dev_dir, dev_manifest)[0]
    mel = log_mel(audio, MelSpec(16000, 400, 160, 80, 1000))
    features = OnnxEncoder(load_bundle(older)).encode(mel)
    cut = WindowEnd(silence_level(mel), inside=False)
    five = DecoderSession(load_bundle(tailed))
    five.start(np.ascontiguousarray(features[:, :250]), 1500, cut)
    assert len(five.cross_bias) == 258 and np.allclose(five.cross_bias[250:], short.log_counts)
    (tmp_path / "ten").mkdir()
    plain = DecoderSession(load_bundle(with_and_without_tail(tiny_bundle, tmp_path / "ten")[1]))
    plain.start(features, 1500, cut)
    assert len(plain.cross_bias) == 501


def test_a_tail_map_for_another_window_is_refused_in_one_line(tiny_bundle, tmp_path):
    _, tailed = with_and_without_tail(tiny_bundle, tmp_path)
    m = shipped_map(load_bundle(tailed))
    other = TailMap(250, tail_fit.band_edges(1250, 8), m.last, m.feature_mean, m.feature_basis, m.coef)
    (tailed / "tail_map.npz").unlink()
    other.save(tailed / "tail_map.npz")
    manifest = json.loads((tailed / "manifest.json").read_text())
    manifest["files"][TAIL_MAP_ROLE]["bytes"] = (tailed / "tail_map.npz").stat().st_size
    (tailed / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match=r"tail_map.npz: a tail map for 250 positions of 384, the bundle's "
                                         r"window has 500 of 384 \(re-create it"):
        DecoderSession(load_bundle(tailed))


def test_the_import_takes_the_shipped_map_for_known_weights(tiny_default_bundle):
    """The embedded default's weights are known: the import copies edgeasr's map, which needs
    neither a voice nor the 30 s encoder's minutes, and the manifest says what it is."""
    m = json.loads((tiny_default_bundle / "manifest.json").read_text())
    section = m["tail_map"]
    assert section["format"] == "edgeasr-tailmap/1" and section["source"] == "shipped with edgeasr for these weights"
    assert (section["bands"], section["rank"], section["n_positions"], section["n_tail"]) == (8, 32, 500, 1000)
    assert section["fitted"]["windows"] == tail_fit.FIT_WINDOWS and "espeak-ng" in section["fitted"]["speech"]
    shipped = tail_fit.shipped(m["source"]["sha256"], 500)
    assert shipped is not None and (tiny_default_bundle / "tail_map.npz").read_bytes() == shipped.read_bytes()


def test_without_a_voice_unknown_weights_get_no_tail_map(tmp_path, monkeypatch, caplog):
    """Weights edgeasr has no map for, on a machine without espeak-ng or piper: auto imports
    without a tail map (the silence row) and says so; --tail fit refuses in one line."""
    monkeypatch.setattr(tail_fit, "installed", lambda: ())

    def no_teacher():
        raise AssertionError("nothing is fitted without a voice")

    with caplog.at_level(logging.WARNING):
        assert tail_fit.write_tail_map(tmp_path, "0" * 64, 500, "auto", no_teacher) is None
    assert "no voice is installed" in caplog.text and not (tmp_path / "tail_map.npz").exists()
    with pytest.raises(ToolMissingError, match="--tail fit: no voice to say the fitting speech with"):
        tail_fit.write_tail_map(tmp_path, "0" * 64, 500, "fit", no_teacher)
    assert tail_fit.write_tail_map(tmp_path, "0" * 64, 500, "none", no_teacher) is None


def test_every_shipped_map_loads_for_the_window_its_name_says():
    """tiny.en's and base's 10 s windows, and base's 5 s one (the Hailo-8's HEF): each file is
    a tail map for the positions its name says, fitted as the import fits."""
    names = sorted(p.name for p in tail_fit.SHIPPED.glob("*.npz"))
    assert len(names) == 3
    for name in names:
        sha, positions = name.removesuffix(".npz").split("-")
        m = TailMap.load(tail_fit.SHIPPED / name)
        assert len(sha) == 64 and m.n_positions == int(positions) and m.n_positions + m.n_tail == 1500
        assert tail_fit.fitted_info(tail_fit.SHIPPED / name)["windows"] == tail_fit.FIT_WINDOWS
        rows = m.rows(np.zeros((m.n_positions, m.coef.shape[2]), np.float32), -1.5)
        assert rows.shape == (8, m.coef.shape[2]) and np.isfinite(rows).all()
