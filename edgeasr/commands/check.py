"""`edgeasr check [--config FILE] [--set K=V] [--input FILE]`: validate the configuration, the
model bundle, the audio input and the broker.

No side effects: nothing is written, published or captured; the broker is only probed with a
TCP connection; the default bundle is checked only if it was prepared.
"""

from __future__ import annotations

import argparse
import socket

from edgeasr.commands.common import load


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="validate the config, bundle, audio input and broker")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from edgeasr.bundle import load_bundle
    from edgeasr.daemon import window_s
    from edgeasr.errors import DeviceError, ModelError
    from edgeasr.models.default import models_dir, prepared_default

    cfg = load(args)
    print(f"config: ok ({args.config or 'defaults'})")
    path = cfg.model.path or prepared_default(cfg.state_dir)
    if path is None:
        raise ModelError("model.path: not set and the default bundle is not prepared yet "
                         f"(run edgeasr once, or `edgeasr models import` into {models_dir(cfg.state_dir)})")
    bundle = load_bundle(path, verify_checksums=True)
    window_s(cfg, bundle)
    print(f"model: ok ({bundle.name}, {bundle.audio.window_s:g} s window, {path})")
    if cfg.input.source == "mic":
        from edgeasr.audio.capture import import_sounddevice, resolve_device

        device = resolve_device(import_sounddevice(), cfg.input.device)
        print(f"audio device: ok ({device.name})")
    else:
        print(f"audio input: ok ({cfg.input.source} {cfg.input.path or ''})".rstrip())
    if cfg.mqtt.host:
        try:
            with socket.create_connection((cfg.mqtt.host, cfg.mqtt.port), timeout=3):
                pass
        except OSError as exc:
            raise DeviceError(f"mqtt.host: cannot reach {cfg.mqtt.host}:{cfg.mqtt.port} "
                              f"({exc.strerror or exc})") from exc
        print(f"broker: reachable ({cfg.mqtt.host}:{cfg.mqtt.port})")
    return 0
