"""The YAML configuration: one file mapped onto nested frozen dataclasses.

The dataclasses below *are* the key tree (config/edgeasr.yaml documents every key and
tests/test_config.py keeps the two in step). Loading is one generic walker: each field's
type comes from its annotation and its limits from one small `Rule` in the field's
metadata, so adding a key is adding a field.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import socket
import stat
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union
from urllib.parse import urlparse

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


@dataclass(frozen=True)
class Networks(Rule):
    """A list of client addresses or networks in CIDR notation (IPv4 or IPv6)."""

    def ok(self, value: Any) -> bool:
        try:
            for item in value:
                ipaddress.ip_network(item, strict=False)
        except ValueError:
            return False
        return True

    def __str__(self) -> str:
        return "a list of addresses or networks, e.g. [192.168.1.0/24, 127.0.0.1, '::1']"


@dataclass(frozen=True)
class Phrases(Rule):
    """A bounded list of short printable strings (names, terms)."""

    items: int
    chars: int

    def ok(self, value: Any) -> bool:
        return len(value) <= self.items and all(
            0 < len(v.strip()) <= self.chars and not CONTROL_CHARACTER.search(v) for v in value)

    def __str__(self) -> str:
        return f"a list of at most {self.items} strings of 1..{self.chars} characters, no control characters"


def opt(default: Any = None, rule: Rule | None = None, **meta: Any) -> Any:
    """A config field: its default and the rule its value must follow. Meta keys: `live`
    (SIGHUP applies it to a running daemon), `credential` (looked up in $CREDENTIALS_DIRECTORY)."""
    return field(default=default, metadata={"rule": rule, **meta})


def section(cls: type) -> Any:
    return field(default_factory=cls)


# The allowed values of string keys, declared once: the key tree below checks them, and the
# modules that act on a key or offer it on the command line use these names.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
INPUT_SOURCES = ("mic", "file", "stdin", "none")
VAD_DETECTORS = ("webrtc", "silero", "ten")
TASKS = ("transcribe", "translate")
ENCODER_BACKENDS = ("auto", "onnx", "hailo")
PRECISIONS = ("int8", "fp32")
PROJECTIONS = ("full", "shortlist")
HAILO_SCHEDULERS = ("round_robin", "none")
DECODER_PRESETS = ("conservative", "balanced", "aggressive")
GATE_FAILURE_ACTIONS = ("drop", "retry", "keep")
DEVICE_ID = Matches(r"[A-Za-z0-9_-]{1,64}", "[A-Za-z0-9_-]+, at most 64 characters")
THREADS = Range(1, 64)  # more intra-op threads than this only contend (a Pi 5 has 4 cores)
SECONDS_UP_TO_AN_HOUR = Range(0, 3600, lo_open=True)  # waits and bounds; beyond, a timeout overflows
# MQTT strings (RFC: UTF-8 without U+0000, control characters SHOULD NOT appear); topics must
# not hold the wildcards nor start with $ (the broker's own topics)
TOPIC_PART = Matches(r"(?!\$)[^#+\x00-\x1f\x7f]{1,256}", "1..256 characters, no # or +, no control "
                     "characters, not starting with $")
# MQTT 5 guarantees only 23 bytes; brokers differ beyond that (AWS IoT: 128), so 128 characters
# of printable text: "edgeasr-" and the longest device_id fit
CLIENT_ID = Matches(r"[^\x00-\x1f\x7f]{1,128}", "1..128 characters, no control characters")
PRINTABLE = Matches(r"[^\x00-\x1f\x7f]{1,256}", "1..256 characters, no control characters")
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")
# the allow-list's default: loopback and the private LAN ranges, as the README recommends
PRIVATE_NETWORKS = ("127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                    "fc00::/7", "fe80::/10")
# the home's vocabulary: names and terms a command may say (edgeasr/home reads the home file
# with the same limits)
VOCABULARY_ITEMS = 1000
VOCABULARY_CHARS = 200
# Home Assistant's websocket API: ws(s)://HOST[:PORT][/PATH]; http(s):// is taken as ws(s)://
HOMEASSISTANT_URL = Matches(r"(wss?|https?)://[^\s/@?#]{1,253}(/[^\s?#]*)?",
                            "ws://HOST:8123 or wss://HOST (http:// and https:// are taken as ws:// and "
                            "wss://), no user name or query")
UNIX_PATH_MAX = 107  # bytes in sockaddr_un.sun_path, less the terminating NUL


def default_device_id() -> str:
    name = socket.gethostname().split(".")[0]
    return re.sub(r"[^A-Za-z0-9_-]", "-", name)[:64] or "edgeasr"


def default_state_dir() -> Path:
    # systemd's StateDirectory= may list several directories, separated by ':'
    env = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return Path(env) if env else Path.home() / ".local" / "state" / "edgeasr"


# --- the key tree, in audio-flow order --------------------------------------------------


@dataclass(frozen=True)
class LogConfig:
    level: str = opt("INFO", OneOf(LOG_LEVELS), live=True)
    transcripts: bool = opt(False, live=True)  # transcripts at INFO (else DEBUG only)


@dataclass(frozen=True)
class InputConfig:
    source: str = opt("mic", OneOf(INPUT_SOURCES))
    path: Path | None = opt(None)
    realtime: bool = opt(False)
    device: int | str | None = opt(None)
    samplerate: int | None = opt(None, Range(1000, 384_000))
    block_ms: int = opt(30, Range(1, 1000))
    ring_s: float = opt(2.0, Range(0, 60, lo_open=True))


@dataclass(frozen=True)
class VadOptions:
    aggressiveness: int = opt(2, Range(0, 3))
    frame_ms: int = opt(30, OneOf((10, 20, 30)))
    pre_roll_ms: int = opt(300, Range(0, 10_000))
    hangover_ms: int = opt(900, Range(0, 10_000))
    min_speech_ms: int = opt(250, Range(0, 60_000))
    max_window_s: float | None = opt(None, Range(0, 30, lo_open=True))  # at most a Whisper window
    cut_search_s: float = opt(2.0, Range(0, 30, lo_open=True))
    cut_pause_ms: int = opt(300, Range(0, 10_000, lo_open=True))
    detector: str = opt("webrtc", OneOf(VAD_DETECTORS))
    threshold: float = opt(0.5, Range(0, 1, lo_open=True))  # silero, ten: speech probability


@dataclass(frozen=True)
class ModelConfig:
    path: Path | None = opt(None)
    language: str | None = opt(None, live=True)
    task: str = opt("transcribe", OneOf(TASKS), live=True)


@dataclass(frozen=True)
class EncoderConfig:
    backend: str = opt("auto", OneOf(ENCODER_BACKENDS))
    precision: str = opt("int8", OneOf(PRECISIONS))
    threads: int = opt(2, THREADS)
    hef: Path | None = opt(None)
    timeout_ms: int = opt(2000, Range(1, 600_000))
    scheduler: str = opt("round_robin", OneOf(HAILO_SCHEDULERS))
    service_group: str | None = opt(None, PRINTABLE)
    max_failures: int = opt(5, Range(1, 1000))
    reopen_timeout_s: float = opt(8.0, Range(0, 60))


@dataclass(frozen=True)
class DecoderConfig:
    # null (and the keys below left at null) = the values calibrated for the model bundle
    # (its manifest's `decoding` section; `edgeasr models calibrate`)
    preset: str | None = opt(None, OneOf(DECODER_PRESETS), live=True)
    precision: str = opt("int8", OneOf(PRECISIONS))
    threads: int = opt(2, THREADS)
    spin: bool = opt(False)
    # the vocabulary projection of a greedy step: the whole token table, or a first pass and the
    # exact logits of its best candidates, each window verified (a bundle imported --with shortlist)
    projection: str = opt("full", OneOf(PROJECTIONS))
    encoder_padding: int | None = opt(None, Range(0, 1500), live=True)
    repetition_penalty: float | None = opt(None, Range(1, 10), live=True)
    eos_threshold: float | None = opt(None, Range(0, 1, lo_open=True), live=True)
    condition_on_previous_text: bool | None = opt(None, live=True)
    max_tokens_per_s: float = opt(6.0, Range(0, 100, lo_open=True), live=True)
    logprob_threshold: float = opt(-1.0, Range(-100, 0), live=True)  # an average log-probability
    no_speech_threshold: float = opt(0.6, Range(0, 1), live=True)
    compression_ratio_threshold: float = opt(2.4, Range(0, 100, lo_open=True), live=True)
    # a window that fails a quality gate: decoded again at the fallback temperatures and its
    # best attempt kept unless it is silence (retry, as openai and faster-whisper do)
    on_gate_fail: str = opt("retry", OneOf(GATE_FAILURE_ACTIONS), live=True)
    fallback_temperature_step: float = opt(0.2, Range(0, 1, lo_open=True), live=True)
    beam_size: int = opt(1, Range(1, 5))  # 1: greedy; 2..5 hypotheses at temperature 0 (bundle --with beam)
    # judge words by the audio under them (the alignment heads): closing words with none at
    # the end of long audio are dropped, and a phrase repeated inside a segment is a loop
    # only without it (loads the alignment graph on first use; off: every such repeat is cut)
    drop_unspoken_words: bool = opt(True)


@dataclass(frozen=True)
class PipelineConfig:
    queue_s: float = opt(60.0, SECONDS_UP_TO_AN_HOUR)
    stop_deadline_s: float = opt(10.0, SECONDS_UP_TO_AN_HOUR)
    partial_interval_ms: int = opt(500, Range(0, 60_000))  # 0: no partial results
    speculate_after_ms: int | None = opt(300, Range(0, 10_000))  # null: no speculative decoding


@dataclass(frozen=True)
class WyomingConfig:
    uri: str | None = opt(None, Matches(r"(tcp://[^/:\x00-\x20]+:\d{1,5}|unix://[^\x00]+)",
                                        "tcp://HOST:PORT or unix://PATH"))
    zeroconf: str | None = opt(None, Matches(r"[^.\x00-\x1f\x7f]{1,63}", "a service name, no dots, at most 63 "
                                             "characters"))
    max_sessions: int = opt(4, Range(1, 64))
    max_audio_s: float = opt(30.0, Range(0, 600, lo_open=True))
    # open connections, sessions or not; beyond it, a connection without a session makes room
    max_connections: int = opt(16, Range(1, 256))
    allow: tuple[str, ...] = opt(PRIVATE_NETWORKS, Networks())  # client addresses served (tcp)
    # answer once the session's VAD has heard this much silence after speech, before audio-stop
    endpoint_ms: int | None = opt(None, Range(100, 10_000))


@dataclass(frozen=True)
class OutputConfig:
    stdout: bool | None = opt(None)
    words: bool = opt(False)  # word timestamps in transcripts (one more decoder run per window)
    intent: bool = opt(False)  # what a transcript asks of the home (Home Assistant's matcher), when it does


@dataclass(frozen=True)
class TlsConfig:
    enabled: bool | None = opt(None)
    ca: Path | None = opt(None)
    cert: Path | None = opt(None)
    key: Path | None = opt(None)


@dataclass(frozen=True)
class HomeAssistantConfig:
    discovery: bool = opt(False)
    prefix: str = opt("homeassistant", TOPIC_PART)


@dataclass(frozen=True)
class HermesConfig:
    enabled: bool = opt(False)
    site_id: str | None = opt(None, PRINTABLE)


@dataclass(frozen=True)
class MqttConfig:
    host: str | None = opt(None, Matches(r"[^\x00-\x20\x7f/]{1,253}", "a host name or address"))
    port: int = opt(1883, Range(1, 65535))
    topic_prefix: str = opt("edgeasr", TOPIC_PART)
    client_id: str | None = opt(None, CLIENT_ID)
    keepalive_s: int = opt(30, Range(1, 65535))  # MQTT's two-byte field
    session_expiry_s: int = opt(86400, Range(0, 2**32 - 1))  # MQTT 5's four-byte property
    reconnect_min_s: float = opt(1.0, SECONDS_UP_TO_AN_HOUR)
    reconnect_max_s: float = opt(60.0, SECONDS_UP_TO_AN_HOUR)
    username: str | None = opt(None, PRINTABLE)
    # a *relative* name is looked up in $CREDENTIALS_DIRECTORY first (LoadCredential=)
    password_file: Path | None = opt(None, credential=True)
    tls: TlsConfig = section(TlsConfig)
    metrics_interval_s: float = opt(60.0, Range(0, 86400))
    outbox_max: int = opt(10000, Range(1, 10_000_000))
    homeassistant: HomeAssistantConfig = section(HomeAssistantConfig)
    hermes: HermesConfig = section(HermesConfig)


@dataclass(frozen=True)
class VocabularyConfig:
    # the home file (YAML: language, areas, floors, entities; docs/vocabulary.md), re-read on SIGHUP
    home: Path | None = opt(None, live=True)
    names: tuple[str, ...] = opt((), Phrases(VOCABULARY_ITEMS, VOCABULARY_CHARS), live=True)
    terms: tuple[str, ...] = opt((), Phrases(VOCABULARY_ITEMS, VOCABULARY_CHARS), live=True)


@dataclass(frozen=True)
class HomeAssistantApiConfig:
    """Home Assistant's websocket API, read for the names of the home (not mqtt.homeassistant)."""

    url: str | None = opt(None, HOMEASSISTANT_URL)
    # a long-lived access token of an administrator; a *relative* name is looked up in
    # $CREDENTIALS_DIRECTORY first (LoadCredential=)
    token_file: Path | None = opt(None, credential=True)
    refresh_s: float = opt(300.0, Range(10, 86400))


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
    vocabulary: VocabularyConfig = section(VocabularyConfig)
    homeassistant: HomeAssistantApiConfig = section(HomeAssistantApiConfig)


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
    data = parse_yaml(text, path, "config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping of keys")
    return data


