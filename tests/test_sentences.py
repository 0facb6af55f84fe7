"""Home Assistant's sentences with a home's names (edgeasr.home.sentences): hassil and
home-assistant-intents themselves, with tests/data/home.yaml."""

from __future__ import annotations

import functools
import random
import re
from pathlib import Path

import pytest

from edgeasr.home.names import load_home
from edgeasr.home.sentences import HomeSentences
from edgeasr.lab.evaluation.command_phrases import NOT_COMMANDS
from edgeasr.stages import HomeName, Intent, Vocabulary, WordGraph

HOME = Path(__file__).parent / "data" / "home.yaml"


@pytest.fixture(scope="module")
def home() -> Vocabulary:
    return load_home(HOME)


@pytest.fixture(scope="module")
def sentences(home) -> HomeSentences:
    return HomeSentences(home, "en")


@pytest.mark.parametrize(("text", "intent"), [
    ("turn on the Nanoleaf Shapes", Intent("HassTurnOn", (("name", "Nanoleaf Shapes"),))),
    ("Turn off Grandma's lamp.", Intent("HassTurnOff", (("name", "Grandma's lamp"),))),
    ("set the Ecobee to 21 degrees", Intent("HassClimateSetTemperature", (("name", "Ecobee"), ("temperature", "21")))),
    ("start Rocky", Intent("HassVacuumStart", (("name", "Rocky"),))),  # an alias is its own value, as in HA
    ("lock the Nuki Lock", Intent("HassTurnOn", (("name", "Nuki Lock"),))),
    ("turn on the lights in the master bedroom",
     Intent("HassTurnOn", (("area", "Master Bedroom"), ("domain", "light")))),
    ("turn off the lights on the upper level", Intent("HassTurnOff", (("domain", "light"), ("floor", "Upstairs")))),
    ("set a timer for 5 minutes", Intent("HassStartTimer", (("minutes", "5"),))),
])
def test_templated_commands_with_the_homes_names(sentences, text, intent):
    assert sentences.recognize(text) == intent


def test_a_command_without_an_area_is_heard_in_the_first_area_or_the_one_given(home, sentences):
    assert sentences.area == "Living Room"
    assert sentences.recognize("pause") == Intent("HassMediaPause", (("area", "Living Room"),))
    assert sentences.recognize("turn on the lights") == Intent("HassTurnOn", (("area", "Living Room"),
                                                                              ("domain", "light")))
    kitchen = HomeSentences(home, "en", area="Kitchen")
    assert kitchen.recognize("pause") == Intent("HassMediaPause", (("area", "Kitchen"),))


def test_plain_names_stand_for_an_entity_and_an_area():
    plain = Vocabulary((HomeName("Bubble Lamp", "name"), HomeName("Sun Room", "name")))
    sentences = HomeSentences(plain, "en")
    assert sentences.recognize("turn on Bubble Lamp") == Intent("HassTurnOn", (("name", "Bubble Lamp"),))
    assert sentences.recognize("turn off the lights in the sun room") == Intent(
        "HassTurnOff", (("area", "Sun Room"), ("domain", "light")))
    # sentences without a name are heard in the satellite's area: with plain names only (a
    # Wyoming request's transcript_names), the first of them stands for it
    assert sentences.recognize("pause") == Intent("HassMediaPause", (("area", "Bubble Lamp"),))
    assert sentences.recognize("volume up") is not None


@pytest.mark.parametrize("text", [*NOT_COMMANDS, "", "turn on the Acme Toaster"])
def test_speech_that_is_not_a_command_of_this_home_gives_none(sentences, text):
    assert sentences.recognize(text) is None


def test_sampling_is_deterministic_and_maps_back(home, sentences):
    first = sentences.sample(random.Random(5), 40)
    assert first == sentences.sample(random.Random(5), 40)
    assert first != sentences.sample(random.Random(6), 40)
    assert len(first) == 40 and len({t for t, _ in first}) == 40
    for text, intent in first:
        assert sentences.recognize(text) == intent
    spoken = {s for n in home.names for s in n.spoken}
    named = [v for _, i in first for slot, v in i.slots if slot == "name"]
    assert named and set(named) <= spoken


