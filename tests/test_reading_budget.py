"""The command reading in bounded time: a share of the decode it follows and never more than a
fixed time, its work counted."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.engines import make_engine
from helpers.voices import said

from edgeasr.asr.commands.budget import (
    DEFAULT_BUDGET,
    MOST_MATCHES,
    STEPS_BEYOND_TEXT,
    UNLIMITED,
    BudgetOptions,
    ReadingBudget,
)
from edgeasr.home.names import load_home
from edgeasr.home.sentences import sentences_for
from edgeasr.models.voices import Voice

HOME = Path(__file__).parent / "data" / "home.yaml"
SLOW_JOE = Voice("piper", "en_US-joe-medium", 1.0, 0.0)  # "start the Roborock" heard "Start the row burah."


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_reading_searches_about_as_many_steps_as_the_text_has_tokens_and_matches_few_texts():
    assert DEFAULT_BUDGET.steps_beyond_text == STEPS_BEYOND_TEXT and DEFAULT_BUDGET.most_matches == MOST_MATCHES
    assert DEFAULT_BUDGET.allowed_ms(10_000.0) == math.inf  # the work is bounded, not the clock
    timed = BudgetOptions(share=0.5, most_ms=150.0)
    assert timed.allowed_ms(100.0) == pytest.approx(50.0) and timed.allowed_ms(10_000.0) == 150.0
    budget = ReadingBudget(BudgetOptions(steps_beyond_text=1, most_matches=1), clock=Clock())
    budget.for_text(2)  # a text of 2 tokens: 3 steps
    assert budget.affords("step") and budget.affords("match")
    budget.steps, budget.matched = 3, 0
    assert budget.affords("match") and not budget.affords("step") and budget.cut
    assert not budget.affords("match")  # once cut, nothing more
    unbounded = ReadingBudget(UNLIMITED)
    unbounded.for_text(2)
    unbounded.steps = 1000
    assert unbounded.affords("step")


def test_a_part_is_afforded_at_what_the_last_of_its_kind_took_and_a_refused_one_cuts_the_reading():
    clock = Clock()
    budget = ReadingBudget(UNLIMITED, allowed_ms=50.0, clock=clock)
    assert budget.affords("step")  # nothing spent, no step's time known yet
    begun = clock()
    clock.now += 0.020  # a step of 20 ms
    budget.spent("step", begun)
    assert budget.spent_ms() == pytest.approx(20.0) and budget.affords("step")  # 20 + 20 <= 50
    clock.now += 0.020
    assert not budget.affords("step") and budget.cut  # 40 + 20 > 50
    assert budget.counters()["cut"] == 1


def test_a_spent_budget_leaves_a_misheard_command_as_decoded_and_says_so(tiny_default_bundle, speakers):  # noqa: F811
    """With no step to spend, "Start the row burah." stays as decoded (no action rather than a
    late one) and the reading says the budget cut it; with them, it is read as the Roborock,
    the search's steps and the hypotheses they took counted, within the default budget."""
    engine = make_engine(tiny_default_bundle, sentences=sentences_for)
    home = load_home(HOME)
    audio = said(speakers, "start the Roborock", SLOW_JOE)
    spent = engine.variant(replace(engine.options, reading=BudgetOptions(steps_beyond_text=-100)))
    unbounded = engine.variant(replace(engine.options, reading=UNLIMITED))
    cut = spent.transcribe(audio, vocabulary=home)
    read = unbounded.transcribe(audio, vocabulary=home)
    assert cut.text == engine.transcribe(audio).text != read.text, (cut.text, read.text)
    assert cut.intent is None and cut.reading["cut"] == 1 and cut.reading["steps"] == 0
    assert read.text == "Start the Roborock." and read.reading["cut"] == 0
    assert read.reading["steps"] > 0 and read.reading["rows"] >= read.reading["steps"]
    assert read.reading["matched"] >= 2  # the text as decoded, then the sentence taken
    assert read.reading["steps"] <= len(engine.sessions.tokenizer.encode(" " + cut.text)) + STEPS_BEYOND_TEXT
    assert read.reading["matched"] <= MOST_MATCHES
    assert engine.transcribe(audio, vocabulary=home).text == read.text  # the default budget affords it
