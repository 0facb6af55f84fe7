"""What a combination of keys will do when it is not what the keys ask for, one line each.

Every key is checked alone when the configuration is loaded (config.py: errors, distinct exit
codes). Some values are valid alone and still do something else than asked in combination:
a duration the VAD can only take in whole frames, a key that another key switches off, more
threads than cores. `edgeasr check` prints these lines as warnings and the daemon logs them
once at start; both call `config_warnings`, the one place they are worked out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgeasr.config import Config, as_dict
from edgeasr.reload import flatten
from edgeasr.stages import frames_reaching


@dataclass(frozen=True)
class Facts:
    """What the configuration meets where it runs; None: not known (no bundle to read)."""

    cores: int  # CPUs this process may run on (os.sched_getaffinity)
    window_s: float | None = None  # the longest segment: vad.max_window_s, or the model's window
    multilingual: bool | None = None  # the model bundle knows languages beyond English

    @classmethod
    def here(cls, window_s: float | None = None, multilingual: bool | None = None) -> Facts:
        return cls(len(os.sched_getaffinity(0)), window_s, multilingual)


def config_warnings(cfg: Config, facts: Facts) -> list[str]:
    """One line per combination that does not do what its keys ask for (empty: none)."""
    lines = [line for rule in RULES for line in rule(cfg, facts)]
    return lines + [f"{key}: {_shown(value)} is not used ({why})" for key, value, why in _unused(cfg)]


def _shown(value: Any) -> str:
    """A value as the config file would say it (true, null, "de")."""
    return json.dumps(value)


# --- durations heard in VAD frames -----------------------------------------------------------


def _in_frames(cfg: Config, key: str, ms: int | None, what: str) -> str | None:
    """A duration the VAD takes in whole frames (rounded up), when that is not what was asked;
    `what` says what happens, with {ms} for when."""
    frame = cfg.vad.frame_ms
    if ms is None or ms % frame == 0:
        return None
    heard = frames_reaching(ms, frame) * frame
    return f"{key}: {ms} ms is heard in {frame} ms VAD frames (vad.frame_ms): {what.format(ms=heard)}"


def frame_rounding(cfg: Config, facts: Facts) -> list[str]:
    v, p, w = cfg.vad, cfg.pipeline, cfg.wyoming
    capture = cfg.input.source != "none"  # the segmenter's keys are used only with an input
    lines = [
        _in_frames(cfg, "vad.hangover_ms", v.hangover_ms if capture else None,
                   "a segment ends after {ms} ms of non-speech"),
        _in_frames(cfg, "vad.pre_roll_ms", v.pre_roll_ms if capture else None,
                   "{ms} ms of audio are kept before speech"),
        _in_frames(cfg, "vad.cut_pause_ms", v.cut_pause_ms if capture else None,
                   "a pause near the window's limit is cut once it has lasted {ms} ms"),
        _in_frames(cfg, "pipeline.speculate_after_ms", p.speculate_after_ms,
                   "a pause is decoded once it has lasted {ms} ms"),
        _in_frames(cfg, "wyoming.endpoint_ms", w.endpoint_ms if w.uri else None,
                   "the transcript goes out after {ms} ms of silence"),
    ]
    return [line for line in lines if line]


def pauses(cfg: Config, facts: Facts) -> list[str]:
    """Pause lengths against each other, as the VAD counts them (whole frames)."""
    v, frame = cfg.vad, cfg.vad.frame_ms
    hangover = max(1, frames_reaching(v.hangover_ms, frame))
    lines = []
    after = cfg.pipeline.speculate_after_ms
    if after is not None and frames_reaching(after, frame) >= hangover and _live(cfg):
        lines.append(f"pipeline.speculate_after_ms: {after} ms reaches vad.hangover_ms ({v.hangover_ms} ms) in "
                     f"{frame} ms frames: the segment has ended by then, so the microphone's speech is "
                     "decoded at its end, never during the pause")
    if frames_reaching(v.cut_pause_ms, frame) >= hangover and cfg.input.source != "none":
        lines.append(f"vad.cut_pause_ms: {v.cut_pause_ms} ms is not shorter than vad.hangover_ms "
                     f"({v.hangover_ms} ms): such a pause ends the segment, so long speech is cut at the "
                     "window's limit only")
    endpoint = cfg.wyoming.endpoint_ms if cfg.wyoming.uri else None
    if endpoint is not None and after is not None and frames_reaching(endpoint, frame) <= frames_reaching(after, frame):
        # measured on 283 commands (base, piper voices): 45 texts changed at 250 ms against 300, none at 400
        lines.append(f"wyoming.endpoint_ms: {endpoint} ms comes no later than pipeline.speculate_after_ms "
                     f"({after} ms): a Wyoming request is decoded at its endpoint, never during the pause, "
                     "and reads less of the pause after the speech than a decode at audio-stop does "
                     "(on 283 spoken commands, 1 in 6 texts changed at 250 ms)")
    if endpoint is not None and endpoint > cfg.wyoming.max_audio_s * 1000:
        lines.append(f"wyoming.endpoint_ms: {endpoint} ms is longer than wyoming.max_audio_s "
                     f"({cfg.wyoming.max_audio_s:g} s): a request is refused as too long before its "
                     "silence can reach the endpoint")
    return lines


# --- the window, the queue, the cores ---------------------------------------------------------


def window(cfg: Config, facts: Facts) -> list[str]:
    if facts.window_s is None:
        return []
    lines = []
    if cfg.vad.cut_search_s >= facts.window_s and cfg.input.source != "none":
        lines.append(f"vad.cut_search_s: {cfg.vad.cut_search_s:g} s is not shorter than the window "
                     f"({facts.window_s:g} s): the whole window is searched for the quietest point")
    if cfg.pipeline.queue_s < facts.window_s and cfg.input.source != "none":
        lines.append(f"pipeline.queue_s: {cfg.pipeline.queue_s:g} s is less than one segment may hold (up to "
                     f"{facts.window_s:g} s): a segment waits alone, and another behind it "
                     "(a live input drops the older one; a file waits)")
    return lines


def cores(cfg: Config, facts: Facts) -> list[str]:
    """The encoder and the decoder run one after the other: each pool against all the cores."""
    onnx_encoder = cfg.encoder.backend != "hailo"
    pools = [("encoder.threads", cfg.encoder.threads)] if onnx_encoder else []
    return [f"{key}: {n} threads on the {facts.cores} cores this process may use (os.sched_getaffinity): "
            f"those beyond {facts.cores} only contend for them"
            for key, n in [*pools, ("decoder.threads", cfg.decoder.threads)] if n > facts.cores]


def languages(cfg: Config, facts: Facts) -> list[str]:
    if facts.multilingual is not False:
        return []
    m, defaults = cfg.model, type(cfg.model)()
    return [f"model.{key}: {_shown(getattr(m, key))} is not used (the model is English only: "
            "it transcribes English)" for key in ("language", "task") if getattr(m, key) != getattr(defaults, key)]


def nowhere(cfg: Config, facts: Facts) -> list[str]:
    if cfg.output.stdout is False and not cfg.mqtt.host and cfg.input.source != "none":
        return ["output.stdout: false with no broker (mqtt.host): the microphone's transcripts go nowhere"]
    return []


RULES: tuple[Callable[[Config, Facts], list[str]], ...] = (frame_rounding, pauses, window, cores, languages,
                                                             nowhere)


# --- keys another key switches off ---------------------------------------------------------------


@dataclass(frozen=True)
class _Off:
    keys: tuple[str, ...]  # dotted keys, not used when
    when: Callable[[Config], bool]
    why: Callable[[Config], str]


def _live(c: Config) -> bool:
    return c.input.source == "mic" or (c.input.source == "file" and c.input.realtime)


_NO_VOCABULARY = "no vocabulary.home, vocabulary.names or homeassistant.url: no home's commands to read"
OFF = (
    _Off(("input.path", "input.realtime"), lambda c: c.input.source != "file",
         lambda c: f"input.source is {c.input.source}"),
    _Off(("input.device", "input.samplerate", "input.ring_s"), lambda c: c.input.source != "mic",
         lambda c: f"input.source is {c.input.source}"),
    _Off(("vad.min_speech_ms",), lambda c: c.input.source == "none" and not (c.wyoming.uri and c.wyoming.endpoint_ms),
         lambda c: "input.source is none and no wyoming.endpoint_ms: no speech is measured against it"),
    _Off(("input.block_ms", "vad.pre_roll_ms", "vad.hangover_ms", "vad.max_window_s",
          "vad.cut_search_s", "vad.cut_pause_ms", "pipeline.queue_s", "log.transcripts", "output.stdout",
          "output.words", "output.intent"),
         lambda c: c.input.source == "none", lambda c: "input.source is none: Wyoming requests only"),
    _Off(("vad.threshold",), lambda c: c.vad.detector == "webrtc", lambda c: "only silero and ten use it"),
    _Off(("vad.aggressiveness",), lambda c: c.vad.detector != "webrtc",
         lambda c: f"only webrtc uses it; vad.detector is {c.vad.detector}"),
    _Off(("encoder.precision",), lambda c: c.encoder.backend == "hailo", lambda c: "the encoder runs on the NPU"),
    _Off(("encoder.hef", "encoder.timeout_ms", "encoder.scheduler", "encoder.service_group"),
         lambda c: c.encoder.backend == "onnx", lambda c: "encoder.backend is onnx: the encoder runs on the CPU"),
    _Off(("decoder.fallback_temperature_step",), lambda c: c.decoder.on_gate_fail != "retry",
         lambda c: f"decoder.on_gate_fail is {c.decoder.on_gate_fail}"),
    _Off(("pipeline.partial_interval_ms", "pipeline.speculate_after_ms"), lambda c: not _live(c) and not c.wyoming.uri,
         lambda c: f"input.source {c.input.source} is not read at real time and wyoming.uri is null"),
    _Off(("wyoming.max_sessions", "wyoming.max_audio_s", "wyoming.max_connections", "wyoming.allow",
          "wyoming.endpoint_ms"), lambda c: not c.wyoming.uri, lambda c: "wyoming.uri is null"),
    _Off(("mqtt.port", "mqtt.topic_prefix", "mqtt.client_id", "mqtt.keepalive_s", "mqtt.session_expiry_s",
          "mqtt.reconnect_min_s", "mqtt.reconnect_max_s", "mqtt.username", "mqtt.tls.enabled", "mqtt.tls.ca",
          "mqtt.tls.cert", "mqtt.tls.key", "mqtt.metrics_interval_s", "mqtt.outbox_max",
          "mqtt.homeassistant.discovery", "mqtt.homeassistant.prefix", "mqtt.hermes.enabled", "mqtt.hermes.site_id"),
         lambda c: not c.mqtt.host, lambda c: "mqtt.host is null: no broker"),
    _Off(("mqtt.tls.ca", "mqtt.tls.cert", "mqtt.tls.key"), lambda c: c.mqtt.tls.enabled is False,
         lambda c: "mqtt.tls.enabled is false"),
    _Off(("mqtt.homeassistant.prefix",), lambda c: not c.mqtt.homeassistant.discovery,
         lambda c: "mqtt.homeassistant.discovery is false"),
    _Off(("mqtt.hermes.site_id",), lambda c: not c.mqtt.hermes.enabled, lambda c: "mqtt.hermes.enabled is false"),
    _Off(("homeassistant.refresh_s",), lambda c: not c.homeassistant.url, lambda c: "homeassistant.url is null"),
    _Off(("output.intent",), lambda c: not (c.vocabulary.home or c.vocabulary.names or c.homeassistant.url),
         lambda c: _NO_VOCABULARY),
)


def _unused(cfg: Config) -> list[tuple[str, Any, str]]:
    """(key, value, why) for each key set away from its default that another key switches off;
    a key once, with the first reason."""
    values, defaults = flatten(as_dict(cfg)), flatten(as_dict(Config()))
    seen: dict[str, tuple[str, Any, str]] = {}
    for off in OFF:
        if off.when(cfg):
            for key in off.keys:
                if key not in seen and values[key] != defaults[key]:
                    seen[key] = (key, values[key], off.why(cfg))
    return list(seen.values())
