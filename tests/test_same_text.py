"""The same audio gives the same text in every round and every mode: `edgeasr
transcribe`, the daemon on a file as fast as it reads and at real time, and a Wyoming request
sent at once and at real time. A round-to-round difference came from whether a speculative
decode was ready in time; now every mode reads the same audio (continuation.decode_until).

The daemons and the Wyoming requests of every round run side by side: how busy the machine
is changes when a speculation is ready, which is what must not change the text."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import soundfile as sf
from helpers.wyoming import transcribe

REPO = Path(__file__).resolve().parents[1]
# one utterance each, with little silence around it: every mode reads all of it
CLIPS = ("ls_test-other_1998-15444-0008", "ljs_LJ001-0013")
ROUNDS = (1, 2)
DAEMONS_AT_ONCE = 4



def transcribe_command(bundle: Path, wavs: list[Path]) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "edgeasr", "--log-level", "WARNING", "transcribe", "--model",
                          str(bundle), "--json", *map(str, wavs)], capture_output=True, text=True, check=True,
                         cwd=REPO)
    return [json.loads(line)["text"] for line in out.stdout.splitlines()]


def daemon(bundle: Path, wav: Path, realtime: bool, state: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "edgeasr", "--log-level", "WARNING", "--input", str(wav),
                          "--set", f"model.path={bundle}", "--set", f"input.realtime={str(realtime).lower()}",
                          "--set", "encoder.backend=onnx", "--set", f"state_dir={state}"],
                         capture_output=True, text=True, check=True, cwd=REPO)
    return " ".join(json.loads(line)["text"] for line in out.stdout.splitlines() if line.strip())


async def requests(uri: str, pcm: dict) -> dict[tuple, str]:
    """Every clip at once and at real time, a round after the other (the server holds four
    sessions at a time, wyoming.max_sessions)."""
    texts = {}
    for round_ in ROUNDS:
        runs = [(name, realtime) for name in CLIPS for realtime in (False, True)]
        replies = await asyncio.gather(*(transcribe(uri, pcm[name], realtime=realtime) for name, realtime in runs))
        for (name, realtime), reply in zip(runs, replies):
            assert reply.error is None, (name, realtime, reply.error)
            texts[name, f"wyoming, {'real time' if realtime else 'at once'}, round {round_}"] = reply.text
    return texts


def test_every_mode_and_every_round_gives_the_same_text(tiny_default_bundle, wyoming_daemon, dev_dir, tmp_path):
    wavs = {name: dev_dir / "audio" / f"{name}.wav" for name in CLIPS}
    pcm = {name: sf.read(wav, dtype="int16")[0] for name, wav in wavs.items()}
    runs = [(name, realtime, round_) for name in CLIPS for realtime in (False, True) for round_ in ROUNDS]
    with ThreadPoolExecutor(DAEMONS_AT_ONCE) as pool:
        daemons = {run: pool.submit(daemon, tiny_default_bundle, wavs[run[0]], run[1], tmp_path / f"state-{i}")
                   for i, run in enumerate(runs)}
        command = pool.submit(transcribe_command, tiny_default_bundle, list(wavs.values()))
        texts = asyncio.run(requests(wyoming_daemon.uri, pcm))
        for (name, realtime, round_), done in daemons.items():
            texts[name, f"daemon, {'real time' if realtime else 'as fast as read'}, round {round_}"] = done.result()
        for name, text in zip(CLIPS, command.result()):
            texts[name, "transcribe"] = text
    for name in CLIPS:
        modes = {mode: text for (clip, mode), text in texts.items() if clip == name}
        assert len(modes) == 1 + 4 * len(ROUNDS) and modes["transcribe"], (name, modes)
        assert len(set(modes.values())) == 1, (name, modes)
