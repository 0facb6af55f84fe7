"""`edgeasr bench-commands`: how intents are compared, where the expected ones come from, and a
run end to end with tiny.en and faster-whisper on a small generated set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeasr.cli import main
from edgeasr.errors import UsageError
from edgeasr.home.names import load_home
from edgeasr.lab.evaluation.command_set import intent_from_json
from edgeasr.lab.evaluation.scoring import normalizer, read_manifest, sentence_normalizer
from edgeasr.lab.evaluation.voice_commands import ALL, alias_targets, means_of, read_items, same_intent
from edgeasr.stages import Intent

DATA = Path(__file__).parent / "data"
DEV_COMMANDS = Path(__file__).resolve().parents[1].parent / "shared" / "eval" / "dev-commands"
COUNT = 6
ROWS = ("edgeasr", "edgeasr-vocabulary", "faster-whisper-beam5-names")


@pytest.mark.parametrize(("language", "written", "said"), [
    ("fr", "Allume Rez-de-chaussée à 55%", "allume Rez-de-chaussée à 55 pourcent"),
    ("fr", "Minuteur une minute et 45 secondes.", "minuteur 1 minute et 45 secondes"),
    ("es", "Pon Temporizador de una hora y media.", "pon temporizador de 1 hora y media"),
    ("it", "Imposta la luminosità in cucina al 50%.", "imposta la luminosità in Cucina al 50 percento"),
])
def test_a_sentence_is_judged_as_said_whether_numbers_are_words_or_digits(language, written, said):
    norm = sentence_normalizer(language)
    assert norm(written).split() == norm(said).split()
    assert normalizer(language)(written).split() != normalizer(language)(said).split()  # Whisper's alone: not


def test_a_sentence_in_other_words_or_numbers_is_still_another_sentence():
    norm = sentence_normalizer("fr")
    assert norm("Ferme les stores.").split() != norm("ferme tous les stores").split()
    assert norm("Règle à 15%").split() != norm("règle à 50 pourcent").split()
    assert sentence_normalizer("en") is normalizer("en")  # English: Whisper's own numbers


def test_intents_are_the_same_with_the_same_slots_free_text_case_folded():
    lamp = Intent("HassTurnOn", (("name", "Lamp"),))
    assert same_intent(lamp, Intent("HassTurnOn", (("name", "lamp"),)))
    assert same_intent(None, None)
    assert not same_intent(lamp, None) and not same_intent(None, lamp)
    assert not same_intent(lamp, Intent("HassTurnOff", (("name", "Lamp"),)))
    assert not same_intent(lamp, Intent("HassTurnOn", (("name", "Lamp"), ("area", "Kitchen"))))
    assert not same_intent(lamp, Intent("HassTurnOn", (("name", "Lamp 2"),)))


def test_an_area_or_entity_said_by_its_alias_is_the_same_action():
    """Home Assistant's matcher fills the slot with the alias said ("huiskamer") and acts on the
    area it stands for (Woonkamer): the same action, not a wrong one. A floor's alias is filled
    in as the floor's name already; another area is still another action."""
    aliases = alias_targets(load_home(DATA / "home-nl.yaml"))
    assert aliases[("area", "huiskamer")] == "Woonkamer"
    said = Intent("HassMediaNext", (("area", "huiskamer"),))
    assert same_intent(Intent("HassMediaNext", (("area", "Woonkamer"),)), said, aliases)
    assert not same_intent(Intent("HassMediaNext", (("area", "Woonkamer"),)), said)
    assert not same_intent(Intent("HassMediaNext", (("area", "Keuken"),)), said, aliases)
    entity = next(n for n in load_home(DATA / "held-out-home-de.yaml").names if n.kind == "entity" and n.aliases)
    de = alias_targets(load_home(DATA / "held-out-home-de.yaml"))
    assert same_intent(Intent("HassTurnOn", (("name", entity.aliases[0]),)), Intent("HassTurnOn", (("name", entity.name),)), de)
    assert not any(slot == "floor" for slot, _ in de)


