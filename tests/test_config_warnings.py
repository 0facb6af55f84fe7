"""Keys that combine into something else than they ask for: `config_warnings` says what they will
do, one line each; `edgeasr check` prints those lines as warnings (exit 0) and the daemon logs
the same lines once at start."""

from __future__ import annotations

import pytest
import yaml
from helpers.daemon import run_edgeasr

from edgeasr.config import load_config
from edgeasr.config_warnings import Facts, config_warnings

WYOMING = {"input.source": "none", "wyoming.uri": "tcp://127.0.0.1:10300"}
FACTS = Facts(cores=4, window_s=10.0, multilingual=True)

# (keys, facts, the warning's start): each combination, and what check says it will do
WARNINGS = [
    ({**WYOMING, "wyoming.endpoint_ms": 500}, FACTS,
     "wyoming.endpoint_ms: 500 ms is heard in 30 ms VAD frames (vad.frame_ms): the transcript goes out after "
     "510 ms of silence"),
    ({**WYOMING, "wyoming.endpoint_ms": 250, "vad.frame_ms": 20}, FACTS,
     "wyoming.endpoint_ms: 250 ms is heard in 20 ms VAD frames (vad.frame_ms): the transcript goes out after "
     "260 ms of silence"),
    ({"vad.hangover_ms": 500}, FACTS,
     "vad.hangover_ms: 500 ms is heard in 30 ms VAD frames (vad.frame_ms): a segment ends after 510 ms of "
     "non-speech"),
    ({"vad.pre_roll_ms": 310}, FACTS, "vad.pre_roll_ms: 310 ms is heard in 30 ms VAD frames (vad.frame_ms): "
     "330 ms of audio are kept before speech"),
    ({"vad.cut_pause_ms": 200}, FACTS, "vad.cut_pause_ms: 200 ms is heard in 30 ms VAD frames (vad.frame_ms): a "
     "pause near the window's limit is cut once it has lasted 210 ms"),
    ({"pipeline.speculate_after_ms": 250}, FACTS, "pipeline.speculate_after_ms: 250 ms is heard in 30 ms VAD "
     "frames (vad.frame_ms): a pause is decoded once it has lasted 270 ms"),
    ({"pipeline.speculate_after_ms": 880, "vad.hangover_ms": 900}, FACTS,
     "pipeline.speculate_after_ms: 880 ms reaches vad.hangover_ms (900 ms) in 30 ms frames: the segment has "
     "ended by then"),
    ({"vad.cut_pause_ms": 900}, FACTS, "vad.cut_pause_ms: 900 ms is not shorter than vad.hangover_ms (900 ms)"),
    ({**WYOMING, "wyoming.endpoint_ms": 300}, FACTS,
     "wyoming.endpoint_ms: 300 ms comes no later than pipeline.speculate_after_ms (300 ms): a Wyoming request is "
     "decoded at its endpoint"),
    ({**WYOMING, "wyoming.endpoint_ms": 6000, "wyoming.max_audio_s": 5}, FACTS,
     "wyoming.endpoint_ms: 6000 ms is longer than wyoming.max_audio_s (5 s): a request is refused as too long"),
    ({"vad.cut_search_s": 12.0}, FACTS, "vad.cut_search_s: 12 s is not shorter than the window (10 s)"),
    ({"pipeline.queue_s": 5.0}, FACTS, "pipeline.queue_s: 5 s is less than one segment may hold (up to 10 s)"),
    ({"encoder.threads": 8}, FACTS, "encoder.threads: 8 threads on the 4 cores this process may use"),
    ({"decoder.threads": 5}, FACTS, "decoder.threads: 5 threads on the 4 cores this process may use"),
    ({"model.language": "de"}, Facts(cores=4, multilingual=False), 'model.language: "de" is not used (the model '
     "is English only"),
    ({"model.task": "translate"}, Facts(cores=4, multilingual=False), 'model.task: "translate" is not used'),
    ({"output.stdout": False}, FACTS, "output.stdout: false with no broker (mqtt.host): the microphone's "
     "transcripts go nowhere"),
    ({"vad.threshold": 0.7}, FACTS, "vad.threshold: 0.7 is not used (only silero and ten use it)"),
    ({"vad.aggressiveness": 3, "vad.detector": "silero"}, FACTS,
     "vad.aggressiveness: 3 is not used (only webrtc uses it; vad.detector is silero)"),
    ({"input.realtime": True}, FACTS, "input.realtime: true is not used (input.source is mic)"),
    ({"input.ring_s": 5.0, "input.source": "stdin"}, FACTS, "input.ring_s: 5.0 is not used (input.source is stdin)"),
    ({**WYOMING, "vad.hangover_ms": 600}, FACTS, "vad.hangover_ms: 600 is not used (input.source is none"),
    ({"encoder.backend": "hailo", "encoder.precision": "fp32"}, FACTS,
     'encoder.precision: "fp32" is not used (the encoder runs on the NPU)'),
    ({"encoder.backend": "onnx", "encoder.timeout_ms": 100}, FACTS,
     "encoder.timeout_ms: 100 is not used (encoder.backend is onnx"),
    ({"decoder.on_gate_fail": "drop", "decoder.fallback_temperature_step": 0.5}, FACTS,
     "decoder.fallback_temperature_step: 0.5 is not used (decoder.on_gate_fail is drop)"),
    ({"input.source": "stdin", "pipeline.partial_interval_ms": 200}, FACTS,
     "pipeline.partial_interval_ms: 200 is not used (input.source stdin is not read at real time"),
    ({"wyoming.endpoint_ms": 600}, FACTS, "wyoming.endpoint_ms: 600 is not used (wyoming.uri is null)"),
    ({"mqtt.topic_prefix": "home"}, FACTS, 'mqtt.topic_prefix: "home" is not used (mqtt.host is null: no broker)'),
    ({"mqtt.host": "broker", "mqtt.tls.enabled": False, "mqtt.tls.ca": "/etc/ssl/ca.pem"}, FACTS,
     'mqtt.tls.ca: "/etc/ssl/ca.pem" is not used (mqtt.tls.enabled is false)'),
    ({"mqtt.host": "broker", "mqtt.homeassistant.prefix": "ha"}, FACTS,
     'mqtt.homeassistant.prefix: "ha" is not used (mqtt.homeassistant.discovery is false)'),
    ({"mqtt.host": "broker", "mqtt.hermes.site_id": "hall"}, FACTS,
     'mqtt.hermes.site_id: "hall" is not used (mqtt.hermes.enabled is false)'),
    ({"homeassistant.refresh_s": 60}, FACTS, "homeassistant.refresh_s: 60.0 is not used (homeassistant.url is null)"),
    ({"output.intent": True}, FACTS, "output.intent: true is not used (no vocabulary.home, vocabulary.names or "
     "homeassistant.url"),
]


