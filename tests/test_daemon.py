"""The daemon end to end, in subprocesses, against a real Mosquitto on loopback."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import jiwer
import numpy as np
import pytest
import soundfile as sf
import yaml
from conftest import make_engine, normalize
from test_payload import PARTIAL, validator

REPO = Path(__file__).resolve().parents[1]
STREAM_TIMEOUT_S = 240
REALTIME_UTTERANCES = 4  # of dev_stream_01: two of them while the broker is down, one after


def write_config(path: Path, settings: dict) -> Path:
    tree: dict = {}
    for key, value in settings.items():
        node = tree
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = str(value) if isinstance(value, Path) else value
    path.write_text(yaml.safe_dump(tree))
    return path


def start_daemon(config: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "edgeasr", "--config", str(config)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def finish(proc: subprocess.Popen, timeout_s: float = STREAM_TIMEOUT_S) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"daemon did not finish; stderr:\n{err[-3000:]}") from None
    assert proc.returncode == 0, err[-3000:]
    return out, err


class Running:
    """The daemon in a subprocess with `output.stdout` on: its transcript lines are read as
    they come, so that a test waits for what it needs instead of for a time."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[dict] = []
        self.err: list[str] = []
        self._cond = threading.Condition()
        self._ended = False  # stdout closed
        self._readers = [threading.Thread(target=self._read_out, daemon=True)]
        if proc.stderr is not None:  # else a file the test reads
            self._readers.append(threading.Thread(target=lambda: self.err.extend(proc.stderr), daemon=True))
        for t in self._readers:
            t.start()

    def _read_out(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self._cond:
                    self.lines.append(json.loads(line))
                    self._cond.notify_all()
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[list[dict]], bool], timeout_s: float = 120) -> list[dict]:
        """The transcripts printed once `predicate` holds for them (or the daemon ended, or the
        time is up)."""
        with self._cond:
            self._cond.wait_for(lambda: predicate(self.lines) or self._ended, timeout_s)
            return list(self.lines)

    def wait_lines(self, n: int, timeout_s: float = 120) -> list[dict]:
        return self.wait_for(lambda lines: len(lines) >= n, timeout_s)[:n]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def finish(self, timeout_s: float = STREAM_TIMEOUT_S) -> str:
        """Wait for the end (exit code 0); its stderr."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"daemon did not finish; stderr:\n{self.stderr()[-3000:]}") from None
        for t in self._readers:
            t.join(10)
        assert self.proc.returncode == 0, self.stderr()[-3000:]
        return self.stderr()

    def stderr(self) -> str:
        return "".join(self.err)


def stream_rows(dev_dir: Path, stream_id: str) -> list[dict]:
    with (dev_dir / "longform" / "segments.tsv").open(newline="") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [r for r in rows if r["stream_id"] == stream_id]


def base_settings(tiny_default_bundle: Path, tmp_path: Path, audio: Path, realtime: bool) -> dict:
    return {"device_id": "testdev", "state_dir": tmp_path / "state", "model.path": tiny_default_bundle,
            "encoder.backend": "onnx", "input.source": "file", "input.path": audio,
            "input.realtime": realtime, "mqtt.metrics_interval_s": 0}


@pytest.fixture(scope="module")
def engine(tiny_default_bundle):
    return make_engine(tiny_default_bundle)


def per_utterance_wer(engine, audio_path: Path, rows: list[dict]) -> float:
    """The stream's utterances transcribed one by one, in process (while the daemon runs)."""
    audio, _ = sf.read(audio_path, dtype="int16")
    refs, hyps = [], []
    for r in rows:
        clip = audio[int(r["start_sample"]) : int(r["end_sample"])].astype(np.float32) / 32768
        refs.append(normalize(r["reference"]))
        hyps.append(normalize(engine.transcribe(clip).text))
    return jiwer.wer(refs, hyps)