def parse_yaml(text: str, path: Path, named: str) -> Any:
    """YAML `text` read from `path`; a ConfigError "{named} {path}:{line}: invalid YAML (...)"."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or exc
        raise ConfigError(f"{named} {where}: invalid YAML ({problem})") from None
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits, nesting too deep
        raise ConfigError(f"{named} {path}: invalid YAML ({type(exc).__name__}: {str(exc)[:120]})") from None


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
        raise ConfigError(f"{key}: {_shown(value)} is not allowed ({_describe(kinds, meta)})")
    rule: Rule | None = meta.get("rule")
    if rule is not None and not rule.ok(converted):
        raise ConfigError(f"{key}: {_shown(value)} is not allowed ({rule})")
    if isinstance(converted, Path):
        return paths.resolve(key, converted, bool(meta.get("credential")))
    return converted


def _shown(value: Any, limit: int = 80) -> str:
    """repr(value), cut short: the error stays one readable line whatever was given."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _convert(value: Any, kind: Any) -> Any:
    """`value` as `kind`, or None when it is not one (bool is never a number here)."""
    if kind is bool:
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if kind is int:
        return value if isinstance(value, int) else None
    if kind is float:
        # NaN passes every comparison a Range makes, and inf turns a limit off: never a value
        try:
            number = float(value) if isinstance(value, (int, float)) else None
        except OverflowError:  # an int too large for a float
            return None
        return number if number is not None and math.isfinite(number) else None
    if kind is str:
        return value if isinstance(value, str) else None
    if kind is Path:
        return Path(value) if isinstance(value, (str, Path)) and str(value) and "\0" not in str(value) else None
    if typing.get_origin(kind) is tuple:  # tuple[T, ...]: a YAML list
        (item, _) = typing.get_args(kind)
        if not isinstance(value, (list, tuple)):
            return None
        items = tuple(_convert(v, item) for v in value)
        return None if any(i is None for i in items) else items
    return None


