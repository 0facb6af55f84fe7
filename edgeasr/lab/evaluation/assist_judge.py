"""What Home Assistant did with a clip, judged against what it does with the clip's reference
text said by the same device (the oracle), and the counts of a run.

Two runs did the same when the agent's answer is of the same type with the same targets and the
same spoken answer, the home's states changed the same way, and the satellite got the same timer
events. Time passes between the two runs, so a spoken answer is compared with its clock times
masked and, when it speaks of timers, by the timers it names (name, length, running or not),
not the time they have left; its numbers are compared as digits, since it echoes them as they
were said ("two minutes removed", "2 minutes removed"). Per clip:

- right: the same as the oracle;
- wrong: Home Assistant acted (or answered) otherwise than the oracle, or acted where the oracle
  does nothing (speech that is no command of this home became one): the worst outcome;
- none: it did nothing (an error, not understood) where the oracle acted;
- n/a: the oracle itself failed and so did the run, or the release lacks what the command needs
  (timers before 2024.6).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from edgeasr.lab.evaluation.assist_runs import Heard
from edgeasr.lab.evaluation.scoring import normalizer

RIGHT, WRONG, NONE, NOT_APPLICABLE = "right", "wrong", "none", "n/a"
ACTED = frozenset({"action_done", "query_answer"})
CLOCK = re.compile(r"\b\d{1,2}:\d{2}(\s*[AP]\.?M\.?)?", re.IGNORECASE)
TIMER_WORDS = re.compile(r"\btimers?\b", re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    outcome: str
    why: str = ""


def action(heard: Heard) -> tuple[Any, ...]:
    """What a run did, in a form two runs compare by."""
    response = heard.response or {}
    data = response.get("data") or {}

    def ids(key: str) -> frozenset[str]:
        return frozenset(t.get("id", t.get("name", "")) for t in data.get(key) or ())

    return (response.get("response_type"), ids("success"), ids("failed"), answer(response),
            tuple(sorted(heard.changes.items())), heard.timers)


def answer(response: dict[str, Any]) -> Any:
    """The spoken answer as two runs compare it (the module's docstring says why)."""
    timers = (response.get("speech_slots") or {}).get("timers")
    if timers:
        return tuple(sorted((t.get("name") or "", t.get("start_hours"), t.get("start_minutes"),
                             t.get("start_seconds"), t.get("is_active")) for t in timers))
    speech = ((response.get("speech") or {}).get("plain") or {}).get("speech") or ""
    return normalizer(response.get("language") or "en")(CLOCK.sub(" clock ", speech))


def acted(heard: Heard) -> bool:
    return heard.error is None and (heard.response or {}).get("response_type") in ACTED


def judge(oracle: Heard, heard: Heard, reference: str, has_timers: bool) -> Verdict:
    if not has_timers and TIMER_WORDS.search(reference):
        return Verdict(NOT_APPLICABLE, "this release has no timers")
    if not acted(oracle):
        if did_something(heard):  # a non-command (or a command this home lacks) became one
            return Verdict(WRONG, f"the reference is not acted on; the text was: {describe(heard)}")
        return Verdict(NOT_APPLICABLE, f"the reference is not acted on: {speech_of(oracle) or oracle.error}")
    if action(heard) == action(oracle):
        return Verdict(RIGHT)
    if not did_something(heard):
        return Verdict(NONE, speech_of(heard) or heard.error or "")
    return Verdict(WRONG, describe(heard))


def did_something(heard: Heard) -> bool:
    return acted(heard) or bool(heard.changes) or bool(heard.timers)


def speech_of(heard: Heard) -> str:
    return str(((heard.response or {}).get("speech") or {}).get("plain", {}).get("speech") or "")


def describe(heard: Heard) -> str:
    """What a run did, for a person: the answer, the states changed, the timers."""
    parts = [f"{(heard.response or {}).get('response_type')}: {speech_of(heard)!r}"]
    parts += [f"{entity} -> {state[0]} {dict(state[1]) if state[1] else ''}".strip()
              for entity, state in sorted(heard.changes.items())]
    parts += [" ".join(map(str, event)) for event in heard.timers]
    return "; ".join(parts)


def percentile(values: Iterable[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else None


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One engine's counts over its rows (each with `exact`, `outcome`, `stop_to_text_ms`)."""
    count = {k: sum(r["outcome"] == k for r in rows) for k in (RIGHT, WRONG, NONE, NOT_APPLICABLE)}
    latencies = [r["stop_to_text_ms"] for r in rows if r["stop_to_text_ms"] is not None]
    return {"clips": len(rows), "text_exact": sum(r["exact"] for r in rows), "judged": len(rows) - count[NOT_APPLICABLE],
            **count, "stop_to_text_ms_median": percentile(latencies, 0.5),
            "stop_to_text_ms_p90": percentile(latencies, 0.9)}


def markdown(summaries: dict[str, dict[str, Any]]) -> str:
    lines = ["| STT service | text exact | right action | wrong action | no action | n/a | stop → text median / p90 |",
             "|---|---|---|---|---|---|---|"]
    for name, s in summaries.items():
        lines.append(f"| {name} | {s['text_exact']} / {s['clips']} | {s[RIGHT]} / {s['judged']} | {s[WRONG]} | "
                     f"{s[NONE]} | {s[NOT_APPLICABLE]} | {s['stop_to_text_ms_median']} / {s['stop_to_text_ms_p90']} ms |")
    return "\n".join(lines)