def check_stream(sub, rows: list[dict], utterance_wer: float) -> list[dict]:
    """Every utterance of the stream published, in order, with no seq skipped; its text as good
    as the same utterances transcribed one by one (the segmenter loses nothing). Delivery is at
    least once (README): a transcript whose acknowledgement the broker's outage cut off comes
    again, right after itself, and a subscriber drops it by its seq."""
    sub.wait_for(lambda s: any(json.loads(m.payload)["state"] == "offline"
                               for m in s.on("edgeasr/testdev/status")), timeout_s=20)
    received = [m.json() for m in sub.on("edgeasr/testdev/transcript")]
    seqs = [m["seq"] for m in received]
    assert seqs == sorted(seqs), seqs  # in order; a repeat only next to itself
    messages = list({m["seq"]: m for m in received}.values())
    assert [m["seq"] for m in messages] == list(range(seqs[0], seqs[0] + len(messages))), seqs
    assert len(messages) >= len(rows)
    for m in messages:
        assert m["device_id"] == "testdev" and m["latency_ms"] >= 0 and m["end"] > m["start"]
    stream_wer = jiwer.wer(normalize(" ".join(r["reference"] for r in rows)),
                           normalize(" ".join(m["text"] for m in messages)))
    print(f"\nstream WER {stream_wer:.3f}, utterances one by one {utterance_wer:.3f}")
    assert stream_wer <= utterance_wer + 0.015, (stream_wer, utterance_wer)
    return messages


