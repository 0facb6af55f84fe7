"""`edgeasr bench-wyoming --dataset DIR --server NAME=URI ...`: Wyoming speech-to-text servers
side by side, as Home Assistant's Assist pipeline uses them (evaluation/wyoming_servers.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("bench-wyoming", help="Wyoming STT servers side by side on an audio set")
    p.add_argument("--dataset", type=Path, required=True, metavar="DIR", help="a directory with manifest.tsv")
    p.add_argument("--server", action="append", required=True, metavar="NAME=URI",
                   help="a server to measure, e.g. edgeasr=tcp://127.0.0.1:10300 (repeatable)")
    p.add_argument("--realtime", action="store_true", help="send audio at real time, as a microphone does")
    p.add_argument("--trailing-s", type=float, default=0.7,
                   help="silence after each utterance before audio-stop (default 0.7)")
    p.add_argument("--partial-min-s", type=float, default=3.0,
                   help="utterances longer than this count for the time to the first partial")
    p.add_argument("--home", type=Path, default=None, metavar="FILE",
                   help="send every name of this home file (entities and their aliases, areas, floors) "
                        "as each request's transcript_names")
    p.add_argument("--limit", type=int, default=0, help="only the first N utterances")
    p.add_argument("--load", default="idle", metavar="LOAD",
                   help="neighbour processes beside the servers for the whole run: idle, busy1 (a spinner on the "
                   "first core), busy2 (one on each of two), wakeful (wakes every 5 ms, works 1 ms)")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.json")
    p.set_defaults(func=main)


def _servers(specs: list[str]) -> dict[str, str]:
    from edgeasr.errors import UsageError

    servers = {}
    for spec in specs:
        name, sep, uri = spec.partition("=")
        if not sep or not uri:
            raise UsageError(f"--server {spec}: expected NAME=URI")
        servers[name] = uri
    return servers


def main(args: argparse.Namespace) -> int:
    from edgeasr.errors import UsageError
    from edgeasr.lab.evaluation.load import Neighbours, parse_loads
    from edgeasr.lab.evaluation.wyoming_servers import run

    servers = _servers(args.server)
    loads = parse_loads(args.load)
    if len(loads) != 1:
        raise UsageError(f"--load {args.load}: one load for the whole run")
    load = loads[0]
    with Neighbours([load]) as neighbours:
        neighbours.use(load)
        report = run(args, servers)
    report["load"] = load
    results = report.pop("results")
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps({**report, "results": results}, indent=2) + "\n")
    return 0
