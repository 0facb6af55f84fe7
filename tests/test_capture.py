"""Real PortAudio capture through ALSA `type file` devices fed from FIFOs at real time.

Each test runs the capture in a child process, because PortAudio reads the ALSA
configuration (and opens every FIFO) once, at `import sounddevice`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import soxr
from helpers.alsa import VirtualMics
from helpers.audio import dev_clip
from helpers.daemon import finish_child, json_lines, start_child, wait_ready

from edgeasr.audio.sources import to_int16

CLIP = "ls_test-other_1688-142285-0002"  # 2.8 s of speech

CAPTURE_CHILD = r"""
import json, sys, time
import numpy as np
from edgeasr.audio.capture import MicSource
device, rate, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
mic = MicSource(device, rate, 30, 2.0)
print("ready", flush=True)
chunks, starts, monos = [], [], []
total = 0
while total < n:
    chunk = mic.read(5.0)
    if chunk is None:
        break
    starts.append(chunk.start_sample)
    monos.append(chunk.t_mono)
    chunks.append(chunk.samples)
    total += len(chunk.samples)
np.save(out, np.concatenate(chunks)[:n])
print(json.dumps({"starts": starts, "lens": [len(c) for c in chunks], "monos": monos,
                  "status": mic.status, "samplerate": mic.samplerate,
                  "counters": vars(mic.counters)}), flush=True)
mic.close()
"""

DEVICES_CHILD = r"""
import argparse, sys
from edgeasr.commands import devices
from edgeasr.errors import EdgeAsrError
parser = argparse.ArgumentParser(prog="edgeasr")
devices.register(parser.add_subparsers(dest="command"))
args = parser.parse_args(["devices"])
try:
    code = args.func(args)
except EdgeAsrError as exc:
    print(f"edgeasr: {exc}", file=sys.stderr)
    code = exc.exit_code
sys.exit(code)
"""

RESOLVE_CHILD = r"""
import json
from edgeasr.audio import capture
from edgeasr.errors import EdgeAsrError
sd = capture.import_sounddevice()
found = {q: capture.resolve_device(sd, q).name for q in ["fifomic", "FIFOMIC4", 1]}
errors = {}
for q in ["nosuchmic", "mic", 7]:
    try:
        capture.MicSource(q, 16000, 30, 2.0)
    except EdgeAsrError as exc:
        errors[str(q)] = [type(exc).__name__, str(exc), exc.exit_code]
print(json.dumps({"found": found, "errors": errors}))
"""

REOPEN_CHILD = r"""
import json, os, time
from pathlib import Path
from edgeasr.audio.capture import MicSource
asoundrc = Path(os.environ["XDG_CONFIG_HOME"]) / "alsa" / "asoundrc"
mic = MicSource("fifomic", 16000, 30, 2.0, retry_min_s=0.1)
print("ready", flush=True)
before_end = 0
while before_end < 8000:
    chunk = mic.read(5.0)
    before_end = chunk.start_sample + len(chunk.samples)
# the device goes away: its stream dies (as PortAudio's does when a USB microphone is
# unplugged) and it is gone from ALSA's device list
asoundrc.rename(asoundrc.with_suffix(".unplugged"))
mic._stream.abort()
gone = []
deadline = time.monotonic() + 1.0
while time.monotonic() < deadline:
    gone.append(mic.read(0.1))
lost_status, lost_counters = mic.status, vars(mic.counters)
asoundrc.with_suffix(".unplugged").rename(asoundrc)  # plugged in again
after = None
deadline = time.monotonic() + 20
while time.monotonic() < deadline and after is None:
    chunk = mic.read(0.1)
    if chunk is not None and mic.counters.reopen_count:
        after = chunk.start_sample
print(json.dumps({"lost_status": lost_status, "lost_counters": lost_counters,
                  "none_while_gone": sum(c is None for c in gone[-5:]),
                  "status": mic.status, "before_end": before_end, "after": after,
                  "counters": vars(mic.counters)}), flush=True)