def test_a_set_without_intents_expects_what_the_matcher_finds_in_its_references():
    items = read_items([DEV_COMMANDS], [DATA / "dev-commands-home.yaml"])
    assert len(items) == len(read_manifest(DEV_COMMANDS)) and {i.group for i in items} == {"dev-commands"}
    expected = {i.reference: i.expected for i in items}
    assert expected["turn on the living room lamp"] == Intent("HassTurnOn", (("name", "Living Room Lamp"),))
    assert expected["what time is it"] == Intent("HassGetCurrentTime")
    assert expected["how old is the Brooklyn Bridge"] is None


def test_homes_are_one_for_all_sets_or_one_per_set():
    with pytest.raises(UsageError, match="--home"):
        read_items([DEV_COMMANDS, DEV_COMMANDS, DEV_COMMANDS], [DATA / "home.yaml", DATA / "home.yaml"])


@pytest.fixture(scope="module")
def command_set(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("commands")
    assert main(["models", "command-set", "--home", str(DATA / "home.yaml"), "--out", str(out),
                 "--count", str(COUNT), "--seed", "1"]) == 0
    return out


def test_the_bench_runs_end_to_end_and_its_numbers_add_up(tmp_path, command_set, tiny_bundle, capsys):
    out = tmp_path / "report.json"
    assert main(["bench-commands", "--dataset", str(command_set), "--model", str(tiny_bundle),
                 "--rows", ",".join(ROWS), "--out", str(out)]) == 0  # the set's own home.yaml
    report = json.loads(out.read_text())
    manifest = read_manifest(command_set)
    groups = {r["group"] for r in manifest}
    norm = normalizer("en")
    aliases = alias_targets(load_home(command_set / "home.yaml"))
    assert list(report["rows"]) == list(ROWS) and report["utterances"] == COUNT
    for row in ROWS:
        table, results = report["rows"][row], report["results"][row]
        assert set(table) == groups | {ALL}
        assert [r["id"] for r in results] == [r["id"] for r in manifest]
        assert sum(table[g]["utterances"] for g in groups) == table[ALL]["utterances"] == COUNT
        for g in table.values():
            assert 0 <= g["sentence_accuracy"] <= 1 and 0 <= g["intent_accuracy"] <= 1
            assert 0 <= g["not_commands_as_command"] <= g["not_commands"] and 0 <= g["empty"] <= g["utterances"]
            assert g["latency_ms_median"] > 0
        assert table[ALL]["not_commands"] == sum(1 for r in manifest if not r["intent"])
        sentences = sum(norm(r["text"]) == norm(m["reference"]) for r, m in zip(results, manifest))
        assert table[ALL]["sentence_accuracy"] == round(sentences / COUNT, 4)
        intents = sum(same_intent(intent_from_json(json.dumps(r["intent"]) if r["intent"] else ""),
                                  intent_from_json(m["intent"]), aliases) for r, m in zip(results, manifest))
        assert table[ALL]["intent_accuracy"] == round(intents / COUNT, 4)
        # a wrong action is an intent found that is not the one said: none found is no action
        wrong = sum(r["intent"] is not None and not same_intent(
            intent_from_json(json.dumps(r["intent"])), intent_from_json(m["intent"]), aliases)
            for r, m in zip(results, manifest))
        assert table[ALL]["wrong_actions"] == wrong
        assert table[ALL]["not_commands_as_command"] <= wrong <= COUNT - intents
        assert any(r["text"].strip() for r in results)
    # the vocabulary row hears as a user does: `transcribe --set vocabulary.home=FILE` (the
    # home's names and sentences), text for text
    files = [str(command_set / r["file"]) for r in manifest]
    capsys.readouterr()
    assert main(["transcribe", "--model", str(tiny_bundle), "--set", f"vocabulary.home={command_set / 'home.yaml'}",
                 "--json", *files]) == 0
    heard = [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]
    assert heard == [r["text"] for r in report["results"]["edgeasr-vocabulary"]]


def test_a_row_may_hear_the_vocabulary_by_some_of_its_means_only(capsys):
    assert means_of("edgeasr-grammar") == {"grammar"}
    assert means_of("edgeasr-boost+grammar") == {"boost", "grammar"}
    assert means_of("edgeasr-vocabulary") is None and means_of("edgeasr-") is None
    assert means_of("faster-whisper") is None and means_of("edgeasr-boost+beam") is None
    assert main(["bench-commands", "--dataset", str(DEV_COMMANDS), "--rows", "edgeasr,edgeasr-beam"]) == 64
    assert "--rows: unknown edgeasr-beam" in capsys.readouterr().err
