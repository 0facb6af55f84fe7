"""The parent process of `edgeasr bench`: each row in a child process of its own (so that its
peak RSS is its own), our default and faster-whisper also taking turns on every utterance, and
the rows' results summarized against the references."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
from contextlib import nullcontext
from typing import TYPE_CHECKING

from edgeasr.config import DECODER_PRESETS
from edgeasr.lab.evaluation.bench_rows import DECODER_ROWS, ROWS
from edgeasr.lab.evaluation.cpu_groups import DEFAULT_WEIGHT, CpuGroups, parse_weight
from edgeasr.lab.evaluation.load import parse_loads
from edgeasr.lab.evaluation.runs import row_config
from edgeasr.lab.evaluation.turns import OURS, THEIRS, interleaved, summarize_interleaved, summarize_loads

if TYPE_CHECKING:
    from edgeasr.lab.evaluation.scoring import Scorer


def run(args) -> dict:
    """Every row asked for, each preset's row and the interleaved pair: the report."""
    from edgeasr.lab.evaluation.scoring import Scorer, read_entries
    from edgeasr.models.default import open_bundle

    loads = parse_loads(args.load) if args.load else ["idle"]
    weight = parse_weight(args.cpu_weight) if args.cpu_weight is not None else None
    bundle = open_bundle(row_config(args, {}))  # prepares the default bundle once, before the children
    args.model = args.model or bundle.root
    entries = read_entries(args.set_dirs, args.limit)
    scorer = Scorer(entries, bundle.audio.window_s, language=row_config(args, {}).model.language or "en")
    report = {"date": dt.date.today().isoformat(),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
              "threads": args.threads, "model": bundle.name, "utterances": len(entries),
              "rows": {}, "presets": {}, "load_average_1min": {"start": os.getloadavg()[0]}}
    for row in [r for r in args.rows.split(",") if r]:
        print(f"bench: {ROWS.get(row, row)} ...", file=sys.stderr)
        report["rows"][row] = summarize(_child(args, row), scorer)
        report["rows"][row]["bytes_per_token"] = _bytes(bundle, args, row, report["rows"][row])
    if not args.no_presets:
        for preset in DECODER_PRESETS:
            print(f"bench: preset {preset} ...", file=sys.stderr)
            report["presets"][preset] = summarize(_child(args, "10s-int8", preset), scorer)
    ours, fw = report["rows"].get(OURS, {}), report["rows"].get(THEIRS, {})
    if "total_ms_median" in ours and "total_ms_median" in fw:
        report["ratios"] = {"faster-whisper median / ours": round(fw["total_ms_median"] / ours["total_ms_median"], 2)}
        print(f"bench: ours and faster-whisper, interleaved, under {', '.join(loads)} ...", file=sys.stderr)
        groups = None if weight is None else CpuGroups(
            {"ours": weight, "peer": DEFAULT_WEIGHT, "neighbours": DEFAULT_WEIGHT})
        with groups or nullcontext():
            turns = interleaved({row: _child_cmd(args, row) + ["--serve"] for row in (OURS, THEIRS)},
                                len(entries), loads, groups)
        if weight is not None:
            report["cpu_weight"] = {"ours": weight, "faster-whisper and the neighbours": DEFAULT_WEIGHT}
        pair = summarize_interleaved(turns)
        report["interleaved"] = pair
        if args.load:
            report["load"] = summarize_loads(turns)
        if "ratio_median" in pair:
            report["ratios"]["faster-whisper median / ours, interleaved"] = round(
                pair["faster_whisper_ms_median"] / pair["ours_ms_median"], 2)
            report["ratios"]["faster-whisper / ours, interleaved, median of per-utterance ratios"] = (
                pair["ratio_median"])
    report["load_average_1min"]["end"] = os.getloadavg()[0]
    return report


def summarize(data: dict, scorer: Scorer) -> dict:
    if "skipped" in data:
        return {"skipped": data["skipped"]}
    res = data["results"]
    hyps = [r["text"] for r in res]
    totals = sorted(r["total_ms"] for r in res)

    def med(key):
        vals = [r[key] for r in res if r[key] is not None]
        return round(statistics.median(vals), 1) if vals else None

    steps = sum(r["steps"] or 0 for r in res)
    dec = sum(r["decoder_ms"] or 0 for r in res)
    windows = sum(r["windows"] or 0 for r in res)
    per_window = sorted(r["encoder_ms"] / r["windows"] for r in res if r["windows"])
    score = scorer.score(hyps)
    return {
        "utterances": len(res),
        "encoder_ms_median": med("encoder_ms"), "decoder_ms_median": med("decoder_ms"),
        "encoder_ms_per_window": round(statistics.median(per_window), 1) if windows else None,
        "total_ms_median": round(statistics.median(totals), 1),
        "total_ms_p90": round(totals[min(len(totals) - 1, int(0.9 * len(totals)))], 1),
        "cpu_ms_median": med("cpu_ms"),
        "decoder_ms_per_token": round(dec / steps, 2) if steps else None,
        "decoder_ms_per_token_median": round(statistics.median(
            r["decoder_ms"] / r["steps"] for r in res), 2) if steps else None,
        "windows": windows or None, "decoder_steps": steps or None,
        "wer": round(score.wer, 4), "cer": round(score.cer, 4),
        "substitutions": score.substitutions, "deletions": score.deletions, "insertions": score.insertions,
        "empty": score.empty,
        "groups": {name: {"wer": round(g.wer, 4), "cer": round(g.cer, 4), "deletions": g.deletions}
                   for name, g in scorer.per_group(hyps).items()},
        "runaway_windows": sum(r["runaway"] for r in res),
        **({"shortlist_steps": sum(r["shortlist_steps"] for r in res),
            "shortlist_rollbacks": sum(r["shortlist_rollbacks"] for r in res)} if res and "shortlist_steps" in res[0]
           else {}),
        "peak_rss_mb": round(data["peak_rss_mb"], 1),
    }


def _bytes(bundle, args, row: str, summary: dict) -> dict | None:
    """The row's bytes read per token (evaluation/token_bytes.py), for our rows that decode on the CPU."""
    from edgeasr.lab.evaluation.token_bytes import token_bytes

    if row not in DECODER_ROWS or "skipped" in summary or not summary.get("windows"):
        return None
    decoder = row_config(args, {}).decoder
    precision = "fp32" if row == "30s-fp32" else decoder.precision
    return token_bytes(bundle, precision, "full" if row == "30s-fp32" else decoder.projection,
                       summary["decoder_steps"] / summary["windows"]).as_dict()


def _child_cmd(args, row: str, preset: str | None = None) -> list[str]:
    config = ["--config", str(args.config)] if args.config else []
    sets = [arg for item in args.set for arg in ("--set", item)]
    cmd = [sys.executable, "-m", "edgeasr", "--log-level", "WARNING", *config, *sets, "bench",
           *(arg for d in args.set_dirs for arg in ("--dataset", str(d))), "--threads", str(args.threads),
           "--limit", str(args.limit),
           "--row", row] + (["--preset", preset] if preset else [])
    return cmd + ["--model", str(args.model)] if args.model else cmd


def _child(args, row: str, preset: str | None = None) -> dict:
    out = subprocess.run(_child_cmd(args, row, preset), capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"skipped": f"failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"}
    return json.loads(out.stdout)
