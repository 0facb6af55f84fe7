"""Wyoming speech-to-text servers side by side, as Home Assistant's Assist pipeline uses them
(`edgeasr bench-wyoming`).

Each utterance of the set, followed by `--trailing-s` of silence (Home Assistant sends
`audio-stop` once its own VAD has heard that much), goes to every server in turn (the order
alternates, so a busy spell of the machine slows both alike), at real time or at once. Per
server: the time from `audio-stop` to `transcript` (median, p90), the WER and CER after
Whisper's English normalizer, and for utterances over `--partial-min-s` sent at real time, the
time from the first audio to the first `transcript-chunk`. With `--home FILE`, every request
carries that home's names as `transcript_names` (as a client that knows the home sends them), and
the report gives sentence accuracy too. `packaging/bench-wyoming.sh`
starts edgeasr and wyoming-faster-whisper on the same weights and runs this.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np

from edgeasr.lab.evaluation.runs import read_set


def _names(home: Path) -> list[str]:
    """Every way the home file names something, once each: what a Wyoming request may carry."""
    from edgeasr.home.names import load_home

    return list(dict.fromkeys(s for n in load_home(home, key="--home").names for s in n.spoken))


def _percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else None


def run(args, servers: dict[str, str]) -> dict:
    """Every utterance to every server in turn: the report, its `results` per server."""
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    from edgeasr.audio.files import load_audio
    from edgeasr.lab.evaluation.wyoming_client import request
    from edgeasr.stages import SAMPLE_RATE

    names = _names(args.home) if args.home else None
    utterances = read_set(args.dataset, args.limit)
    silence = np.zeros(int(args.trailing_s * SAMPLE_RATE), np.float32)
    results: dict[str, list[dict]] = {name: [] for name in servers}
    for i, u in enumerate(utterances):
        audio = np.concatenate([load_audio(args.dataset / u["file"], SAMPLE_RATE), silence])
        pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
        order = list(servers) if i % 2 == 0 else list(servers)[::-1]
        for name in order:
            reply = asyncio.run(request(servers[name], pcm, rate=SAMPLE_RATE, width=2, channels=1,
                                        chunk_s=0.1, realtime=args.realtime, names=names))
            results[name].append({"id": u["id"], "duration_s": float(u["duration_s"]), **vars(reply)})
        print(f"bench-wyoming: {i + 1}/{len(utterances)} {u['id']}", file=sys.stderr)
    norm = EnglishTextNormalizer()
    references = {u["id"]: norm(u["reference"]) for u in utterances}
    report: dict = {"utterances": len(utterances), "realtime": args.realtime, "trailing_s": args.trailing_s,
                    "transcript_names": len(names or ()), "servers": {}}
    for name, rows in results.items():
        ok = [r for r in rows if r["text"] is not None]
        stops = [r["stop_to_transcript_s"] * 1e3 for r in ok]
        firsts = [r["first_chunk_s"] * 1e3 for r in ok
                  if r["duration_s"] > args.partial_min_s and r["first_chunk_s"] is not None]
        report["servers"][name] = {
            "answered": len(ok), "errors": len(rows) - len(ok),
            "stop_to_transcript_ms_median": _percentile(stops, 0.5),
            "stop_to_transcript_ms_p90": _percentile(stops, 0.9),
            "first_partial_ms_median": _percentile(firsts, 0.5) if args.realtime else None,
            "utterances_with_partials": sum(1 for r in ok if r["chunks"]) if args.realtime else None,
            "wer": round(jiwer.wer([references[r["id"]] for r in ok], [norm(r["text"]) for r in ok]), 4),
            "cer": round(jiwer.cer([references[r["id"]] for r in ok], [norm(r["text"]) for r in ok]), 4),
            "sentence_accuracy": round(sum(norm(r["text"]) == references[r["id"]] for r in ok) / len(rows), 4),
        }
    return {**report, "results": results}