def test_sampling_keeps_to_the_intents_asked_for(sentences):
    drawn = sentences.sample(random.Random(1), 8, intents={"HassTurnOn", "HassStartTimer"})
    assert len(drawn) == 8
    assert {i.name for _, i in drawn} <= {"HassTurnOn", "HassStartTimer"}


def test_the_held_out_home_samples_commands_that_name_its_own_things():
    """tests/data/held-out-home.yaml, the home the command margin was checked on
    (docs/benchmarks.md), makes a command set of its own: its sentences name its things."""
    held_out = load_home(HOME.with_name("held-out-home.yaml"))
    drawn = HomeSentences(held_out, "en").sample(random.Random(7), 20)
    spoken = {s for n in held_out.names for s in n.spoken}
    named = [v for _, i in drawn for slot, v in i.slots if slot == "name"]
    assert len(drawn) == 20 and named and set(named) <= spoken



def _on_graph(graph, text: str) -> bool:
    """Is `text` (marks and case aside) a sentence of the word graph: a path from its start to a
    final state whose labels spell it, a number for NUMBER?"""
    def norm(t: str) -> str:
        return " ".join(re.sub(r"[,.?!]", " ", t).lower().split())

    @functools.cache
    def walk(state: int, rest: str) -> bool:
        if not rest and state in graph.finals:
            return True
        for label, to in graph.arcs.get(state, ()):
            if label is None:
                said = ""
            elif label == WordGraph.NUMBER:
                said = m.group() if (m := re.match(r"\d+", rest)) else None
            else:
                said = norm(label)
            whole = said is not None and rest.startswith(said) and (  # not a word's beginning only
                len(rest) == len(said) or not said or not (rest[len(said)].isalpha() and said[-1].isalpha()))
            if whole and walk(to, rest[len(said or ""):].lstrip()):
                return True
        return False

    return walk(graph.start, norm(text))


@pytest.mark.parametrize("text", ["volume up", "increase the volume", "set the Ecobee fan to automatic",
                                  "set a timer for 5 minutes", "pause the 10 minutes timer", "turn on the fans"])
def test_the_word_graph_holds_the_sentences_hassil_matches(sentences, text):
    """The graph the decoder is held to holds what hassil matches: list values said in
    alternatives ('(up|increase)' of volume_step, fan modes), and words hassil spells in pieces
    ("minute[s]", "fan[s]")."""
    assert sentences.recognize(text) is not None, text
    assert _on_graph(sentences.graph(), text), text


def test_a_template_that_asks_for_a_domain_holds_only_the_names_of_that_domain(sentences):
    """A name goes on the graph only where Home Assistant would match it: the fan mode of a
    climate entity, not of a cover; a plain name (a Wyoming request's, no domain) anywhere."""
    for text, matched in [("set the fan mode of the Ecobee to auto", True),
                          ("set the fan mode of the Somfy Blinds to auto", False),
                          ("open the Somfy Blinds", True), ("open the Ecobee", False)]:
        assert (sentences.recognize(text) is not None) == matched, text
        assert _on_graph(sentences.graph(), text) == matched, text
    plain = HomeSentences(Vocabulary((HomeName("Bubble Lamp", "name"),)), "en")
    for text in ["set the fan mode of Bubble Lamp to auto", "open Bubble Lamp"]:
        assert plain.recognize(text) is not None and _on_graph(plain.graph(), text), text


def test_a_text_said_again_is_recognized_once(sentences):
    """A home says its commands again and again: their intents are kept (RECOGNIZED_CACHE)."""
    first = sentences.recognize("turn off the kitchen lights ")
    hits = sentences._recognized.cache_info().hits
    assert sentences.recognize("turn off the kitchen lights ") == first
    assert sentences._recognized.cache_info().hits == hits + 1


def test_the_word_graph_holds_the_sentences_of_the_templates(sentences):
    """Every sentence sampled from the templates with the home's names is on the graph, but a
    temperature with a decimal point: a NUMBER arc is digits here, and the search reads a decimal
    point into it (test_commands_heard)."""
    sampled = [text for text, _ in sentences.sample(random.Random(3), 300) if not re.search(r"\d\.\d", text)]
    assert len(sampled) > 250
    missing = [text for text in sampled if not _on_graph(sentences.graph(), text)]
    assert not missing, missing[:5]
