"""Home Assistant's sentences with a home's names (edgeasr.home.sentences): hassil and
home-assistant-intents themselves, with tests/data/home.yaml."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from edgeasr.home.names import load_home
from edgeasr.home.sentences import HomeSentences
from edgeasr.models.command_set import NOT_COMMANDS
from edgeasr.stages import HomeName, Intent, Vocabulary

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


def _on_graph(graph, words: list[str]) -> bool:
    """Is `words` a sentence of the word graph (a path from its start to a final state)?"""
    def close(states: set[int]) -> set[int]:
        todo, seen = list(states), set(states)
        while todo:
            for label, to in graph.arcs.get(todo.pop(), ()):
                if label is None and to not in seen:
                    seen.add(to)
                    todo.append(to)
        return seen

    states = close({graph.start})
    for word in words:
        states = close({to for s in states for label, to in graph.arcs.get(s, ()) if label == word})
    return bool(states & graph.finals)


@pytest.mark.parametrize("text", ["volume up", "volume down", "increase the volume", "pause",
                                  "turn on the Nanoleaf Shapes", "set the Ecobee fan to automatic"])
def test_the_word_graph_holds_the_sentences_hassil_matches(sentences, text):
    """The graph the decoder is held to holds what hassil matches, list values said in
    alternatives included ("volume up": `volume_step` is '(up|increase)'; fan modes)."""
    assert sentences.recognize(text) is not None, text
    words = text.replace("Nanoleaf Shapes", "Nanoleaf_Shapes").split()  # a name is one label
    words = [w.replace("_", " ") for w in words]
    assert _on_graph(sentences.graph(), words), text