def test_a_stream_at_real_time_publishes_every_utterance_through_a_broker_outage(
        tiny_default_bundle, dev_dir, tmp_path, mosquitto, subscribe, engine):  # noqa: F811
    """The first four utterances of dev_stream_01 (46 s, cut in the pause after them) at real
    time, the one stream played so: partial results come while each utterance is spoken, and
    the broker is down from the first transcript until two more were made; every transcript
    still arrives, in order."""
    rows = stream_rows(dev_dir, "dev_stream_01")[:REALTIME_UTTERANCES]
    whole, rate = sf.read(dev_dir / "longform" / "dev_stream_01.wav", dtype="int16")
    after = stream_rows(dev_dir, "dev_stream_01")[REALTIME_UTTERANCES]
    audio_path = tmp_path / "stream.wav"
    sf.write(audio_path, whole[: (int(rows[-1]["end_sample"]) + int(after["start_sample"])) // 2], rate)
    sub = subscribe(mosquitto, ["edgeasr/testdev/#"])
    settings = base_settings(tiny_default_bundle, tmp_path, audio_path, realtime=True)
    settings.update({**mosquitto.overrides(), "output.stdout": True})
    daemon = Running(start_daemon(write_config(tmp_path / "edgeasr.yaml", settings)))
    assert sub.wait_count("edgeasr/testdev/transcript", 1, timeout_s=120), daemon.stderr()[-3000:]
    mosquitto.stop()
    made = len(daemon.lines)
    assert len(daemon.wait_lines(made + 2)) == made + 2, daemon.stderr()[-3000:]  # made while it is down
    mosquitto.start()
    utterance_wer = per_utterance_wer(engine, audio_path, rows)
    daemon.finish()
    messages = check_stream(sub, rows, utterance_wer)  # none lost in the outage
    print(f"\n{len(messages)} transcripts, {len(daemon.lines)} printed, {made} before the outage")
    # partial results while each utterance is spoken, under the id of its final transcript
    partials = [m.json() for m in sub.on("edgeasr/testdev/partial")]
    check = validator(PARTIAL)
    for m in partials:
        check.validate(m)
    partial_ids, final_ids = {m["id"] for m in partials}, {m["id"] for m in messages}
    assert len(partial_ids & final_ids) >= 0.8 * len(partial_ids) and len(partial_ids) >= len(rows) // 2


def test_a_noisy_stream_read_as_fast_as_it_decodes_publishes_every_utterance(
        tiny_default_bundle, dev_dir, tmp_path, mosquitto, subscribe, engine):  # noqa: F811
    """dev_stream_01 with noise at 20 dB SNR, through the daemon from a file read as fast as it
    is decoded (the segmenter reads the same audio at any pace; pacing is the test above's).
    (dev_stream_02 tests nothing these two do not: its WER is a benchmark's.)"""
    rows = stream_rows(dev_dir, "dev_stream_01_noisy20db")
    audio_path = dev_dir / "longform" / "dev_stream_01_noisy20db.wav"
    sub = subscribe(mosquitto, ["edgeasr/testdev/#"])
    settings = base_settings(tiny_default_bundle, tmp_path, audio_path, realtime=False)
    settings.update(mosquitto.overrides())
    daemon = start_daemon(write_config(tmp_path / "edgeasr.yaml", settings))
    utterance_wer = per_utterance_wer(engine, audio_path, rows)
    finish(daemon)
    check_stream(sub, rows, utterance_wer)


def test_sigkill_then_restart_delivers_every_transcript(tiny_default_bundle, dev_dir, tmp_path,
                                                        mosquitto, subscribe):  # noqa: F811
    """Broker down, daemon killed with SIGKILL after producing transcripts (and before the end
    of its stream): on restart the outbox publishes every one of them."""
    sub = subscribe(mosquitto, ["edgeasr/testdev/transcript"])
    mosquitto.stop()
    settings = base_settings(tiny_default_bundle, tmp_path, dev_dir / "longform" / "dev_stream_02.wav", False)
    settings.update(mosquitto.overrides())
    settings["output.stdout"] = True  # stdout shows what was produced before the kill
    daemon = Running(start_daemon(write_config(tmp_path / "a.yaml", settings)))
    produced = daemon.wait_lines(3)
    daemon.stop(signal.SIGKILL)
    daemon.proc.wait(30)
    assert len(produced) == 3 and daemon.proc.returncode == -signal.SIGKILL, daemon.stderr()[-3000:]
    mosquitto.start()
    hiss = tmp_path / "hiss.wav"  # faint hiss: audio, but nothing to say
    sf.write(hiss, np.random.default_rng(0).integers(-3, 4, 120 * 16000).astype(np.int16), 16000)
    # at real time, so that the daemon is still running when it has connected (a run that ends
    # before its broker connection leaves the outbox to the next start: MqttPublisher.close);
    # stopped once everything arrived
    settings.update({"input.path": hiss, "input.realtime": True, "output.stdout": False})
    restarted = Running(start_daemon(write_config(tmp_path / "b.yaml", settings)))
    got = sub.wait_count("edgeasr/testdev/transcript", len(produced), timeout_s=60)
    restarted.stop()
    err = restarted.finish(60)
    assert len(got) >= len(produced), err[-3000:]
    delivered = {m.json()["id"]: m.json() for m in sub.on("edgeasr/testdev/transcript")}
    for p in produced:
        assert p["id"] in delivered and delivered[p["id"]]["text"] == p["text"]


def test_silence_and_noise_publish_nothing(tiny_default_bundle, dev_dir, tmp_path,
                                           mosquitto, subscribe):  # noqa: F811
    rows = stream_rows(dev_dir, "dev_stream_01_noisy20db")
    noisy, sr = sf.read(dev_dir / "longform" / "dev_stream_01_noisy20db.wav", dtype="int16")
    gaps = [noisy[int(a["end_sample"]) + 1600 : int(b["start_sample"]) - 1600] for a, b in zip(rows, rows[1:])]
    noise = np.concatenate(gaps)
    two_minutes = 120 * sr
    audio = np.concatenate([np.zeros(two_minutes, np.int16), np.resize(noise, two_minutes)])
    path = tmp_path / "quiet.wav"
    sf.write(path, audio, sr)
    sub = subscribe(mosquitto, ["edgeasr/testdev/#"])
    settings = base_settings(tiny_default_bundle, tmp_path, path, realtime=False)
    settings.update(mosquitto.overrides())
    finish(start_daemon(write_config(tmp_path / "edgeasr.yaml", settings)), 120)
    sub.wait_for(lambda s: len(s.on("edgeasr/testdev/status")) >= 2, timeout_s=10)
    assert sub.on("edgeasr/testdev/transcript") == []
    assert [json.loads(m.payload)["state"] for m in sub.on("edgeasr/testdev/status")][:1] == ["online"]


def test_notify_socket_sees_ready_watchdog_and_stopping(tiny_default_bundle, dev_dir, tmp_path):
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(0.5)
    settings = base_settings(tiny_default_bundle, tmp_path, dev_dir / "longform" / "dev_stream_02.wav", True)
    daemon = start_daemon(write_config(tmp_path / "edgeasr.yaml", settings),
                          env={"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "1000000"})
    messages: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and messages.count("WATCHDOG=1") < 4:
        try:
            messages.append(sock.recv(4096).decode())
        except TimeoutError:
            pass
    daemon.send_signal(signal.SIGTERM)
    out, err = finish(daemon, 60)
    while True:
        try:
            messages.append(sock.recv(4096).decode())
        except TimeoutError:
            break
    sock.close()
    text = "\n".join(messages)
    assert "READY=1" in text and "STATUS=" in text and "STOPPING=1" in text
    assert messages.count("WATCHDOG=1") >= 4
    assert text.index("READY=1") < text.index("WATCHDOG=1") < text.index("STOPPING=1")
