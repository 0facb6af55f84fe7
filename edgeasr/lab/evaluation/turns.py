"""Rows that take turns on every utterance, under each load asked for (`edgeasr bench`'s
interleaved pair, `--load`): a busy spell of the machine slows both rows alike, and the loads
take turns too, so that a drift of the machine's own work spreads over all of them."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Sequence

from edgeasr.lab.evaluation.cpu_groups import CpuGroups
from edgeasr.lab.evaluation.load import Neighbours

OURS, THEIRS = "10s-int8", "faster-whisper"
NO_LOAD = ("idle",)


def interleaved(commands: dict[str, list[str]], count: int, loads: Sequence[str] = NO_LOAD,
                groups: CpuGroups | None = None) -> dict:
    """Each row's process (by its command line, serving as `bench_rows.serve_row` does) on
    every utterance, under every load in turn; which row goes first alternates. `groups`: our
    row, the peer's and the neighbours each in its cpu cgroup ("ours", "peer", "neighbours")."""
    rows = tuple(commands)
    procs = {row: subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for row, cmd in commands.items()}
    if groups is not None:
        for row, proc in procs.items():
            groups.place("ours" if row == OURS else "peer", proc.pid)

    def ask(row: str, index: int | None) -> dict:
        proc = procs[row]
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None  # PIPE
        if index is not None:
            proc.stdin.write(f"{index}\n")
            proc.stdin.flush()
        answer = proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"{row}: {proc.stderr.read().strip()[-300:]}")
        return json.loads(answer)

    try:
        for row in rows:
            hello = ask(row, None)
            if "skipped" in hello:
                return {"skipped": f"{row}: {hello['skipped']}"}
            ask(row, 0)  # warm-up, not counted
        pairs = []
        with Neighbours(list(loads)) as neighbours:
            if groups is not None:
                for neighbour in neighbours.procs.values():
                    groups.place("neighbours", neighbour.pid)
            for i in range(count):
                for j in range(len(loads)):
                    load = loads[(i + j) % len(loads)]
                    neighbours.use(load)
                    order = rows if (i + j) % 2 == 0 else rows[::-1]
                    pairs.append({"load": load, **{row: ask(row, i)["total_ms"] for row in order}})
                print(f"bench: {i + 1}/{count}", file=sys.stderr, end="\r")
            print(file=sys.stderr)
    except (RuntimeError, OSError) as exc:
        return {"skipped": f"failed: {exc}"}
    finally:
        for proc in procs.values():
            proc.communicate(timeout=60)  # closes stdin, waits, drains and closes the pipes
    return {"pairs": pairs}


def summarize_pair(pairs: list[dict]) -> dict:
    """Our default against faster-whisper: medians and the median of per-utterance ratios."""
    ours = [p[OURS] for p in pairs]
    theirs = [p[THEIRS] for p in pairs]
    return {
        "utterances": len(ours),
        "ours_ms_median": round(statistics.median(ours), 1),
        "faster_whisper_ms_median": round(statistics.median(theirs), 1),
        "ratio_median": round(statistics.median(t / o for o, t in zip(ours, theirs)), 2),
    }


def summarize_interleaved(data: dict) -> dict:
    """The pair under the first load (no load unless `--load` asked for others)."""
    if "skipped" in data:
        return {"skipped": data["skipped"]}
    first = data["pairs"][0]["load"]
    return summarize_pair([p for p in data["pairs"] if p["load"] == first])


def summarize_loads(data: dict) -> dict:
    """Per load: the pair's medians, each engine's slowdown against the first load (its
    median over the first load's), and faster-whisper's median over ours."""
    if "skipped" in data:
        return {"skipped": data["skipped"]}
    loads = list(dict.fromkeys(p["load"] for p in data["pairs"]))
    out = {load: summarize_pair([p for p in data["pairs"] if p["load"] == load]) for load in loads}
    base = out[loads[0]]
    for summary in out.values():
        summary["ours_slowdown"] = round(summary["ours_ms_median"] / base["ours_ms_median"], 2)
        summary["faster_whisper_slowdown"] = round(
            summary["faster_whisper_ms_median"] / base["faster_whisper_ms_median"], 2)
        summary["ratio_of_medians"] = round(summary["faster_whisper_ms_median"] / summary["ours_ms_median"], 2)
    return out
