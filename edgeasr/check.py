"""`edgeasr check --config FILE`: validate config, model bundle, audio device and broker.

No side effects: nothing is written, published or captured; the broker is only probed
with a TCP connection.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="validate the config, bundle, audio device and broker")
    p.add_argument("--config", type=Path, default=None, metavar="FILE")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from edgeasr.bundle import MANIFEST, load_bundle
    from edgeasr.config import load_config
    from edgeasr.daemon import window_s
    from edgeasr.engine import DEFAULT_PREFIX
    from edgeasr.errors import DeviceError, ModelError

    cfg = load_config(args.config)
    print(f"config: ok ({args.config or 'defaults'})")
    path = cfg.model.path
    if path is None:
        cached = sorted((cfg.state_dir / "models").glob(f"{DEFAULT_PREFIX}*/{MANIFEST}"))
        if not cached:
            raise ModelError("model.path: not set and the default bundle is not prepared yet "
                             f"(run edgeasr once, or `edgeasr models import` into {cfg.state_dir / 'models'})")
        path = cached[-1].parent
    bundle = load_bundle(path, verify_checksums=True)
    window_s(cfg, bundle)
    print(f"model: ok ({bundle.name}, {bundle.audio.window_s:g} s window, {path})")
    if cfg.input.source == "mic":
        from edgeasr.capture import import_sounddevice, resolve_device

        device = resolve_device(import_sounddevice(), cfg.input.device)
        print(f"audio device: ok ({device.name})")
    else:
        print(f"audio input: ok ({cfg.input.source} {cfg.input.path or ''})".rstrip())
    if cfg.mqtt.host:
        try:
            with socket.create_connection((cfg.mqtt.host, cfg.mqtt.port), timeout=3):
                pass
        except OSError as exc:
            raise DeviceError(f"mqtt.host: cannot reach {cfg.mqtt.host}:{cfg.mqtt.port} ({exc.strerror or exc})") from exc
        print(f"broker: reachable ({cfg.mqtt.host}:{cfg.mqtt.port})")
    return 0
