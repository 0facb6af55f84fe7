"""The YAML configuration: the shipped file, defaults, and every kind of bad input."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
from pathlib import Path

import pytest
import yaml

from edgeasr.asr.decoding import PRESETS
from edgeasr.config import DECODER_PRESETS, Config, as_dict, load_config
from edgeasr.errors import ConfigError, MissingInputError
from edgeasr.reload import flatten, live_keys

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "config" / "edgeasr.yaml"


def write(tmp_path: Path, text: str, name: str = "edgeasr.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_file_and_dataclasses_cannot_drift():
    raw = yaml.safe_load(SHIPPED.read_text())

    def walk(obj: object, node: dict, prefix: str) -> None:
        fields = dataclasses.fields(obj)
        # same keys, same (audio-flow) order
        assert list(node) == [f.name for f in fields], prefix or "top level"
        for f in fields:
            value, key = getattr(obj, f.name), prefix + f.name
            if dataclasses.is_dataclass(value):
                walk(value, node[f.name], key + ".")
            elif f.default is dataclasses.MISSING:  # derived from the environment
                assert node[f.name] is None, f"{key}: the file leaves it null (= default)"
            else:
                assert node[f.name] == (list(value) if isinstance(value, tuple) else value), (
                    f"{key}: file says {node[f.name]!r}, default {value!r}"
                )

    walk(Config(), raw, "")
    assert load_config(SHIPPED) == Config()


def test_the_preset_names_config_allows_are_the_decoders_presets():
    assert list(DECODER_PRESETS) == list(PRESETS)


def test_every_key_in_the_shipped_file_has_a_comment():
    keyed = [m for m in (re.match(r"\s*(\w+):(.*)", line) for line in SHIPPED.read_text().splitlines())
             if m and m.group(2).strip()]  # a key with a value (sections have none)
    assert len(keyed) == len(flatten(as_dict(Config())))  # every key of the tree, once
    for m in keyed:
        assert "#" in m.group(2), f"no comment: {m.group(0)!r}"


def test_environment_derived_defaults(monkeypatch):
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/edgeasr:/var/lib/other")
    cfg = load_config(None)
    assert cfg.state_dir == Path("/var/lib/edgeasr")
    assert re.fullmatch(r"[A-Za-z0-9_-]+", cfg.device_id)
    assert cfg.device_id == re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0])
    monkeypatch.delenv("STATE_DIRECTORY")
    assert load_config(None).state_dir == Path.home() / ".local" / "state" / "edgeasr"


def test_values_are_typed_and_nested(tmp_path):
    path = write(
        tmp_path,
        "device_id: kitchen\nvad:\n  aggressiveness: 3\n  max_window_s: 8\n"
        "mqtt:\n  host: 127.0.0.1\n  tls:\n    ca: certs/ca.pem\n",
    )
    cfg = load_config(path)
    assert cfg.device_id == "kitchen"
    assert cfg.vad.aggressiveness == 3
    assert cfg.vad.max_window_s == 8.0 and isinstance(cfg.vad.max_window_s, float)
    assert cfg.mqtt.host == "127.0.0.1"
    assert cfg.mqtt.tls.ca == tmp_path / "certs" / "ca.pem"  # relative to the file
    assert cfg.mqtt.port == 1883  # untouched keys keep their defaults


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "mqtt:\n  prot: 1884\n",
            "mqtt.prot: unknown key (allowed: host, port, topic_prefix, client_id, keepalive_s, "
            "session_expiry_s, reconnect_min_s, reconnect_max_s, username, password_file, tls, "
            "metrics_interval_s, outbox_max, homeassistant, hermes)",
        ),
        (
            "mqtt:\n  tls:\n    cafile: x\n",
            "mqtt.tls.cafile: unknown key (allowed: enabled, ca, cert, key)",
        ),
        (
            "audio: {}\n",
            "audio: unknown key (allowed: device_id, state_dir, log, input, vad, model, "
            "encoder, decoder, pipeline, wyoming, output, mqtt, vocabulary, homeassistant)",
        ),
    ],
)
def test_unknown_keys(tmp_path, text, message):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert str(info.value) == message
    assert info.value.exit_code == 78


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("vad.aggressiveness", 7, "vad.aggressiveness: 7 is not allowed (0..3)"),
        ("vad.frame_ms", 25, "vad.frame_ms: 25 is not allowed (10, 20, 30)"),
        ("vad.detector", "cobra", "vad.detector: 'cobra' is not allowed (webrtc, silero, ten)"),
        ("vad.threshold", 0, "vad.threshold: 0 is not allowed (0 < x <= 1)"),
        ("mqtt.port", 0, "mqtt.port: 0 is not allowed (1..65535)"),
        ("mqtt.port", "1883", "mqtt.port: '1883' is not allowed (1..65535)"),
        ("mqtt.port", True, "mqtt.port: True is not allowed (1..65535)"),
        (
            "mqtt.topic_prefix",
            "home/#",
            "mqtt.topic_prefix: 'home/#' is not allowed (1..256 characters, no # or +, no control characters, "
            "not starting with $)",
        ),
        ("device_id", "living room", "device_id: 'living room' is not allowed ([A-Za-z0-9_-]+, at most 64 characters)"),
        ("encoder.backend", "cuda", "encoder.backend: 'cuda' is not allowed (auto, onnx, hailo)"),
        ("encoder.threads", 0, "encoder.threads: 0 is not allowed (1..64)"),
        ("decoder.eos_threshold", 0, "decoder.eos_threshold: 0 is not allowed (0 < x <= 1)"),
        ("decoder.encoder_padding", 2000, "decoder.encoder_padding: 2000 is not allowed (0..1500)"),
        ("decoder.on_gate_fail", "skip", "decoder.on_gate_fail: 'skip' is not allowed (drop, retry, keep)"),
        ("decoder.fallback_temperature_step", 0, "decoder.fallback_temperature_step: 0 is not allowed (0 < x <= 1)"),
        ("decoder.condition_on_previous_text", "yes",
         "decoder.condition_on_previous_text: 'yes' is not allowed (true/false or null)"),
        (
            "decoder.no_speech_threshold",
            1.5,
            "decoder.no_speech_threshold: 1.5 is not allowed (0..1)",
        ),
        ("input.ring_s", 0, "input.ring_s: 0 is not allowed (0 < x <= 60)"),
        ("vad.cut_pause_ms", 0, "vad.cut_pause_ms: 0 is not allowed (0 < x <= 10000)"),
        ("input.realtime", "yes", "input.realtime: 'yes' is not allowed (true/false)"),
        ("input.device", 1.5, "input.device: 1.5 is not allowed (an integer or a string or null)"),
        ("log.level", "debug", "log.level: 'debug' is not allowed (DEBUG, INFO, WARNING, ERROR)"),
        ("pipeline.queue_s", None, "pipeline.queue_s: null is not allowed (0 < x <= 3600)"),
        (
            "mqtt.reconnect_max_s",
            0.5,
            "mqtt.reconnect_max_s: 0.5 is not allowed (>= mqtt.reconnect_min_s, 1.0)",
        ),
        ("vad", 5, "vad: 5 is not a mapping of keys"),
        ("vocabulary.names", ["Kitchen", " "], "vocabulary.names: ['Kitchen', ' '] is not allowed (a list of at most "
         "1000 strings of 1..200 characters, no control characters)"),
        ("vocabulary.terms", "Zigbee", "vocabulary.terms: 'Zigbee' is not allowed (a list of at most 1000 strings of "
         "1..200 characters, no control characters)"),
        ("vocabulary.terms", ["a\nb"], "vocabulary.terms: ['a\\nb'] is not allowed (a list of at most 1000 strings "
         "of 1..200 characters, no control characters)"),
        ("homeassistant.url", "mqtt://ha.lan:8123", "homeassistant.url: 'mqtt://ha.lan:8123' is not allowed "
         "(ws://HOST:8123 or wss://HOST (http:// and https:// are taken as ws:// and wss://), no user name or query)"),
        ("homeassistant.refresh_s", 1, "homeassistant.refresh_s: 1 is not allowed (10..86400)"),
    ],
)
def test_bad_values_name_key_value_and_what_is_allowed(tmp_path, key, value, message):
    # the same value through the file and through an override
    *parents, leaf = key.split(".")
    text = yaml.safe_dump(_nest(parents, {leaf: value}))
    for load in (
        lambda: load_config(write(tmp_path, text)),
        lambda: load_config(None, {key: value}),
    ):
        with pytest.raises(ConfigError) as info:
            load()
        assert str(info.value) == message
        assert info.value.exit_code == 78


def _nest(parents: list[str], leaf: dict) -> dict:
    for name in reversed(parents):
        leaf = {name: leaf}
    return leaf


def test_invalid_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "log:\n  level: INFO\nvad:\n  aggressiveness: [2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"config file {path}:5: invalid YAML (")
    assert info.value.exit_code == 78


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match=r"the top level must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_empty_file_means_defaults(tmp_path):
    assert load_config(write(tmp_path, "# nothing set\n")) == Config()


def test_missing_config_file_is_missing_input(tmp_path):
    with pytest.raises(MissingInputError) as info:
        load_config(tmp_path / "nope.yaml")
    assert str(info.value) == f"config file {tmp_path / 'nope.yaml'}: does not exist"
    assert info.value.exit_code == 66


def test_unreadable_config_file_is_a_config_error(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match=rf"config file {re.escape(str(path))}: cannot read"):
        load_config(path)


def test_file_source_needs_an_existing_path(tmp_path):
    with pytest.raises(ConfigError, match=r"^input\.path: required when input\.source is file$"):
        load_config(write(tmp_path, "input:\n  source: file\n"))
    path = write(tmp_path, "input:\n  source: file\n  path: audio/missing.wav\n")
    with pytest.raises(MissingInputError) as info:
        load_config(path)
    assert str(info.value) == f"input.path: {tmp_path / 'audio' / 'missing.wav'} does not exist"
    assert info.value.exit_code == 66
    (tmp_path / "audio").mkdir()
    (tmp_path / "audio" / "missing.wav").write_bytes(b"")
    assert load_config(path).input.path == tmp_path / "audio" / "missing.wav"


def test_model_path_must_be_a_directory(tmp_path):
    with pytest.raises(MissingInputError) as info:
        load_config(write(tmp_path, "model:\n  path: bundles/tiny\n"))
    assert str(info.value) == f"model.path: {tmp_path / 'bundles' / 'tiny'} is not a directory"
    assert info.value.exit_code == 66


def test_overrides_apply_before_validation_and_resolve_against_cwd(tmp_path, monkeypatch):
    conf_dir, work = tmp_path / "etc", tmp_path / "work"
    conf_dir.mkdir()
    work.mkdir()
    (work / "x.wav").write_bytes(b"")
    path = write(conf_dir, "input:\n  source: file\n  path: nothere.wav\n")
    monkeypatch.chdir(work)
    cfg = load_config(
        path, {"input.path": "x.wav", "vad.aggressiveness": 1, "mqtt.tls.ca": "ca.pem"}
    )
    assert cfg.input.path == work / "x.wav"  # given on the command line: relative to cwd
    assert cfg.vad.aggressiveness == 1
    assert cfg.mqtt.tls.ca == work / "ca.pem"
    with pytest.raises(ConfigError, match=r"^vad\.agressiveness: unknown key"):
        load_config(None, {"vad.agressiveness": 1})


def test_password_file_uses_credentials_directory_and_is_never_rendered(tmp_path, monkeypatch):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "mqtt-password").write_text("s3cret-value\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    path = write(
        tmp_path, "mqtt:\n  host: 127.0.0.1\n  username: edge\n  password_file: mqtt-password\n"
    )
    cfg = load_config(path)
    assert cfg.mqtt.password_file == creds / "mqtt-password"
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    assert load_config(path).mqtt.password_file == tmp_path / "mqtt-password"  # beside the file
    rendered = json.dumps(as_dict(cfg))
    assert "s3cret-value" not in rendered
    assert as_dict(cfg)["mqtt"]["username"] == "edge"


def test_rendered_config_is_plain_data_that_loads_back(tmp_path):
    cfg = load_config(write(tmp_path, "device_id: hall\nmodel:\n  language: de\n"))
    data = as_dict(cfg)
    assert data["vad"]["aggressiveness"] == 2 and data["state_dir"] == str(cfg.state_dir)
    dumped = write(tmp_path, yaml.safe_dump(data), "dumped.yaml")
    assert load_config(dumped) == cfg


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"input.source": "none"}, "input.source: none leaves nothing to do without wyoming.uri"),
        ({"wyoming.uri": "http://x:1"}, "wyoming.uri: 'http://x:1' is not allowed (tcp://HOST:PORT or unix://PATH)"),
        ({"wyoming.uri": "unix:///run/e.sock", "wyoming.zeroconf": "kitchen"},
         "wyoming.zeroconf: needs wyoming.uri tcp://HOST:PORT"),
        ({"pipeline.speculate_after_ms": 900}, "pipeline.speculate_after_ms: 900 is not allowed (below vad.hangover_ms"),
        ({"wyoming.max_sessions": 0}, "wyoming.max_sessions: 0 is not allowed (1..64)"),
        ({"encoder.service_group": "shared", "encoder.scheduler": "none"},
         "encoder.service_group: needs encoder.scheduler round_robin"),
    ],
)
def test_front_end_keys_are_checked(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert str(info.value).startswith(message)


def test_a_server_only_daemon_is_a_valid_configuration():
    cfg = load_config(None, {"input.source": "none", "wyoming.uri": "tcp://0.0.0.0:10300",
                             "wyoming.zeroconf": "edgeasr-kitchen", "pipeline.speculate_after_ms": None})
    assert cfg.wyoming.uri == "tcp://0.0.0.0:10300" and cfg.pipeline.speculate_after_ms is None


def test_live_keys_are_what_a_reload_applies():
    """SIGHUP applies exactly the keys marked live; everything else waits for a restart."""
    from edgeasr.reload import changed_keys, with_live

    running = load_config(None, {})
    new = load_config(None, {"decoder.preset": "conservative", "decoder.threads": 1, "model.language": "de",
                             "log.level": "DEBUG"})
    applied = with_live(running, new)
    assert changed_keys(running, new) == ["log.level", "model.language", "decoder.preset", "decoder.threads"]
    assert changed_keys(applied, new) == ["decoder.threads"]  # a repeat reports only what still waits
    assert applied.decoder.threads == 2 and applied.decoder.preset == "conservative"
    assert set(live_keys()) >= {"model.language", "model.task", "decoder.encoder_padding", "log.level"}
    assert not set(live_keys()) & {"decoder.threads", "decoder.precision", "encoder.backend", "model.path"}


def test_every_live_engine_key_changes_the_running_engine():
    """The keys marked live under model and decoder are the ones a reload builds the running
    engine's variant with (engine.live_options): changing any of them changes what the engine
    decodes with, and changing a key that waits for a restart changes nothing."""
    import types

    from edgeasr.asr.decoding import DecodingOptions
    from edgeasr.asr.engine import EngineOptions, live_options

    values = {"model.language": "de", "model.task": "translate", "decoder.preset": "conservative",
              "decoder.encoder_padding": 1000, "decoder.repetition_penalty": 1.4, "decoder.eos_threshold": 0.9,
              "decoder.max_tokens_per_s": 3.0, "decoder.logprob_threshold": -2.0,
              "decoder.no_speech_threshold": 0.3, "decoder.compression_ratio_threshold": 3.0,
              "decoder.on_gate_fail": "keep", "decoder.condition_on_previous_text": True,
              "decoder.fallback_temperature_step": 0.5}
    engine_keys = [k for k in live_keys() if k.split(".")[0] in ("model", "decoder")]
    assert sorted(engine_keys) == sorted(values)

    def applied(cfg):
        bundle = types.SimpleNamespace(decoding={})  # uncalibrated
        return live_options(EngineOptions(DecodingOptions()), cfg.model, cfg.decoder, bundle)

    default = applied(load_config(None, {}))
    for key, value in values.items():
        assert applied(load_config(None, {key: value})) != default, key
    for key, value in {"decoder.beam_size": 3, "decoder.drop_unspoken_words": False, "decoder.threads": 1}.items():
        assert applied(load_config(None, {key: value})) == default, key


def _float_keys() -> list[str]:
    """Every key whose value is a float (optional or not), dotted."""
    import typing

    from edgeasr.reload import _leaves

    out = []
    for key, f in _leaves(Config):
        cls: type = Config
        for name in key.split(".")[:-1]:
            cls = typing.get_type_hints(cls)[name]
        kind = typing.get_type_hints(cls)[f.name]
        if float in (typing.get_args(kind) or (kind,)):
            out.append(key)
    return out


@pytest.mark.parametrize("key", _float_keys())
def test_every_float_key_refuses_nan_and_infinity(key):
    """NaN passes every comparison a Range makes and inf turns a limit off, so
    no float key takes them (nor an integer too large to be a float)."""
    for value in (float("nan"), float("inf"), float("-inf"), 10**400):
        with pytest.raises(ConfigError) as info:
            load_config(None, {key: value})
        assert str(info.value).startswith(f"{key}: ") and "is not allowed" in str(info.value)
        assert info.value.exit_code == 78


@pytest.mark.parametrize("key, top", [("mqtt.keepalive_s", 65535), ("mqtt.session_expiry_s", 2**32 - 1),
                                      ("mqtt.port", 65535), ("encoder.threads", 64), ("decoder.threads", 64),
                                      ("wyoming.max_connections", 256),
                                      ("pipeline.partial_interval_ms", 60_000), ("mqtt.outbox_max", 10**7)])
def test_integer_keys_stop_where_their_use_does(key, top):
    """What MQTT can carry (two and four bytes), what a Pi can run, what a socket can serve."""
    assert getattr(getattr(load_config(None, {key: top}), key.split(".")[0]), key.split(".")[1]) == top
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: {top + 1} is not allowed"):
        load_config(None, {key: top + 1})


def test_wyoming_allow_takes_a_list_of_networks():
    cfg = load_config(None, {"wyoming.allow": ["192.168.1.10", "fd00::/8"]})
    assert cfg.wyoming.allow == ("192.168.1.10", "fd00::/8")
    assert as_dict(cfg)["wyoming"]["allow"] == ["192.168.1.10", "fd00::/8"]
    for bad in ("192.168.1.0/24", ["not-an-address"], [24]):
        with pytest.raises(ConfigError, match=r"^wyoming\.allow: "):
            load_config(None, {"wyoming.allow": bad})
    with pytest.raises(ConfigError, match="wyoming.max_sessions: 8 is not allowed .at most wyoming.max_connections"):
        load_config(None, {"wyoming.max_sessions": 8, "wyoming.max_connections": 4})


def test_a_password_file_without_a_user_name_is_refused_at_load(tmp_path):
    secret = write(tmp_path, "pw\n", "pw")
    with pytest.raises(ConfigError, match="mqtt.password_file: set, but mqtt.username is not"):
        load_config(None, {"mqtt.host": "broker", "mqtt.password_file": str(secret)})