mic.close()
"""


@pytest.fixture()
def mics(tmp_path):
    mics = VirtualMics(tmp_path / "alsa", ["fifomic", "fifomic48"])
    yield mics
    mics.close()



def capture(mics, tmp_path, device: str, rate: int, n: int, feed: np.ndarray) -> tuple:
    out = tmp_path / "captured.npy"
    proc = start_child(CAPTURE_CHILD, [device, str(rate), str(n), str(out)], mics.env)
    wait_ready(proc)
    mics.feed(device, feed, rate, rate * 30 // 1000)
    code, stdout, err = finish_child(proc)
    assert code == 0, err
    return np.load(out), json_lines(stdout)[0]


def test_capture_at_16k_is_bit_exact_and_paced(mics, tmp_path):
    x = dev_clip(CLIP)
    y, report = capture(mics, tmp_path, "fifomic", 16000, len(x), x)
    np.testing.assert_array_equal(y, x)
    ends = np.cumsum(report["lens"])
    assert report["starts"] == [0, *ends[:-1].tolist()]  # contiguous stream offsets
    assert np.all(np.diff(report["monos"]) >= 0)
    # the FIFO is fed at real time, so capture takes about as long as the audio
    assert report["monos"][-1] - report["monos"][0] >= 0.8 * len(x) / 16000
    assert report["counters"]["overflows"] == 0
    assert report["counters"]["ring_drops"] == 0
    assert report["counters"]["frames"] >= len(x)
    assert report["status"].startswith("capturing from fifomic at 16000 Hz")


def test_capture_at_48k_is_resampled_to_16k(mics, tmp_path):
    x = dev_clip(CLIP)
    x48 = to_int16(soxr.resample(x.astype(np.float32) / 32768, 16000, 48000))
    n = len(x) - 1600  # the streaming resampler holds back its last few milliseconds
    y, report = capture(mics, tmp_path, "fifomic48", 48000, n, x48)
    assert report["samplerate"] == 48000
    expected = soxr.resample(x48, 48000, 16000)[:n]
    assert len(y) == n
    diff = np.abs(y.astype(np.int32) - expected.astype(np.int32))
    assert diff.max() <= 2, diff.max()  # same soxr filter, streamed vs one-shot
    # and it is the original 16 kHz speech again
    err = y.astype(np.float64) - x[:n]
    assert 10 * np.log10(np.mean(x[:n].astype(np.float64) ** 2) / np.mean(err**2)) > 20  # 26.8 dB


def test_devices_lists_the_virtual_mics(mics):
    code, out, err = finish_child(start_child(DEVICES_CHILD, [], mics.env))
    assert code == 0, err
    assert out.splitlines()[0].split() == ["index", "channels", "rate", "name"]
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [r[3] for r in rows] == ["fifomic", "fifomic48"]
    assert [r[0] for r in rows] == ["0", "1"]
    assert "(default)" in out.splitlines()[1]


def test_device_by_name_or_index_and_clear_errors(mics):
    code, out, err = finish_child(start_child(RESOLVE_CHILD, [], mics.env))
    assert code == 0, err
    lines = json_lines(out)
    assert lines[0]["found"] == {"fifomic": "fifomic", "FIFOMIC4": "fifomic48", "1": "fifomic48"}
    errors = lines[0]["errors"]
    assert errors["nosuchmic"] == [
        "DeviceError",
        "input.device: no input device matches 'nosuchmic' (available: fifomic, fifomic48)",
        69,
    ]
    assert errors["mic"][1] == "input.device: 'mic' is ambiguous (matches: fifomic, fifomic48)"
    assert errors["7"][1].startswith("input.device: 7 is not an input device")


def test_no_devices_exits_69_with_one_line(tmp_path):
    # The stock ALSA configuration and no user one: on a machine without sound hardware
    # (CI) PortAudio finds no input device at all. (An ALSA configuration without
    # pcm.default makes PortAudio abort, so an empty ALSA_CONFIG_PATH is no substitute.)
    for name in ("home", "xdg"):
        (tmp_path / name).mkdir()
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    code, _, err = finish_child(start_child(DEVICES_CHILD, [], env))
    if Path("/dev/snd").exists():  # a developer machine with a sound card lists it instead
        assert code == 0, err
        return
    assert code == 69
    assert err.splitlines()[-1] == (
        "edgeasr: no audio input devices: PortAudio found none "
        "(microphone plugged in? user in group 'audio'?)"
    )
    assert "Traceback" not in err


def test_lost_device_is_reopened_with_backoff_and_status(mics, tmp_path):
    proc = start_child(REOPEN_CHILD, [], mics.env)
    wait_ready(proc)
    mics.feed("fifomic", dev_clip(CLIP), 16000, 480)
    code, out, err = finish_child(proc)
    assert code == 0, err
    report = json_lines(out)[0]
    assert report["lost_status"] == "microphone lost (the input stream stopped); retrying"
    assert report["lost_counters"]["reopen_count"] == 0  # not while it is unplugged
    assert report["none_while_gone"] == 5
    assert report["counters"]["reopen_count"] == 1
    assert report["status"] == "capturing from fifomic at 16000 Hz"
    assert report["after"] is not None
    assert report["after"] > report["before_end"]  # the outage is a gap in the stream


DROP_CHILD = r"""
import json, time
import numpy as np
from edgeasr.audio.capture import MicSource
mic = MicSource("fifomic", 16000, 30, 0.3)  # a ring of 0.3 s
print("ready", flush=True)
first = mic.read(5.0)
time.sleep(1.0)  # the pipeline stalls: the callback keeps writing, the ring drops the oldest
chunks = [mic.read(5.0) for _ in range(20)]
print(json.dumps({"first_end": first.start_sample + len(first.samples),
                  "starts": [c.start_sample for c in chunks],
                  "samples": [c.samples.tolist() for c in chunks],
                  "counters": vars(mic.counters)}), flush=True)
mic.close()
"""


def test_full_ring_drops_oldest_and_keeps_stream_offsets(mics):
    x = dev_clip(CLIP)
    proc = start_child(DROP_CHILD, [], mics.env)
    wait_ready(proc)
    mics.feed("fifomic", x, 16000, 480)
    code, out, err = finish_child(proc)
    assert code == 0, err
    report = json_lines(out)[0]
    assert report["counters"]["ring_drops"] > 0
    assert report["starts"][0] > report["first_end"]  # the dropped audio is a gap
    for start, samples in zip(report["starts"], report["samples"]):
        # offsets still point at the right place in what the microphone heard
        np.testing.assert_array_equal(samples, x[start : start + len(samples)])
