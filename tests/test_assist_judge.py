"""The Home Assistant harness's pure parts: how a home file becomes Home Assistant's
configuration, and how a run is judged against the oracle (tests/test_assist_real.py runs them
against a real Home Assistant)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from edgeasr.errors import ConfigError
from edgeasr.lab.evaluation.assist_home import configuration, home_from_files
from edgeasr.lab.evaluation.assist_judge import NONE, NOT_APPLICABLE, RIGHT, WRONG, judge, markdown, summary
from edgeasr.lab.evaluation.assist_runs import Heard, heard_from

DATA = Path(__file__).parent / "data"
HOME = DATA / "home.yaml"


def _response(kind: str, speech: str, *targets: str) -> dict:
    return {"response_type": kind, "speech": {"plain": {"speech": speech}},
            "data": {"success": [{"id": t} for t in targets], "failed": []}}


def _heard(kind: str = "action_done", speech: str = "Turned on the light", *targets: str, changes=None,
           timers=()) -> Heard:
    return Heard("text", _response(kind, speech, *targets), None, 5.0, changes or {}, timers)


ON = {"light.lamp": ("on", ())}


def test_the_same_action_is_right_and_a_clock_time_may_move():
    assert judge(_heard(changes=ON), _heard(changes=ON), "turn on the lamp", True).outcome == RIGHT
    assert judge(_heard("action_done", "4:35 PM"), _heard("action_done", "4:36 PM"), "what time is it",
                 True).outcome == RIGHT


def test_another_action_is_wrong_and_none_is_no_action():
    oracle = _heard("action_done", "Turned on the light", "light.lamp", changes=ON)
    other = _heard("action_done", "Turned on the light", "light.desk", changes={"light.desk": ("on", ())})
    assert judge(oracle, other, "turn on the lamp", True).outcome == WRONG
    told_time = _heard("action_done", "4:35 PM")
    assert judge(_heard("action_done", "Paused"), told_time, "pause timer", True).outcome == WRONG
    refused = _heard("error", "Sorry, I couldn't understand that")
    assert judge(oracle, refused, "turn on the lamp", True).outcome == NONE


def test_an_answer_is_compared_as_digits_and_a_timers_time_left_is_not():
    removed = _heard("action_done", "2 minutes removed from timer", timers=(("timer-updated", True, -120),))
    said = _heard("action_done", "two minutes removed from timer", timers=(("timer-updated", True, -120),))
    assert judge(removed, said, "remove 2 minutes from the timer", True).outcome == RIGHT

    def left(speech: str, seconds: int, start_minutes: int = 10) -> Heard:
        heard = _heard("action_done", speech)
        assert heard.response is not None
        heard.response["speech_slots"] = {"timers": [{"name": "", "start_hours": 0, "start_minutes": start_minutes,
                                                      "start_seconds": 0, "is_active": True,
                                                      "total_seconds_left": seconds}]}
        return heard

    question = "how much time is left on the timer"
    assert judge(left("10 minutes left.", 592), left("9 minutes and 30 seconds left.", 583), question,
                 True).outcome == RIGHT
    assert judge(left("10 minutes left.", 592), left("5 minutes left.", 300, 5), question, True).outcome == WRONG


def test_a_timer_started_for_another_time_is_wrong():
    oracle = _heard("action_done", "Timer set", timers=(("timer-started", 300),))
    heard = _heard("action_done", "Timer set", timers=(("timer-started", 180),))
    paused = _heard("action_done", "Timer paused", timers=(("timer-updated", False, 0),))
    assert judge(paused, _heard("action_done", "Timer resumed", timers=(("timer-updated", True, 0),)),
                 "pause timer", True).outcome == WRONG
    assert judge(oracle, heard, "set a timer for 5 minutes", True).outcome == WRONG


def test_not_applicable_when_the_oracle_fails_or_the_release_has_no_timers():
    refused = _heard("error", "Sorry, I am not aware of any area called play")
    verdict = judge(refused, refused, "play the beatles", True)
    assert verdict.outcome == NOT_APPLICABLE and "not aware" in verdict.why
    # speech that is no command here, heard as one that acts: the worst outcome
    assert judge(refused, _heard(changes=ON), "play the beatles", True).outcome == WRONG
    timer = _heard("action_done", "Timer set", timers=(("timer-started", 300),))
    assert judge(timer, timer, "set a timer for 5 minutes", False).why == "this release has no timers"


def test_the_table_counts_and_the_latency_is_from_the_end_of_speech():
    events = [{"type": "stt-vad-end", "timestamp": "2026-01-01T00:00:01.000+00:00", "data": {}},
              {"type": "stt-end", "timestamp": "2026-01-01T00:00:01.250+00:00", "data": {"stt_output": {"text": "Hi"}}},
              {"type": "intent-end", "timestamp": "2026-01-01T00:00:01.300+00:00",
               "data": {"intent_output": {"response": _response("action_done", "Done")}}}]
    heard = heard_from(events)
    assert heard.text == "Hi" and heard.stop_to_text_ms == pytest.approx(250.0)
    rows = [{"exact": True, "outcome": RIGHT, "stop_to_text_ms": 250.0},
            {"exact": False, "outcome": WRONG, "stop_to_text_ms": 100.0},
            {"exact": False, "outcome": NOT_APPLICABLE, "stop_to_text_ms": None}]
    s = summary(rows)
    assert (s["text_exact"], s[RIGHT], s[WRONG], s["judged"], s["stop_to_text_ms_median"]) == (1, 1, 1, 2, 250.0)
    assert "| edgeasr | 1 / 3 | 1 / 2 | 1 | 0 | 1 |" in markdown({"edgeasr": s})


def test_every_entity_gets_an_area_and_the_satellites_area_one_of_each_kind():
    home = home_from_files([HOME])
    by_name = {e.name: e for e in home.entities}
    assert home.satellite_area == "Living Room"
    assert by_name["Kitchen Pendants"].area == "Kitchen"  # named after its area
    for domain in ("light", "climate", "media_player", "cover"):
        assert any(e.domain == domain and e.area == "Living Room" for e in home.entities), domain
    assert "Husqvarna Automower" not in by_name  # no offline platform for lawn_mower


def test_the_configuration_serves_loopback_only_and_resets_what_commands_change():
    config, resets = configuration(home_from_files([HOME]), 8123)
    assert config["http"] == {"server_host": "127.0.0.1", "server_port": 8123}
    assert "default_config" not in config and "cloud" not in config
    assert any(r.domain == "light" and r.data == {"entity_id": "light.hue_go"} for r in resets)


def test_a_home_without_areas_is_refused(tmp_path):
    bare = tmp_path / "home.yaml"
    bare.write_text("entities:\n  - {name: Lamp, domain: light}\n")
    with pytest.raises(ConfigError, match="at least one area"):
        home_from_files([bare])


def test_bench_assist_names_a_bad_engine_and_a_set_without_a_home(tmp_path):
    from edgeasr.cli import main

    assert main(["bench-assist", "--dataset", str(tmp_path), "--home", str(HOME), "--engines", "whisper.cpp"]) == 64
    assert main(["bench-assist", "--dataset", str(tmp_path)]) == 64  # no --home, and no home.yaml in the set


def test_a_command_on_a_timer_or_a_paused_player_is_prepared_for():
    """What a command needs first is read from its intent (Home Assistant's sentences with the
    home's names), so a home in any language is prepared for alike."""
    from edgeasr.home.names import load_home
    from edgeasr.home.sentences import HomeSentences
    from edgeasr.lab.evaluation.assist_session import SPOKEN, preparation

    sentences = HomeSentences(load_home(HOME), "en")
    en = SPOKEN["en"]

    def needs(reference: str) -> tuple[str, ...]:
        intent = sentences.recognize(reference)
        return preparation(intent.name if intent else None, en)

    assert needs("set a timer for 5 minutes") == ()
    assert needs("pause timer") == (en.start_timer,)
    assert needs("how much time is left on the timer") == (en.start_timer,)
    assert needs("resume the timer") == (en.start_timer, en.pause_timer)
    assert needs("resume") == (en.pause,)
    assert needs("turn on the lights") == () and needs("how old is the Brooklyn Bridge") == ()


def test_a_home_in_a_language_the_harness_cannot_speak_is_refused_before_home_assistant_starts(tmp_path):
    from edgeasr.errors import UsageError
    from edgeasr.lab.evaluation.assist_session import AssistSession

    home = dataclasses.replace(home_from_files([HOME]), language="pt")
    with pytest.raises(UsageError, match="--home: the harness speaks en, de, fr, es, it, nl, not pt"):
        AssistSession(tmp_path / "no-venv", home, tmp_path)


@pytest.mark.parametrize("language", ["en", "de", "fr", "es", "it", "nl"])
def test_the_harness_says_its_own_commands_in_the_homes_language(language):
    """Cancelling every timer between clips, and the timer or the pause a command needs, are
    said in the pipeline's language: said in English to a French pipeline, no timer was ever
    cancelled, and one that ran out during a later clip made that clip a wrong action."""
    from edgeasr.home.names import load_home
    from edgeasr.home.sentences import HomeSentences
    from edgeasr.lab.evaluation.assist_session import SPOKEN

    home = HOME if language == "en" else DATA / f"home-{language}.yaml"
    sentences = HomeSentences(load_home(home), language)
    said = SPOKEN[language]
    meant = {said.cancel_timers: "HassCancelAllTimers", said.start_timer: "HassStartTimer",
             said.pause_timer: "HassPauseTimer", said.pause: "HassMediaPause"}
    assert {text: (i.name if (i := sentences.recognize(text)) else None) for text in meant} == meant


def test_timer_events_compare_by_what_changed_not_by_when():
    from edgeasr.lab.evaluation.satellite import Satellite

    satellite = Satellite("satellite", "Living Room", 0)
    satellite.timers += [{"type": "timer-started", "id": "t", "total_seconds": 600, "at": 100.0},
                         {"type": "timer-updated", "id": "t", "total_seconds": 592, "is_active": False, "at": 108.0},
                         {"type": "timer-updated", "id": "t", "total_seconds": 592, "is_active": True, "at": 130.0},
                         {"type": "timer-updated", "id": "t", "total_seconds": 888, "is_active": True, "at": 134.0},
                         {"type": "timer-cancelled", "id": "t", "at": 140.0}]
    assert satellite.timer_events(1) == (("timer-updated", False, 0), ("timer-updated", True, 0),
                                         ("timer-updated", True, 300), ("timer-cancelled",))
