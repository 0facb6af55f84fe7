"""`edgeasr check [--config FILE] [--set K=V] [--input FILE]`: validate the configuration, the
model bundle, the audio input, the Wyoming socket, state_dir, the broker, the home's vocabulary
and Home Assistant's names, one line each.

What passes `check` starts: every part is checked as the daemon will use it, and fails with
the exit code the daemon would exit with (a missing password file 66, an empty one 78, a
state_dir that cannot be written 73, ...).

No side effects: nothing is written, published or captured; the broker is only probed with a
TCP connection; Home Assistant's names are read once, as the daemon reads them (one that cannot
be read is reported, not a failure: the daemon runs on without its names and tries again); the
embedded default bundle is checked if it was prepared, and otherwise only its weights package is
looked for (the daemon prepares it at its first start). Every part is checked even after one
fails; the exit code is the first failure's.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from edgeasr.commands.common import load
from edgeasr.config import Config
from edgeasr.errors import ConfigError, EdgeAsrError, OutputError


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="validate the config, bundle, audio input and broker")
    p.set_defaults(func=main)


def check_model(cfg: Config) -> str:
    from edgeasr.bundle import load_bundle
    from edgeasr.daemon import window_s
    from edgeasr.models.default import default_dir, prepared_default

    path = cfg.model.path or prepared_default(cfg.state_dir)
    if path is None:
        return f"ok (the embedded default, prepared at the first start in {default_dir(cfg.state_dir)})"
    bundle = load_bundle(path, verify_checksums=True)
    window = window_s(cfg, bundle)
    if cfg.input.source != "none":  # the segmenter's limits against the window (vad.*)
        from edgeasr.audio.clock import StreamClock
        from edgeasr.audio.segmenter import Segmenter

        Segmenter(cfg.vad, window, StreamClock())
    return f"ok ({bundle.name}, {bundle.audio.window_s:g} s window, {path})"


def check_input(cfg: Config) -> str:
    if cfg.input.source == "mic":
        from edgeasr.audio.capture import import_sounddevice, resolve_device

        return f"ok (microphone {resolve_device(import_sounddevice(), cfg.input.device).name})"
    if cfg.input.source == "none":
        return "none: a Wyoming server only"
    if cfg.input.source == "file" and cfg.input.path is not None:
        from edgeasr.audio.files import inspect_file

        return f"ok (file {cfg.input.path}), {inspect_file(cfg.input.path)}"
    return f"ok ({cfg.input.source} {cfg.input.path or ''})".replace(" )", ")")


def check_wyoming(cfg: Config) -> str:
    """The server's package and its socket: a unix socket's directory must take the socket (the
    config already refused a path holding anything but a socket)."""
    uri = cfg.wyoming.uri
    if not uri:
        return "off"
    try:
        import wyoming.event  # noqa: F401
    except ImportError as exc:
        from edgeasr.errors import ToolMissingError

        raise ToolMissingError(f"wyoming.uri is set but the Wyoming server cannot load ({exc}): "
                               "pip install 'wyoming>=1.10,<1.11' zeroconf") from exc
    w = cfg.wyoming
    limits = f"{w.max_connections} connections, {w.max_sessions} sessions, {w.max_audio_s:g} s of audio each"
    parsed = urlparse(uri)
    if parsed.scheme == "unix":
        folder = Path(parsed.netloc + parsed.path).parent
        if not folder.is_dir():
            raise OutputError(f"wyoming.uri: the socket's directory {folder} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise OutputError(f"wyoming.uri: the socket cannot be created in {folder} (not writable)")
        return f"ok ({uri}; {limits})"
    _check_local_host(parsed.hostname or "")
    allow = ", ".join(w.allow) or "nobody (wyoming.allow is empty)"
    return f"ok ({uri}; clients from {allow}; {limits})"


def _check_local_host(host: str) -> None:
    """The host must be an address of this machine (bound here on a port the kernel picks,
    closed at once): whether the port itself is free can only be known when the daemon binds."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"wyoming.uri: cannot resolve {host!r} ({exc})") from exc
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind(address)
            except OSError as exc:
                raise ConfigError(f"wyoming.uri: cannot listen on {host}: {exc.strerror or exc} (not an "
                                  "address of this machine?)") from exc


