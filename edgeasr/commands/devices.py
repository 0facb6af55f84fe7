"""`edgeasr devices`: the audio input devices PortAudio sees (values for input.device)."""

from __future__ import annotations

import argparse
from typing import Any

from edgeasr.errors import DeviceError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "devices",
        help="list the audio input devices PortAudio sees (values for input.device)",
        description="List audio input devices: index, name, channels, default sample rate.",
    )
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from edgeasr.audio.capture import list_input_devices

    devices = list_input_devices()
    if not devices:
        raise DeviceError(
            "no audio input devices: PortAudio found none "
            "(microphone plugged in? user in group 'audio'?)"
        )
    print(f"{'index':>5}  {'channels':>8}  {'rate':>7}  name")
    for d in devices:
        mark = "  (default)" if d.is_default else ""
        rate = f"{d.default_samplerate:.0f}"
        print(f"{d.index:>5}  {d.channels:>8}  {rate:>7}  {d.name} [{d.hostapi}]{mark}")
    return 0
