"""Home Assistant's names over its websocket API, against a loopback server.

No real Home Assistant runs here: helpers.homeassistant.FakeHomeAssistant is a real websocket
server on 127.0.0.1 that speaks the protocol as home-assistant/core documents it in its source,
for a made-up home. Nothing of the client is mocked: every test goes through a socket.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers.homeassistant import REGISTRY, TOKEN, FakeHomeAssistant
from helpers.waiting import wait_until

from edgeasr.config import HomeAssistantApiConfig, VocabularyConfig
from edgeasr.errors import ConfigError, MissingInputError, ToolMissingError
from edgeasr.home.homeassistant import HomeAssistantError, HomeAssistantNames, fetch_names, websocket_url
from edgeasr.home.source import VocabularySource
from edgeasr.stages import HomeName, Vocabulary

REPO = Path(__file__).resolve().parents[1]
LOGGER = "edgeasr.home.homeassistant"
EXPECTED = Vocabulary(
    names=(HomeName("Zentrix Thermo-X", "entity", "climate"),
           HomeName("Porch Light", "entity", "light", ("Front Porch",)),
           HomeName("Reading Lamp", "entity", "light", ("Big light",)),
           HomeName("Kettle", "entity", "switch"),
           HomeName("Living Room", "area", None, ("Lounge",)),
           HomeName("Kitchen", "area"),
           HomeName("Ground Floor", "floor", None, ("Downstairs",))),
    terms=(), language="en")


@pytest.fixture
def ha():
    server = FakeHomeAssistant()
    yield server
    server.close()


def token_file(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "ha-token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    return path


def test_one_fetch_reads_the_names_exposed_to_assist_the_areas_and_the_floors(ha):
    assert fetch_names(ha.url, TOKEN, timeout_s=5) == EXPECTED
    assert ha.received[0] == {"type": "auth", "access_token": TOKEN}
    commands = ha.received[1:]
    assert [m["id"] for m in commands] == [1, 2, 3, 4, 5, 6]
    assert [m["type"] for m in commands] == ["get_config", "homeassistant/expose_entity/list",
                                             "config/entity_registry/get_entries", "get_states",
                                             "config/area_registry/list", "config/floor_registry/list"]
    # only the entities exposed to Assist are asked for
    assert commands[2]["entity_ids"] == ["climate.thermo_x", "light.porch", "light.reading_lamp",
                                         "sensor.nameless", "switch.kettle"]


def test_the_token_is_in_no_log_line_even_at_debug(ha, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, websockets' too
    logging.getLogger("websockets").setLevel(logging.DEBUG)
    try:
        assert fetch_names(ha.url, TOKEN, timeout_s=5) == EXPECTED
        ha.behaviour["get_states"] = "close"
        with pytest.raises(HomeAssistantError):
            fetch_names(ha.url, TOKEN, timeout_s=5)
    finally:
        logging.getLogger("websockets").setLevel(logging.NOTSET)
    def shows_the_token(record: logging.LogRecord) -> bool:  # websockets elides a frame's middle
        return TOKEN[:12] in record.getMessage() or TOKEN[-12:] in record.getMessage()

    # websockets logs every frame at DEBUG: the test server's side shows the token...
    assert any(shows_the_token(r) for r in caplog.records if r.name == "websockets.server")
    # ...edgeasr's side never
    assert not [r.getMessage() for r in caplog.records if r.name != "websockets.server" and shows_the_token(r)]


def test_http_urls_are_taken_as_websocket_ones():
    assert websocket_url("http://ha.lan:8123") == "ws://ha.lan:8123/api/websocket"
    assert websocket_url("https://ha.example.org/") == "wss://ha.example.org/api/websocket"
    assert websocket_url("ws://[::1]:8123/api/websocket") == "ws://[::1]:8123/api/websocket"


def test_a_home_assistant_without_floors_has_none(ha):
    ha.behaviour["config/floor_registry/list"] = ("error", "unknown_command", "Unknown command.")
    names = fetch_names(ha.url, TOKEN, timeout_s=5)
    assert names.names == EXPECTED.names[:-1]


FAILURES = [
    ({}, "bad-token", "authentication refused (Invalid access token or password): check homeassistant.token_file"),
    ({"homeassistant/expose_entity/list": ("error", "unauthorized", "Unauthorized")}, TOKEN,
     "homeassistant/expose_entity/list failed: unauthorized (Unauthorized) (the token must be an administrator's)"),
    ({"get_states": "close"}, TOKEN, "the connection closed (code 1000) waiting for the answer to get_states"),
    ({"config/area_registry/list": "silent"}, TOKEN,
     "no answer within 0.5 s waiting for the answer to config/area_registry/list"),
]


@pytest.mark.parametrize("behaviour, token, message", FAILURES, ids=["auth_invalid", "success false", "closed",
                                                                       "no answer"])
def test_every_failure_is_one_line_saying_why(ha, behaviour, token, message):
    ha.behaviour.update(behaviour)
    started = time.monotonic()
    with pytest.raises(HomeAssistantError) as info:
        fetch_names(ha.url, token, timeout_s=0.5)
    assert str(info.value) == message
    assert time.monotonic() - started < 3  # bounded by the timeout, not by the server
    assert info.value.exit_code == 69


def test_a_wrong_path_or_a_closed_port_is_named(ha):
    with pytest.raises(HomeAssistantError, match=r"^HTTP 404 to the websocket upgrade \(is the path /api/websocket\?\)$"):
        fetch_names(ha.url.replace("/api/websocket", "/websocket"), TOKEN, timeout_s=2)
    ha.close()
    with pytest.raises(HomeAssistantError, match=r"^cannot connect \(.*[Rr]efused.*\)$"):
        fetch_names(ha.url, TOKEN, timeout_s=2)


@contextlib.contextmanager
def refreshing(ha: FakeHomeAssistant, refresh_s: float) -> Iterator[HomeAssistantNames]:
    """A started refresher whose first fetch got the whole home; closed on leaving."""
    names = HomeAssistantNames(ha.url, TOKEN, refresh_s=refresh_s, timeout_s=2)
    names.start()
    try:
        assert names.wait_for_attempts(1, 10) and names.current() == EXPECTED
        yield names
    finally:
        names.close()


def test_the_refresher_picks_up_a_renamed_entity(ha, caplog):
    caplog.set_level(logging.DEBUG, LOGGER)
    with refreshing(ha, refresh_s=0.2) as names:
        ha.registry["light.reading_lamp"] = {**REGISTRY["light.reading_lamp"], "name": "Desk Lamp"}
        assert names.wait_for_attempts(names.attempts + 2, 10)
        lamp = [n for n in names.current().names if n.domain == "light" and "Lamp" in n.name]
        assert lamp == [HomeName("Desk Lamp", "entity", "light", ("Big light", "Reading Lamp"))]
    assert names.failures == 0 and ha.connections >= 3
    infos = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]
    assert len(infos) == 2  # the first list and the change; the same list again is DEBUG only
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


def test_a_failure_after_a_good_fetch_keeps_the_last_good_list_and_logs_one_line_each(ha, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    with refreshing(ha, refresh_s=0.1) as names:
        ha.behaviour["get_states"] = "close"
        assert names.wait_for_attempts(names.attempts + 3, 10)
        assert names.current() == EXPECTED and names.failures >= 3
        del ha.behaviour["get_states"]  # back: the same list, fetched again
        failures = names.failures
        assert names.wait_for_attempts(names.attempts + 2, 10) and names.failures <= failures + 1
        assert names.current() == EXPECTED
    mine = [r for r in caplog.records if r.name == LOGGER]
    warnings = [r.getMessage() for r in mine if r.levelno == logging.WARNING]
    assert len(warnings) == names.failures  # one line per failure, no more
    assert set(warnings) == {f"Home Assistant names from {ha.url}: the connection closed (code 1000) waiting for "
                             "the answer to get_states; keeping the last good list (4 entities, 2 areas, 1 floors, "
                             "language en)"}
    # the first list and the one after the failures, though the same: INFO once each
    assert [r.getMessage() for r in mine if r.levelno == logging.INFO] == [
        f"Home Assistant names from {ha.url}: 4 entities, 2 areas, 1 floors, language en"] * 2
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


def test_before_any_good_fetch_there_are_no_names_and_close_ends_a_fetch_under_way(ha, caplog):
    ha.behaviour["get_config"] = "silent"
    names = HomeAssistantNames(ha.url, TOKEN, refresh_s=300, timeout_s=30)
    names.start()
    wait_until(lambda: len(ha.received) >= 2, 10)  # auth, then get_config: the fetch waits for its answer
    assert len(ha.received) == 2 and names.current() == Vocabulary()
    started = time.monotonic()
    names.close()
    assert time.monotonic() - started < 5 and not names._thread.is_alive()
    assert not [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def test_the_token_file_warns_when_others_may_read_it(tmp_path, caplog):
    caplog.set_level(logging.WARNING, LOGGER)
    section = HomeAssistantApiConfig(url="ws://127.0.0.1:9/api/websocket", token_file=token_file(tmp_path, 0o600))
    assert HomeAssistantNames.from_config(section) is not None
    assert not caplog.records
    for mode in (0o640, 0o604):
        section = HomeAssistantApiConfig(url="ws://127.0.0.1:9", token_file=token_file(tmp_path, mode))
        HomeAssistantNames.from_config(section)
    assert [r.getMessage() for r in caplog.records] == [
        f"homeassistant.token_file: {tmp_path / 'ha-token'} may be read by others than its owner ({mode}); restrict "
        f"it: chmod 600 {tmp_path / 'ha-token'}" for mode in ("-rw-r-----", "-rw----r--")]
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


def test_a_missing_or_empty_token_file_stops_the_start(tmp_path):
    with pytest.raises(MissingInputError) as info:
        HomeAssistantNames.from_config(HomeAssistantApiConfig(url="ws://h:1", token_file=tmp_path / "absent"))
    assert str(info.value) == (f"homeassistant.token_file: cannot read {tmp_path / 'absent'}: No such file or "
                               "directory") and info.value.exit_code == 66
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError) as info:
        HomeAssistantNames.from_config(HomeAssistantApiConfig(url="ws://h:1", token_file=tmp_path / "empty"))
    assert str(info.value) == f"homeassistant.token_file: {tmp_path / 'empty'} is empty"
    assert info.value.exit_code == 78
    assert HomeAssistantNames.from_config(HomeAssistantApiConfig()) is None


def test_the_source_puts_the_configs_names_first_and_each_name_once(ha, tmp_path):
    home = tmp_path / "home.yaml"
    home.write_text("areas: [Kitchen, Conservatory]\nentities:\n"
                    "  - {name: reading lamp, domain: light, aliases: [Study light]}\n")
    vocabulary = VocabularyConfig(home=home, names=("Grandma's Radio",), terms=("Zigbee",))
    source = VocabularySource(vocabulary, HomeAssistantApiConfig(url=ha.url, token_file=token_file(tmp_path),
                                                                 refresh_s=300))
    try:
        assert source.homeassistant is not None and source.homeassistant.wait_for_attempts(1, 10)
        merged = source.current()
    finally:
        source.close()
    assert merged.terms == ("Zigbee",) and merged.language == "en"
    spoken = [(n.kind, n.name.casefold()) for n in merged.names]
    assert len(spoken) == len(set(spoken)) == 9  # 4 of the config's + 7 of Home Assistant's - 2 said by both
    # the config's version of a name said by both, and the config's own names before Home Assistant's
    assert HomeName("reading lamp", "entity", "light", ("Study light",)) in merged.names
    assert HomeName("Kitchen", "area") in merged.names
    assert merged.names.index(HomeName("Conservatory", "area")) < merged.names.index(
        HomeName("Zentrix Thermo-X", "entity", "climate"))
    assert merged.names.index(HomeName("Grandma's Radio", "name")) < merged.names.index(
        HomeName("Kettle", "entity", "switch"))


def run_check(tmp_path: Path, **sections: dict) -> subprocess.CompletedProcess:
    config = tmp_path / "edgeasr.yaml"
    config.write_text(yaml.safe_dump({"input": {"source": "none"}, "wyoming": {"uri": "tcp://127.0.0.1:10300"},
                                      "state_dir": str(tmp_path / "state"), **sections}))
    return subprocess.run([sys.executable, "-m", "edgeasr", "check", "--config", str(config)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def test_check_loads_the_home_file_reads_home_assistant_and_fails_as_the_daemon_would(ha, tmp_path):
    (tmp_path / "home.yaml").write_text("areas: [Kitchen, Hall]\nentities:\n  - {name: Lamp, domain: light}\n")
    token = token_file(tmp_path)
    good = run_check(tmp_path, vocabulary={"home": "home.yaml", "terms": ["Zigbee"]},
                     homeassistant={"url": ha.url.replace("ws://", "http://").replace("/api/websocket", ""),
                                    "token_file": "ha-token"})
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"vocabulary: ok (home {tmp_path / 'home.yaml'}: 2 areas, 1 entities; 1 terms)\n" in good.stdout
    assert f"home assistant: ok ({ha.url}: 4 entities exposed to Assist, 2 areas, 1 floors)\n" in good.stdout
    assert TOKEN not in good.stdout + good.stderr

    ha.close()  # a Home Assistant that cannot be read: reported, and the daemon would run on
    down = run_check(tmp_path, homeassistant={"url": ha.url, "token_file": str(token)})
    assert down.returncode == 0 and f"home assistant: not read ({ha.url}: cannot connect (" in down.stdout

    (tmp_path / "home.yaml").write_text("entities:\n  - {domain: light}\n")
    bad = run_check(tmp_path, vocabulary={"home": "home.yaml"})
    assert bad.returncode == 78, bad.stdout + bad.stderr
    assert bad.stderr.splitlines()[-1] == f"edgeasr: vocabulary.home: {tmp_path / 'home.yaml'}: entities[0]: no name"

    missing = run_check(tmp_path, homeassistant={"url": ha.url, "token_file": "absent"})
    assert missing.returncode == 66, missing.stdout + missing.stderr
    assert "home assistant: FAILED: homeassistant.token_file: cannot read " in missing.stdout


def test_without_websockets_the_start_fails_with_69(monkeypatch):
    for name in [m for m in sys.modules if m == "websockets" or m.startswith("websockets.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    with pytest.raises(ToolMissingError) as info:
        HomeAssistantNames("ws://ha.lan:8123", TOKEN, refresh_s=300)
    assert str(info.value).startswith("homeassistant.url is set but websockets cannot load (")
    assert str(info.value).endswith("pip install 'websockets>=15,<18'") and info.value.exit_code == 69
