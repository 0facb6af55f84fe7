"""Rows for `vocabulary` and `homeassistant`: the vocabulary the daemon holds
(home.source.VocabularySource, Home Assistant read over a real websocket from the loopback
server of tests/test_homeassistant.py) and what the engine hears with it."""

from __future__ import annotations

from helpers.audio import dev_clip
from helpers.homeassistant import TOKEN, FakeHomeAssistant

from config_rows.lab import Lab, Rows
from edgeasr.home.source import VocabularySource
from edgeasr.stages import Intent, Vocabulary

rows = Rows()
LAMP = dev_clip("rhasspy_turn_on_living_room_lamp")  # "Turn on the living room lamp."
TERMS = dev_clip("vctk_p225_038")  # "Diving is no part of football.", heard "...no path of..." plainly
CONNECT_S = 10.0  # a guard against a hang, not a measurement


def vocabulary(lab: Lab, keys: dict) -> Vocabulary:
    """The daemon's vocabulary for these keys, once its first read of Home Assistant ended."""
    source = VocabularySource.from_config(lab.cfg(keys))
    try:
        if source.homeassistant is not None:
            assert source.homeassistant.wait_for_attempts(1, CONNECT_S)
        return source.current()
    finally:
        source.close()


def heard(lab: Lab, keys: dict, audio) -> object:
    return lab.transcribe({}, audio, vocabulary=vocabulary(lab, keys))


@rows.observe("vocabulary.home", "model")
def _vocabulary_home(lab: Lab) -> None:
    """The command read as the home's: its intent, with the home's own names."""
    home = lab.tmp / "home.yaml"
    home.write_text("language: en\nareas:\n  - name: Living Room\nentities:\n  - {name: Lamp, domain: light}\n")
    assert heard(lab, {"vocabulary.home": str(home)}, LAMP).intent == Intent(
        "HassTurnOn", (("area", "Living Room"), ("name", "Lamp")))
    assert lab.transcribe({}, LAMP).intent is None


@rows.observe("vocabulary.names", "model")
def _vocabulary_names(lab: Lab) -> None:
    assert heard(lab, {"vocabulary.names": ["living room lamp"]}, LAMP).intent == Intent(
        "HassTurnOn", (("name", "living room lamp"),))


@rows.observe("vocabulary.terms", "model")
def _vocabulary_terms(lab: Lab) -> None:
    """A term said is heard likelier (the boost of its tokens)."""
    with_term, plain = heard(lab, {"vocabulary.terms": ["part"]}, TERMS), lab.transcribe({}, TERMS)
    assert " part " in with_term.text and " part " not in plain.text, (plain.text, with_term.text)


def _home_assistant(lab: Lab, token: str) -> tuple[FakeHomeAssistant, dict]:
    server = lab.fixture("home_assistant")
    path = lab.tmp / "ha-token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return server, {"homeassistant.url": server.url, "homeassistant.token_file": str(path)}


@rows.observe("homeassistant.url")
def _homeassistant_url(lab: Lab) -> None:
    _, keys = _home_assistant(lab, TOKEN)
    names = {n.name for n in vocabulary(lab, keys).names}
    assert {"Kettle", "Living Room", "Ground Floor"} <= names


@rows.observe("homeassistant.token_file")
def _homeassistant_token_file(lab: Lab) -> None:
    """The token sent is the file's: Home Assistant answers it, and refuses another."""
    server, keys = _home_assistant(lab, TOKEN)
    assert vocabulary(lab, keys).names and {"type": "auth", "access_token": TOKEN} in server.received
    _, keys = _home_assistant(lab, "not-" + TOKEN)
    assert vocabulary(lab, keys) == Vocabulary()


rows.cannot("homeassistant.refresh_s", "at least 10 s between reads: only a timed wait shows it (no timing "
                                       "assertions; tests/test_homeassistant.py drives the refresher at 0.1 s)")