_KIND_NAMES = {
    bool: "true/false",
    int: "an integer",
    float: "a finite number",
    str: "a string",
    Path: "a path",
    type(None): "null",
}


def _describe(kinds: tuple[Any, ...], meta: Mapping[str, Any]) -> str:
    rule = meta.get("rule")
    names = [
        str(rule) if rule is not None and k is not type(None) and k is not bool else _KIND_NAMES.get(k, "a list")
        for k in kinds
    ]
    return " or ".join(dict.fromkeys(names))


def _check_audio_file(key: str, path: Path) -> None:
    if _is_dir(key, path):
        raise MissingInputError(f"{key}: {path} is a directory, not an audio file")
    kind = special_file(path)
    if kind is not None:
        raise MissingInputError(f"{key}: {path} is {kind}, not an audio file")
    if not path.is_file():
        raise MissingInputError(f"{key}: {path} does not exist")


_SPECIAL_FILES = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                  (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def special_file(path: Path) -> str | None:
    """What `path` is when it exists but is neither a regular file nor a directory (a device
    reads forever or not at all, a FIFO blocks): "a character device", ...; else None."""
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):
        return None
    return next((name for test, name in _SPECIAL_FILES if test(mode)), None)


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
    if cfg.mqtt.password_file is not None and not cfg.mqtt.username:
        raise ConfigError("mqtt.password_file: set, but mqtt.username is not")
    if cfg.encoder.service_group and cfg.encoder.scheduler == "none":
        raise ConfigError("encoder.service_group: needs encoder.scheduler round_robin (hailort.service "
                          "shares the chip through its scheduler)")
    if cfg.wyoming.max_sessions > cfg.wyoming.max_connections:
        raise ConfigError(f"wyoming.max_sessions: {cfg.wyoming.max_sessions} is not allowed (at most "
                          f"wyoming.max_connections, {cfg.wyoming.max_connections})")
    if cfg.wyoming.uri:
        _check_wyoming_uri(cfg.wyoming.uri)
    if cfg.homeassistant.url and cfg.homeassistant.token_file is None:
        raise ConfigError("homeassistant.token_file: required when homeassistant.url is set (a long-lived "
                          "access token)")
    if cfg.homeassistant.token_file is not None and not cfg.homeassistant.url:
        raise ConfigError("homeassistant.token_file: set, but homeassistant.url is not")


def _check_wyoming_uri(uri: str) -> None:
    """A TCP port that can be bound, a unix socket path that can be (never a file the
    server would have to delete to listen there)."""
    parsed = urlparse(uri)
    if parsed.scheme == "tcp":
        try:
            port = parsed.port
        except ValueError:
            port = None
        if not port:  # 0 would bind a port the kernel picks: nobody could find it
            raise ConfigError(f"wyoming.uri: {uri} is not allowed (a port 1..65535)")
        return
    path = Path(parsed.netloc + parsed.path)
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        raise ConfigError(f"wyoming.uri: {uri} is not allowed (a socket path of at most {UNIX_PATH_MAX} bytes)")
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"wyoming.uri: cannot look at {path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(mode):
        what = "a directory" if stat.S_ISDIR(mode) else special_file(path) or "a file"
        raise ConfigError(f"wyoming.uri: {path} exists and is {what}, not a socket (the server would have "
                          "to delete it): name a path that does not exist or holds a socket")


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
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        else:
            out[f.name] = str(value) if isinstance(value, Path) else value
    return out
