"""`edgeasr check [--config FILE] [--set K=V] [--input FILE]`: validate the configuration, the
model bundle, the audio input and the broker, one line each.

No side effects: nothing is written, published or captured; the broker is only probed with a
TCP connection; the embedded default bundle is checked if it was prepared, and otherwise only
its weights package is looked for (the daemon prepares it at its first start). Every part is
checked even after one fails; the exit code is the first failure's.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Callable

from edgeasr.commands.common import load
from edgeasr.config import Config
from edgeasr.errors import EdgeAsrError


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
    window_s(cfg, bundle)
    return f"ok ({bundle.name}, {bundle.audio.window_s:g} s window, {path})"


def check_input(cfg: Config) -> str:
    if cfg.input.source == "mic":
        from edgeasr.audio.capture import import_sounddevice, resolve_device

        return f"ok (microphone {resolve_device(import_sounddevice(), cfg.input.device).name})"
    if cfg.input.source == "none":
        return "none: a Wyoming server only"
    return f"ok ({cfg.input.source} {cfg.input.path or ''})".replace(" )", ")")


def check_broker(cfg: Config) -> str:
    from edgeasr.errors import DeviceError

    if not cfg.mqtt.host:
        return "none: transcripts go to stdout"
    try:
        with socket.create_connection((cfg.mqtt.host, cfg.mqtt.port), timeout=3):
            pass
    except OSError as exc:
        raise DeviceError(f"mqtt.host: cannot reach {cfg.mqtt.host}:{cfg.mqtt.port} "
                          f"({exc.strerror or exc})") from exc
    return f"ok (reachable at {cfg.mqtt.host}:{cfg.mqtt.port})"


CHECKS: tuple[tuple[str, Callable[[Config], str]], ...] = (
    ("model", check_model), ("audio input", check_input), ("broker", check_broker))


def main(args: argparse.Namespace) -> int:
    cfg = load(args)  # a bad key stops here: nothing else can be checked without the config
    print(f"config: ok ({args.config or 'defaults'})")
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
