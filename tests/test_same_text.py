"""The same audio gives the same text in every round and every mode (issue 24): `edgeasr
transcribe`, the daemon on a file as fast as it reads and at real time, and a Wyoming request
sent at once and at real time. A round-to-round difference came from whether a speculative
decode was ready in time; now every mode reads the same audio (speech_end.decode_until)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf
from test_wyoming import start_server, stop_server, transcribe

REPO = Path(__file__).resolve().parents[1]
# one utterance each, with little silence around it: every mode reads all of it
CLIPS = ("ls_test-other_1998-15444-0008", "ljs_LJ001-0013")

pytestmark = pytest.mark.slow


def transcribe_command(bundle: Path, wav: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "edgeasr", "--log-level", "WARNING", "transcribe", "--model",
                          str(bundle), str(wav)], capture_output=True, text=True, check=True, cwd=REPO)
    return out.stdout.strip()


def daemon(bundle: Path, wav: Path, realtime: bool, tmp: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "edgeasr", "--log-level", "WARNING", "--input", str(wav),
                          "--set", f"model.path={bundle}", "--set", f"input.realtime={str(realtime).lower()}",
                          "--set", "encoder.backend=onnx", "--set", f"state_dir={tmp}"],
                         capture_output=True, text=True, check=True, cwd=REPO)
    return " ".join(json.loads(line)["text"] for line in out.stdout.splitlines() if line.strip())


def test_every_mode_and_every_round_gives_the_same_text(tiny_default_bundle, dev_dir, tmp_path):
    (tmp_path / "wyoming").mkdir()
    server = start_server(tmp_path / "wyoming", tiny_default_bundle)
    try:
        for name in CLIPS:
            wav = dev_dir / "audio" / f"{name}.wav"
            pcm, _ = sf.read(wav, dtype="int16")
            texts = {"transcribe": transcribe_command(tiny_default_bundle, wav)}
            for round_ in (1, 2):
                texts[f"daemon, as fast as read, round {round_}"] = daemon(tiny_default_bundle, wav, False, tmp_path)
                texts[f"daemon, real time, round {round_}"] = daemon(tiny_default_bundle, wav, True, tmp_path)
                for mode, realtime in (("at once", False), ("real time", True)):
                    reply = asyncio.run(transcribe(server.uri, pcm, realtime=realtime))
                    assert reply.error is None, (name, mode, reply.error)
                    texts[f"wyoming, {mode}, round {round_}"] = reply.text
            assert texts["transcribe"], name
            assert len(set(texts.values())) == 1, (name, texts)
    finally:
        stop_server(server)