def check_state_dir(cfg: Config) -> str:
    """What the daemon writes there: the outbox (with a broker), the default bundle's cache."""
    from edgeasr.output.outbox import check_state_dir as writable

    if not cfg.mqtt.host and cfg.model.path is not None:
        return f"not used ({cfg.state_dir})"
    return f"ok ({cfg.state_dir}, {writable(cfg.state_dir)})"


def check_broker(cfg: Config) -> str:
    from edgeasr.errors import DeviceError

    if not cfg.mqtt.host:
        return "none: transcripts go to stdout"
    # the client as the daemon makes it: the password file read, the TLS files loaded
    from edgeasr.output.paho_client import make_client

    make_client(cfg.mqtt, cfg.mqtt.client_id or f"edgeasr-{cfg.device_id}", will_topic="check", will="",
                max_queued=1)
    try:
        with socket.create_connection((cfg.mqtt.host, cfg.mqtt.port), timeout=3):
            pass
    except OSError as exc:
        raise DeviceError(f"mqtt.host: cannot reach {cfg.mqtt.host}:{cfg.mqtt.port} "
                          f"({exc.strerror or exc})") from exc
    return f"ok (reachable at {cfg.mqtt.host}:{cfg.mqtt.port})"


def check_vocabulary(cfg: Config) -> str:
    """The home file loaded as the daemon loads it (missing 66, bad 78)."""
    from edgeasr.home.names import vocabulary_from_config

    vocabulary = vocabulary_from_config(cfg.vocabulary)
    if not vocabulary:
        return "none"
    kinds = [n.kind for n in vocabulary.names]
    counts = ", ".join(f"{kinds.count(kind)} {label}" for kind, label in (
        ("area", "areas"), ("floor", "floors"), ("entity", "entities"), ("name", "names")) if kind in kinds)
    home = f"home {cfg.vocabulary.home}: " if cfg.vocabulary.home is not None else ""
    return f"ok ({home}{counts or 'no names'}; {len(vocabulary.terms)} terms)"


def check_homeassistant(cfg: Config) -> str:
    """The token file read as the daemon reads it (missing 66, empty 78), then one fetch."""
    from edgeasr.home.homeassistant import HomeAssistantError, HomeAssistantNames

    names = HomeAssistantNames.from_config(cfg.homeassistant)
    if names is None:
        return "off"
    try:
        fetched = names.fetch(timeout_s=5)
    except HomeAssistantError as exc:
        return (f"not read ({names.url}: {exc}); the daemon starts without its names and tries again every "
                f"{names.refresh_s:g} s")
    kinds = [n.kind for n in fetched.names]
    return (f"ok ({names.url}: {kinds.count('entity')} entities exposed to Assist, {kinds.count('area')} areas, "
            f"{kinds.count('floor')} floors)")


CHECKS: tuple[tuple[str, Callable[[Config], str]], ...] = (
    ("model", check_model), ("audio input", check_input), ("wyoming", check_wyoming),
    ("state_dir", check_state_dir), ("broker", check_broker), ("vocabulary", check_vocabulary),
    ("home assistant", check_homeassistant))


def combination_warnings(cfg: Config) -> list[str]:
    """What combinations of keys will do when it is not what they ask for (config_warnings),
    with the bundle's window and languages when its manifest can be read (the model check
    reports a bundle that cannot)."""
    from edgeasr.bundle import load_bundle
    from edgeasr.config_warnings import config_warnings
    from edgeasr.daemon import bundle_facts
    from edgeasr.models.default import prepared_default

    path = cfg.model.path or prepared_default(cfg.state_dir)
    try:
        bundle = load_bundle(path) if path is not None else None
    except EdgeAsrError:
        bundle = None
    return config_warnings(cfg, bundle_facts(cfg, bundle))


def main(args: argparse.Namespace) -> int:
    cfg = load(args)  # a bad key stops here: nothing else can be checked without the config
    print(f"config: ok ({args.config or 'defaults'})")
    for line in combination_warnings(cfg):  # the daemon starts all the same, and logs them
        print(f"warning: {line}")
    failure: EdgeAsrError | None = None
    for name, check in CHECKS:
        try:
            print(f"{name}: {check(cfg)}")
        except EdgeAsrError as exc:
            print(f"{name}: FAILED: {exc}")
            failure = failure or exc
    if failure is not None:
        print(f"edgeasr: {failure}", file=sys.stderr)
        return failure.exit_code
    return 0
