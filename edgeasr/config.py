"""The YAML configuration: one file mapped onto nested frozen dataclasses.

The dataclasses below *are* the key tree (config/edgeasr.yaml documents every key and
tests/test_config.py keeps the two in step). Loading is one generic walker: each field's
type comes from its annotation and its limits from one small `Rule` in the field's
metadata, so adding a key is adding a field.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

from edgeasr.errors import ConfigError, MissingInputError

# --- rules: one tiny class per kind of limit --------------------------------------------


class Rule:
    def ok(self, value: Any) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class OneOf(Rule):
    values: tuple[Any, ...]

    def ok(self, value: Any) -> bool:
        return value in self.values

    def __str__(self) -> str:
        return ", ".join(str(v) for v in self.values)


@dataclass(frozen=True)
class Range(Rule):
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # lo itself excluded

    def ok(self, value: Any) -> bool:
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or value <= self.hi

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {self.lo}"
        if self.lo_open:
            return f"{self.lo} < x <= {self.hi}"
        return f"{self.lo}..{self.hi}"


@dataclass(frozen=True)
class Matches(Rule):
    pattern: str
    text: str

    def ok(self, value: Any) -> bool:
        return re.fullmatch(self.pattern, value) is not None

    def __str__(self) -> str:
        return self.text


def opt(default: Any = None, rule: Rule | None = None, **meta: Any) -> Any:
    """A config field: its default and the rule its value must follow. Meta keys: `live`
    (SIGHUP applies it to a running daemon), `credential` (looked up in $CREDENTIALS_DIRECTORY)."""
    return field(default=default, metadata={"rule": rule, **meta})


def section(cls: type) -> Any:
    return field(default_factory=cls)


POSITIVE = Range(0, lo_open=True)
AT_LEAST_1 = Range(1)
NON_NEGATIVE = Range(0)
DEVICE_ID = Matches(r"[A-Za-z0-9_-]+", "[A-Za-z0-9_-]+")


def default_device_id() -> str:
    name = socket.gethostname().split(".")[0]
    return re.sub(r"[^A-Za-z0-9_-]", "-", name) or "edgeasr"


def default_state_dir() -> Path:
    # systemd's StateDirectory= may list several directories, separated by ':'
    env = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return Path(env) if env else Path.home() / ".local" / "state" / "edgeasr"


# --- the key tree, in audio-flow order --------------------------------------------------


@dataclass(frozen=True)
class LogConfig:
    level: str = opt("INFO", OneOf(("DEBUG", "INFO", "WARNING", "ERROR")), live=True)
    transcripts: bool = opt(False, live=True)  # transcripts at INFO (else DEBUG only)


@dataclass(frozen=True)
class InputConfig:
    source: str = opt("mic", OneOf(("mic", "file", "stdin", "none")))
    path: Path | None = opt(None)
    realtime: bool = opt(False)
    device: int | str | None = opt(None)
    samplerate: int | None = opt(None, Range(1000, 384_000))
    block_ms: int = opt(30, Range(1, 1000))
    ring_s: float = opt(2.0, POSITIVE)


@dataclass(frozen=True)
class VadOptions:
    aggressiveness: int = opt(2, Range(0, 3))
    frame_ms: int = opt(30, OneOf((10, 20, 30)))
    pre_roll_ms: int = opt(300, NON_NEGATIVE)
    hangover_ms: int = opt(900, NON_NEGATIVE)
    min_speech_ms: int = opt(250, NON_NEGATIVE)
    max_window_s: float | None = opt(None, POSITIVE)
    cut_search_s: float = opt(2.0, POSITIVE)
    cut_pause_ms: int = opt(300, POSITIVE)
    detector: str = opt("webrtc", OneOf(("webrtc", "silero", "ten")))
    threshold: float = opt(0.5, Range(0, 1, lo_open=True))  # silero, ten: speech probability


@dataclass(frozen=True)
class ModelConfig:
    path: Path | None = opt(None)
    language: str | None = opt(None, live=True)
    task: str = opt("transcribe", OneOf(("transcribe", "translate")), live=True)


@dataclass(frozen=True)
class EncoderConfig:
    backend: str = opt("auto", OneOf(("auto", "onnx", "hailo")))
    precision: str = opt("int8", OneOf(("int8", "fp32")))
    threads: int = opt(2, AT_LEAST_1)
    hef: Path | None = opt(None)
    timeout_ms: int = opt(2000, AT_LEAST_1)
    scheduler: str = opt("round_robin", OneOf(("round_robin", "none")))
    service_group: str | None = opt(None)
    max_failures: int = opt(5, AT_LEAST_1)
    reopen_timeout_s: float = opt(8.0, Range(0, 60))


@dataclass(frozen=True)
class DecoderConfig:
    # null (and the keys below left at null) = the values calibrated for the model bundle
    # (its manifest's `decoding` section; `edgeasr models calibrate`)
    preset: str | None = opt(None, OneOf(("conservative", "balanced", "aggressive")), live=True)
    precision: str = opt("int8", OneOf(("int8", "fp32")))
    threads: int = opt(2, AT_LEAST_1)
    encoder_padding: int | None = opt(None, Range(0, 1500), live=True)
    repetition_penalty: float | None = opt(None, Range(1), live=True)
    eos_threshold: float | None = opt(None, Range(0, 1, lo_open=True), live=True)
    condition_on_previous_text: bool | None = opt(None, live=True)
    max_tokens_per_s: float = opt(6.0, POSITIVE, live=True)
    logprob_threshold: float = opt(-1.0, live=True)
    no_speech_threshold: float = opt(0.6, Range(0, 1), live=True)
    compression_ratio_threshold: float = opt(2.4, POSITIVE, live=True)
    on_gate_fail: str | None = opt(None, OneOf(("drop", "retry", "keep")), live=True)
    fallback_temperature_step: float = opt(0.2, Range(0, 1, lo_open=True), live=True)
    beam_size: int = opt(1, Range(1, 5))  # 1: greedy; 2..5 hypotheses at temperature 0 (bundle --with beam)
    # judge words by the audio under them (the alignment heads): closing words with none at
    # the end of long audio are dropped, and a phrase repeated inside a segment is a loop
    # only without it (loads the alignment graph on first use; off: every such repeat is cut)
    drop_unspoken_words: bool = opt(True)


@dataclass(frozen=True)
class PipelineConfig:
    queue_s: float = opt(60.0, POSITIVE)
    stop_deadline_s: float = opt(10.0, POSITIVE)
    partial_interval_ms: int = opt(500, NON_NEGATIVE)  # 0: no partial results
    speculate_after_ms: int | None = opt(300, NON_NEGATIVE)  # null: no speculative decoding


@dataclass(frozen=True)
class WyomingConfig:
    uri: str | None = opt(None, Matches(r"(tcp://[^/:]+:\d+|unix://.+)", "tcp://HOST:PORT or unix://PATH"))
    zeroconf: str | None = opt(None, Matches(r"[^.]+", "a service name, no dots"))
    max_sessions: int = opt(4, AT_LEAST_1)
    max_audio_s: float = opt(30.0, POSITIVE)


@dataclass(frozen=True)
class OutputConfig:
    stdout: bool | None = opt(None)
    words: bool = opt(False)  # word timestamps in transcripts (one more decoder run per window)


@dataclass(frozen=True)
class TlsConfig:
    enabled: bool | None = opt(None)
    ca: Path | None = opt(None)
    cert: Path | None = opt(None)
    key: Path | None = opt(None)


@dataclass(frozen=True)
class HomeAssistantConfig:
    discovery: bool = opt(False)
    prefix: str = opt("homeassistant", Matches(r"[^#+]+", "non-empty, no # or +"))


@dataclass(frozen=True)
class HermesConfig:
    enabled: bool = opt(False)
    site_id: str | None = opt(None)


@dataclass(frozen=True)
class MqttConfig:
    host: str | None = opt(None)
    port: int = opt(1883, Range(1, 65535))
    topic_prefix: str = opt("edgeasr", Matches(r"[^#+]+", "non-empty, no # or +"))
    client_id: str | None = opt(None)
    keepalive_s: int = opt(30, AT_LEAST_1)
    session_expiry_s: int = opt(86400, NON_NEGATIVE)
    reconnect_min_s: float = opt(1.0, POSITIVE)
    reconnect_max_s: float = opt(60.0, POSITIVE)
    username: str | None = opt(None)
    # a *relative* name is looked up in $CREDENTIALS_DIRECTORY first (LoadCredential=)
    password_file: Path | None = opt(None, credential=True)
    tls: TlsConfig = section(TlsConfig)
    metrics_interval_s: float = opt(60.0, NON_NEGATIVE)
    outbox_max: int = opt(10000, AT_LEAST_1)
    homeassistant: HomeAssistantConfig = section(HomeAssistantConfig)
    hermes: HermesConfig = section(HermesConfig)


@dataclass(frozen=True)
class Config:
    # null in the file means "derive from the environment" (host name, $STATE_DIRECTORY)
    device_id: str = field(default_factory=default_device_id, metadata={"rule": DEVICE_ID})
    state_dir: Path = field(default_factory=default_state_dir, metadata={"rule": None})
    log: LogConfig = section(LogConfig)
    input: InputConfig = section(InputConfig)
    vad: VadOptions = section(VadOptions)
    model: ModelConfig = section(ModelConfig)
    encoder: EncoderConfig = section(EncoderConfig)
    decoder: DecoderConfig = section(DecoderConfig)
    pipeline: PipelineConfig = section(PipelineConfig)
    wyoming: WyomingConfig = section(WyomingConfig)
    output: OutputConfig = section(OutputConfig)
    mqtt: MqttConfig = section(MqttConfig)


# --- loading ------------------------------------------------------------------------------


def load_config(path: Path | None, overrides: Mapping[str, object] = {}) -> Config:
    """Read `path` (None: all defaults), apply dotted-key `overrides`, validate.

    Relative paths in the file resolve against the file's directory; relative paths
    given as overrides (the command line) resolve against the working directory.
    """
    raw = _read_yaml(path) if path is not None else {}
    for key, value in overrides.items():
        _set_dotted(raw, key, value)
    base = path.resolve().parent if path is not None else Path.cwd()
    cfg = _build(Config, raw, "", _Paths(base, frozenset(overrides)))
    _check_inputs(cfg)
    return cfg


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingInputError(f"config file {path}: does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: cannot read ({exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or exc
        raise ConfigError(f"config file {where}: invalid YAML ({problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping of keys")
    return data


def _set_dotted(raw: dict[str, Any], key: str, value: object) -> None:
    *parents, leaf = key.split(".")
    node = raw
    for i, name in enumerate(parents):
        child = node.get(name)
        if child is None:
            child = node[name] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parents[: i + 1])}: is not a section")
        node = child
    node[leaf] = value


@dataclass(frozen=True)
class _Paths:
    base: Path  # the config file's directory
    from_cli: frozenset[str]  # dotted keys given as overrides (relative to cwd)

    def resolve(self, key: str, value: Path, credential: bool) -> Path:
        value = value.expanduser()
        if value.is_absolute():
            return value
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        if credential and creds and (Path(creds) / value).exists():
            return Path(creds) / value
        return (Path.cwd() if key in self.from_cli else self.base) / value


def _build(cls: type, data: Any, prefix: str, paths: _Paths) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {data!r} is not a mapping of keys")
    known = {f.name: f for f in dataclasses.fields(cls)}
    for name in data:
        if name not in known:
            raise ConfigError(f"{prefix}{name}: unknown key (allowed: {', '.join(known)})")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        key, kind = prefix + name, hints[name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            if value is not None:  # an empty section in YAML is null
                kwargs[name] = _build(kind, value, key + ".", paths)
        elif value is None and known[name].default is dataclasses.MISSING:
            pass  # null = the environment-derived default
        else:
            kwargs[name] = _value(key, value, kind, known[name].metadata, paths)
    return cls(**kwargs)


def _value(key: str, value: Any, kind: Any, meta: Mapping[str, Any], paths: _Paths) -> Any:
    kinds = (
        typing.get_args(kind) if typing.get_origin(kind) in (Union, types.UnionType) else (kind,)
    )
    if value is None:
        if type(None) in kinds:
            return None
        raise ConfigError(f"{key}: null is not allowed ({_describe(kinds, meta)})")
    for k in kinds:
        converted = _convert(value, k)
        if converted is not None:
            break
    else:
        raise ConfigError(f"{key}: {value!r} is not allowed ({_describe(kinds, meta)})")
    rule: Rule | None = meta.get("rule")
    if rule is not None and not rule.ok(converted):
        raise ConfigError(f"{key}: {value!r} is not allowed ({rule})")
    if isinstance(converted, Path):
        return paths.resolve(key, converted, bool(meta.get("credential")))
    return converted


def _convert(value: Any, kind: Any) -> Any:
    """`value` as `kind`, or None when it is not one (bool is never a number here)."""
    if kind is bool:
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if kind is int:
        return value if isinstance(value, int) else None
    if kind is float:
        return float(value) if isinstance(value, (int, float)) else None
    if kind is str:
        return value if isinstance(value, str) else None
    if kind is Path:
        return Path(value) if isinstance(value, (str, Path)) and str(value) else None
    return None


_KIND_NAMES = {
    bool: "true/false",
    int: "an integer",
    float: "a number",
    str: "a string",
    Path: "a path",
    type(None): "null",
}


def _describe(kinds: tuple[Any, ...], meta: Mapping[str, Any]) -> str:
    rule = meta.get("rule")
    names = [
        str(rule) if rule is not None and k is not type(None) and k is not bool else _KIND_NAMES[k]
        for k in kinds
    ]
    return " or ".join(dict.fromkeys(names))


def _check_audio_file(key: str, path: Path) -> None:
    if _is_dir(key, path):
        raise MissingInputError(f"{key}: {path} is a directory, not an audio file")
    if not path.is_file():
        raise MissingInputError(f"{key}: {path} does not exist")


def _is_dir(key: str, path: Path) -> bool:
    """Path.is_dir, with a directory this user may not enter named as such."""
    try:
        return path.is_dir()
    except PermissionError:
        raise MissingInputError(f"{key}: {path} cannot be read: permission denied (for user "
                                f"{_user()})") from None


def _user() -> str:
    import getpass

    return getpass.getuser()


def _check_inputs(cfg: Config) -> None:
    """Cross-key checks and the inputs that must exist before anything starts."""
    if cfg.input.source == "file":
        if cfg.input.path is None:
            raise ConfigError("input.path: required when input.source is file")
        _check_audio_file("input.path", cfg.input.path)
    if cfg.model.path is not None and not _is_dir("model.path", cfg.model.path):
        raise MissingInputError(f"model.path: {cfg.model.path} is not a directory")
    if cfg.input.source == "none" and not cfg.wyoming.uri:
        raise ConfigError("input.source: none leaves nothing to do without wyoming.uri (a Wyoming server)")
    if cfg.wyoming.zeroconf and not (cfg.wyoming.uri or "").startswith("tcp://"):
        raise ConfigError("wyoming.zeroconf: needs wyoming.uri tcp://HOST:PORT (zeroconf announces a TCP port)")
    after = cfg.pipeline.speculate_after_ms
    if after is not None and after >= cfg.vad.hangover_ms:
        raise ConfigError(f"pipeline.speculate_after_ms: {after} is not allowed (below vad.hangover_ms, "
                          f"{cfg.vad.hangover_ms}: the speculation must start before the segment ends)")
    if cfg.mqtt.reconnect_min_s > cfg.mqtt.reconnect_max_s:
        raise ConfigError(
            f"mqtt.reconnect_max_s: {cfg.mqtt.reconnect_max_s} is not allowed "
            f"(>= mqtt.reconnect_min_s, {cfg.mqtt.reconnect_min_s})"
        )


# --- rendering ----------------------------------------------------------------------------

SECRET_KEY = re.compile(r"(\w+_)?(password|secret)")  # never rendered, should one appear


def as_dict(obj: Any) -> dict[str, Any]:
    """The configuration as plain data (for `edgeasr check` and logs); paths as strings.

    Holds no password: the tree only names a password *file*, and any key that looks
    like a secret is masked all the same.
    """
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out[f.name] = as_dict(value)
        elif SECRET_KEY.fullmatch(f.name):
            out[f.name] = None if value is None else "***"
        else:
            out[f.name] = str(value) if isinstance(value, Path) else value
    return out
