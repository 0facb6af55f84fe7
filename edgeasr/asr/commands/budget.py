"""How much the command reading may do: a bounded number of the search's steps and of texts
read by Home Assistant's matcher, and, where asked, a share of the decode's time, whatever the
language, the home and how far the decoded text is from any of the home's sentences.

The reading (heard.py) asks before each costly part (a step of the search's
hypotheses, a text for Home Assistant's matcher) whether the budget still affords it; when it
does not, the reading stops there and takes no sentence: a command left as decoded is no wrong
action, a late one makes the user wait. The budget also counts what the reading did (its steps,
the hypotheses they took, the texts matched, whether it was cut), for `edgeasr transcribe` and
`bench-commands`.

The default bounds the work, not the clock (the search's steps in proportion to the tokens of
the text the decode wrote): the same audio is read alike however busy the
machine, and the work's time follows from it on a machine kind (base, this project's 2 CPUs:
about 8 ms of CPU a step of 7 hypotheses, 28 ms a French or Dutch text matched, 23 ms the
start with the names prompt: docs/benchmarks.md, *Commands*). A share of the decode's time
and a time cap can be asked for besides (`BudgetOptions.share`, `most_ms`): on a busy machine
they cut the reading, and with it the command, where the work bound does not.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

# steps of the search at most, beyond the tokens of the text as decoded: a sentence is about as
# many steps as it has tokens, so the search may spend what the decode spent on the text and a
# few more. On dev-commands-multi's part to choose on (base, 129 commands) this kept 113 of the
# 115 intents the unbounded search got right (a fixed 16 steps kept 110, and cut the long ones:
# "Rez-de-chaussée" is 8 tokens), and every one of the English commands tiny.en got right
# (home-150 and dev-commands, 165)
STEPS_BEYOND_TEXT = 6
# texts read by Home Assistant's matcher at most: the decoded text, the sentence taken and its
# rivals (4 or fewer in 279 of the 283 readings of dev-commands-multi, 165 of 165 in English)
MOST_MATCHES = 5


@dataclass(frozen=True)
class BudgetOptions:
    """What a reading may do: as many steps of the search as the text as decoded has tokens and
    `steps_beyond_text` more, `most_matches` texts matched, and `share` of the decode's time but
    never more than `most_ms` (both unbounded by default)."""

    steps_beyond_text: float = STEPS_BEYOND_TEXT
    most_matches: float = MOST_MATCHES
    share: float = math.inf
    most_ms: float = math.inf

    def allowed_ms(self, decode_ms: float) -> float:
        return min(self.share * max(decode_ms, 0.0), self.most_ms)


DEFAULT_BUDGET = BudgetOptions()
UNLIMITED = BudgetOptions(steps_beyond_text=math.inf, most_matches=math.inf)  # what the budget cuts, measured


STEP, MATCH = "step", "match"  # the parts the reading counts and times


class ReadingBudget:
    """One reading's allowance (its options, and the time from its start: `allowed_ms`) and what
    it spent."""

    def __init__(self, options: BudgetOptions = DEFAULT_BUDGET, allowed_ms: float = math.inf,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.options, self.allowed_ms, self.clock = options, allowed_ms, clock
        self.start = clock()
        self.steps = 0  # batched steps of the search
        self.rows = 0  # hypotheses those steps took (one row each)
        self.matched = 0  # texts read by Home Assistant's matcher
        self.cut = False  # the budget ended the reading before it was done
        self.most_steps = math.inf  # the search's steps, once the text it reads is known (`for_text`)
        self._last: dict[str, float] = {}  # what the last part of each kind took, ms

    def for_text(self, tokens: int) -> None:
        """The search reads a text of `tokens` tokens: it may take that many steps and
        `steps_beyond_text` more."""
        self.most_steps = tokens + self.options.steps_beyond_text

    def spent_ms(self) -> float:
        return (self.clock() - self.start) * 1e3

    def affords(self, kind: str) -> bool:
        """Is there room for one more part of `kind`: a count left, and time for it at what the
        last one took? Once there is not, the reading is cut."""
        done, most = (self.steps, self.most_steps) if kind == STEP else (self.matched, self.options.most_matches)
        if done >= most or self.spent_ms() + self._last.get(kind, 0.0) > self.allowed_ms:
            self.cut = True
        return not self.cut

    def spent(self, kind: str, since: float) -> None:
        """A part of `kind` begun at clock time `since` is done."""
        self._last[kind] = (self.clock() - since) * 1e3

    def counters(self) -> dict[str, int]:
        """What the reading did (Transcription.reading)."""
        return {"steps": self.steps, "rows": self.rows, "matched": self.matched, "cut": int(self.cut)}
