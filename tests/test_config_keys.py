"""Every key of config/edgeasr.yaml does what its comment says: a row per key (tests/config_rows/,
by section) sets it away from its default and observes the effect on what the daemon builds
(its publishers, sources, segmenter, engine, encoder, Wyoming server, MQTT client, vocabulary).
A key whose effect no test can see has a row saying why. The keys are enumerated from the
config dataclasses: a new key without a row fails here."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite("config_rows")

from config_rows import ROWS  # noqa: E402
from config_rows.lab import Lab, Observed, Unobservable  # noqa: E402
from helpers.alsa import VirtualMics  # noqa: E402
from helpers.audio import DEV  # noqa: E402
from helpers.broker import Broker, Subscriber  # noqa: E402
from helpers.daemon import finish_child, json_lines, start_child, wait_ready  # noqa: E402

from edgeasr.config import as_dict, load_config  # noqa: E402
from edgeasr.reload import flatten  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
KEYS = list(flatten(as_dict(load_config(None))))
WHY_CHARS = 200  # a short reason


def test_every_key_has_a_row_and_every_row_a_key():
    assert [k for k in KEYS if k not in ROWS] == []  # a key without a row: add one in tests/config_rows/
    assert [k for k in ROWS if k not in KEYS] == []
    for key, row in ROWS.items():
        assert not isinstance(row, Unobservable) or 0 < len(row.why) <= WHY_CHARS, key


def params() -> list:
    return [pytest.param(key, marks=[getattr(pytest.mark, need) for need in row.needs], id=key)
            for key, row in ROWS.items() if isinstance(row, Observed)]


@pytest.mark.parametrize("key", params())
def test_the_key_does_what_its_comment_says(key, request, lab_cache):
    row = ROWS[key]
    assert isinstance(row, Observed)
    row.check(Lab(request, lab_cache))


# -- what the rows share, built once for the module ------------------------------------------------

@pytest.fixture(scope="module")
def lab_cache() -> Iterator[dict]:
    cache: dict = {}
    yield cache
    cache.clear()


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[Broker]:
    started = Broker(tmp_path_factory.mktemp("mosquitto"))
    started.start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def subscriber(broker) -> Iterator[Subscriber]:
    sub = Subscriber(broker, ["#"], "rows-subscriber").start()
    yield sub
    sub.close()


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory) -> Iterator[tuple[Broker, Path, Path]]:
    """A broker with TLS, a password, and client certificates required (signed by its own)."""
    started = Broker(tmp_path_factory.mktemp("mosquitto-tls"), tls=True)
    with started.conf.open("a") as conf:
        conf.write("require_certificate true\n")
    cert, key, request = (started.root / name for name in ("client.crt", "client.key", "client.csr"))
    for command in (["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                     "-keyout", str(key), "-out", str(request), "-subj", "/CN=rows-client"],
                    ["openssl", "x509", "-req", "-in", str(request), "-CA", str(started.ca), "-CAkey", str(started.key),
                     "-CAcreateserial", "-out", str(cert), "-days", "2"]):
        subprocess.run(command, check=True, capture_output=True)
    started.start()
    yield started, cert, key
    started.stop()


@pytest.fixture(scope="module")
def home_assistant() -> Iterator:
    from helpers.homeassistant import FakeHomeAssistant

    server = FakeHomeAssistant()
    yield server
    server.close()


MIC_CHILD = r"""
import json
from edgeasr.config import load_config
from edgeasr.daemon import open_source
CONFIGS = {"default": {}, "device": {"input.device": "fifomic48"}, "samplerate": {"input.samplerate": 32000},
           "ring": {"input.ring_s": 0.03}}
clock = open_source(load_config(None, {"input.source": "mic", "input.device": "fifoclock"}))
print("ready", flush=True)
out = {}
for name, keys in CONFIGS.items():
    source = open_source(load_config(None, {"input.source": "mic", **keys}))
    assert source.read(5.0) is not None
    for _ in range(10 if name in ("default", "ring") else 0):  # 0.3 s of another microphone
        assert clock.read(5.0) is not None  # read, this one not: its capture goes on
    out[name] = {"status": source.status, "ring_drops": source.counters.ring_drops}
    source.close()
print(json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def mic_report(tmp_path_factory) -> dict:
    """The microphones the daemon opens for input.device, samplerate and ring_s: PortAudio on
    ALSA devices fed from FIFOs at real time (tests/helpers/alsa.py), in a child that imports
    sounddevice. While one is not read, another one is: its blocks pace the wait."""
    import numpy as np
    import soundfile as sf

    mics = VirtualMics(tmp_path_factory.mktemp("alsa"), ["fifomic", "fifomic48", "fifoclock"])
    try:
        speech, _ = sf.read(DEV / "audio" / "alsa_front-center.wav", dtype="int16")
        proc = start_child(MIC_CHILD, [], mics.env)
        wait_ready(proc)
        mics.feed("fifomic", speech, 16000, 480)
        mics.feed("fifomic48", np.repeat(speech, 3), 48000, 1440)
        mics.feed("fifoclock", speech, 16000, 480)
        code, out, err = finish_child(proc)
        assert code == 0, err
        return json_lines(out)[0]
    finally:
        mics.close()


THREADS_CHILD = r"""
import gc, json, os, sys
from edgeasr.asr.encoder import create_encoder
from edgeasr.bundle import load_bundle
from edgeasr.config import load_config
from edgeasr.daemon import engine_for
path = sys.argv[1]
bundle = load_bundle(path)
kept, out = [], {}
def count(name, build):
    gc.collect()
    before = len(os.listdir("/proc/self/task"))
    kept.append(build())
    out[name] = len(os.listdir("/proc/self/task")) - before
def cfg(keys):
    return load_config(None, {"encoder.backend": "onnx", "model.path": path, **keys})
create_encoder(bundle, cfg({}).encoder)  # onnxruntime's own threads, started with its first session
count("encoder", lambda: create_encoder(bundle, cfg({}).encoder))
count("encoder 4", lambda: create_encoder(bundle, cfg({"encoder.threads": 4}).encoder))
count("engine", lambda: engine_for(cfg({}), bundle))
count("decoder 4", lambda: engine_for(cfg({"decoder.threads": 4}), bundle))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def thread_counts(tiny_bundle) -> dict[str, int]:
    """The threads a process gains building each encoder and engine, in a child of its own (no
    other thread of the test run comes or goes there)."""
    proc = subprocess.run([sys.executable, "-c", THREADS_CHILD, str(tiny_bundle)], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])