@pytest.mark.parametrize("keys, facts, warning", WARNINGS, ids=[w.split(":")[0] + f"-{i}" for i, (_, _, w)
                                                                in enumerate(WARNINGS)])
def test_each_combination_is_one_warning_saying_what_it_will_do(keys, facts, warning):
    lines = config_warnings(load_config(None, keys), facts)
    assert [line for line in lines if line.startswith(warning)] and len(lines) == len(set(lines)), lines
    assert all("\n" not in line for line in lines)


def test_what_the_keys_ask_for_exactly_warns_of_nothing():
    """The defaults, durations in whole frames, threads within the cores: nothing to say."""
    for keys in ({}, {**WYOMING, "wyoming.endpoint_ms": 600}, {"vad.hangover_ms": 600, "vad.frame_ms": 20},
                 {"encoder.threads": 4, "decoder.threads": 4}, {"model.language": "de"},
                 {"vad.detector": "silero", "vad.threshold": 0.7}):
        assert config_warnings(load_config(None, keys), FACTS) == [], keys


def test_check_prints_the_warnings_and_passes_and_the_daemon_logs_them_once(tiny_bundle, dev_dir, tmp_path):
    config = tmp_path / "edgeasr.yaml"
    config.write_text(yaml.safe_dump({"model": {"path": str(tiny_bundle)}, "encoder": {"backend": "onnx"},
                                      "state_dir": str(tmp_path / "state"),
                                      "vad": {"hangover_ms": 500, "cut_search_s": 12.0}}))
    clip = dev_dir / "audio" / "alsa_front-center.wav"
    expected = config_warnings(load_config(config), Facts.here(10.0, False))
    assert len(expected) == 2

    check = run_edgeasr("check", "--config", str(config), "--input", str(clip))
    assert check.returncode == 0, check.stderr
    assert [line for line in check.stdout.splitlines() if line.startswith("warning: ")] == [
        f"warning: {line}" for line in expected]

    run = run_edgeasr("--config", str(config), "--input", str(clip))
    assert run.returncode == 0, run.stderr[-3000:]
    for line in expected:  # once each, as a warning
        assert sum(row.endswith(f" WARNING edgeasr.commands.run: {line}") for row in run.stderr.splitlines()) == 1, \
            run.stderr[-3000:]
    assert "front center" in run.stdout.lower()  # it ran all the same
