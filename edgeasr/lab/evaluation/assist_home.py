"""A home file (docs/vocabulary.md) as a real Home Assistant's configuration: one entity per
entity of the file, made without hardware, each in an area, and what resets it.

Each entity is a template, `universal` or `generic_thermostat` entity whose state lives in
helpers (input_boolean, input_number, input_select) where the platform keeps none of its own, so
that what a command did is visible in the states and undone by setting the helpers back. The
entities' areas: one whose name holds an area's name goes there ("Kitchen Pendants"); the others
of each domain take the areas in turn from the satellite's (the home's first area), so that a
command with no name ("pause", "turn on the lights") has something of its kind where the
satellite is. Domains without a platform that works offline (lawn_mower, ...) are left out.
Written for Home Assistant 2024.3 and later (`service:` in actions, legacy template platforms).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeasr.errors import ConfigError
from edgeasr.stages import HomeName, Vocabulary

log = logging.getLogger(__name__)

PREFIX = "edgeasr"  # of every unique_id and helper the harness makes
ROOM_TEMPERATURE = 21.0  # the thermostats' sensors
TARGET_TEMPERATURE = 20.0  # the thermostats' set point after a reset
VOLUME = 0.3  # the media players' volume after a reset
OUTDOOR_TEMPERATURE = 14.0  # the weather's
SENSOR_VALUE = 42  # a plain sensor's state
NOOP = [{"delay": 0}]  # an action that does nothing (a platform that requires one)
MEDIA_STATES = ["playing", "paused", "idle", "off"]
VACUUM_STATES = ["docked", "cleaning", "returning"]
# the attributes a command may change, per domain: what a snapshot keeps besides the state
WATCHED: dict[str, tuple[str, ...]] = {
    "light": ("brightness", "hs_color", "rgb_color", "color_temp_kelvin"),
    "cover": ("current_position",),
    "fan": ("percentage",),
    "climate": ("temperature", "hvac_mode"),
    "media_player": ("volume_level", "is_volume_muted"),
}
VOLATILE_DOMAINS = frozenset({"scene", "script"})  # their state is a time: their helpers tell instead


@dataclass(frozen=True)
class HomeEntity:
    domain: str
    name: str
    object_id: str
    area: str
    aliases: tuple[str, ...] = ()

    @property
    def unique_id(self) -> str:
        return f"{PREFIX}_{self.domain}_{self.object_id}"


@dataclass(frozen=True)
class AssistHome:
    language: str
    areas: tuple[HomeName, ...]
    entities: tuple[HomeEntity, ...]
    vocabulary: Vocabulary  # the home files' names, merged: what the commands are read against

    @property
    def satellite_area(self) -> str:
        return self.areas[0].name


@dataclass(frozen=True)
class Call:
    """A service call: what puts part of the home back as it was."""

    domain: str
    service: str
    data: dict[str, Any] = field(default_factory=dict)


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.casefold()).strip("_") or "x"


def home_from_files(paths: list[Path]) -> AssistHome:
    """The home files at `paths` as one home (a name in several counts once, the first), each
    entity placed in an area (the module's docstring); the first file's first area is the
    satellite's."""
    from edgeasr.home.names import load_home

    vocabulary = Vocabulary()
    for path in paths:
        vocabulary = vocabulary.merged(load_home(path, key="--home"))
    areas = tuple(n for n in vocabulary.names if n.kind == "area")
    if not areas:
        raise ConfigError(f"--home: {', '.join(map(str, paths))}: Home Assistant's home needs at least one area "
                          "(the satellite's)")
    entities = [n for n in vocabulary.names if n.kind == "entity"]
    skipped = sorted({n.domain or "?" for n in entities if n.domain not in BUILDERS})
    if skipped:
        log.info("no offline Home Assistant platform for %s: those entities are left out", ", ".join(skipped))
    return AssistHome(vocabulary.language or "en", areas, _placed([n for n in entities if n.domain in BUILDERS],
                                                                   [a.name for a in areas]), vocabulary)


def _placed(names: list[HomeName], areas: list[str]) -> tuple[HomeEntity, ...]:
    turns: dict[str, int] = {}
    placed, seen = [], set()
    for n in names:
        assert n.domain is not None
        object_id = slug(n.name)
        if (n.domain, object_id) in seen:
            continue
        seen.add((n.domain, object_id))
        named = [a for a in areas if a.casefold() in n.name.casefold()]
        if named:
            area = max(named, key=len)
        else:
            turn = turns.get(n.domain, 0)
            turns[n.domain] = turn + 1
            area = areas[turn % len(areas)]
        placed.append(HomeEntity(n.domain, n.name, object_id, area, n.aliases))
    return tuple(placed)


# ---- the configuration ------------------------------------------------------------------------


class _Config:
    """configuration.yaml being written: platform lists, helpers, scripts, scenes."""

    def __init__(self) -> None:
        self.platforms: dict[str, list[dict]] = {}
        self.helpers: dict[str, dict[str, dict]] = {}
        self.top: dict[str, Any] = {}
        self.resets: list[Call] = []

    def platform(self, domain: str, entry: dict) -> None:
        self.platforms.setdefault(domain, []).append(entry)

    def helper(self, domain: str, object_id: str, spec: dict, reset: Call) -> str:
        self.helpers.setdefault(domain, {})[object_id] = spec
        self.resets.append(reset)
        return f"{domain}.{object_id}"

    def flag(self, e: HomeEntity, what: str) -> str:
        """An input_boolean that is off after a reset."""
        oid = f"{PREFIX}_{e.object_id}_{what}"
        return self.helper("input_boolean", oid, {"name": f"{e.name} {what}"},
                           Call("input_boolean", "turn_off", {"entity_id": f"input_boolean.{oid}"}))

    def number(self, e: HomeEntity, what: str, value: float, low: float, high: float, step: float) -> str:
        oid = f"{PREFIX}_{e.object_id}_{what}"
        return self.helper("input_number", oid, {"name": f"{e.name} {what}", "min": low, "max": high,
                                                 "step": step, "initial": value, "mode": "box"},
                           Call("input_number", "set_value", {"entity_id": f"input_number.{oid}", "value": value}))

    def choice(self, e: HomeEntity, what: str, options: list[str]) -> str:
        oid = f"{PREFIX}_{e.object_id}_{what}"
        return self.helper("input_select", oid, {"name": f"{e.name} {what}", "options": options,
                                                 "initial": options[0]},
                           Call("input_select", "select_option", {"entity_id": f"input_select.{oid}",
                                                                  "option": options[0]}))


def _set(service: str, entity_id: str, **data: Any) -> list[dict]:
    return [{"service": service, "target": {"entity_id": entity_id}, **({"data": data} if data else {})}]


def _select(entity_id: str, option: str) -> list[dict]:
    return _set("input_select.select_option", entity_id, option=option)


def _optimistic(c: _Config, e: HomeEntity, key: str, actions: tuple[str, ...], reset: str, **extra: Any) -> None:
    """A template entity that keeps its own state (no value template), actions that do nothing."""
    c.platform(e.domain, {"platform": "template", key: {e.object_id: {
        "unique_id": e.unique_id, "friendly_name": e.name, **dict.fromkeys(actions, NOOP), **extra}}})
    c.resets.append(Call(e.domain, reset, {"entity_id": f"{e.domain}.{e.object_id}"}))


def _light(c: _Config, e: HomeEntity) -> None:
    _optimistic(c, e, "lights", ("turn_on", "turn_off", "set_level", "set_hs", "set_temperature"), "turn_off")


def _switch(c: _Config, e: HomeEntity) -> None:
    _optimistic(c, e, "switches", ("turn_on", "turn_off"), "turn_off")


def _cover(c: _Config, e: HomeEntity) -> None:
    _optimistic(c, e, "covers", ("open_cover", "close_cover", "stop_cover", "set_cover_position"), "close_cover",
                optimistic=True)


def _lock(c: _Config, e: HomeEntity) -> None:
    unlocked = c.flag(e, "unlocked")
    c.platform("lock", {"platform": "template", "unique_id": e.unique_id, "name": e.name,
                        "value_template": f"{{{{ is_state('{unlocked}', 'off') }}}}",
                        "lock": _set("input_boolean.turn_off", unlocked),
                        "unlock": _set("input_boolean.turn_on", unlocked)})


def _fan(c: _Config, e: HomeEntity) -> None:
    _optimistic(c, e, "fans", ("turn_on", "turn_off", "set_percentage"), "turn_off", speed_count=10)


def _vacuum(c: _Config, e: HomeEntity) -> None:
    state = c.choice(e, "state", VACUUM_STATES)
    c.platform("vacuum", {"platform": "template", "vacuums": {e.object_id: {
        "unique_id": e.unique_id, "friendly_name": e.name, "value_template": f"{{{{ states('{state}') }}}}",
        "start": _select(state, "cleaning"), "stop": _select(state, "docked"),
        "pause": _select(state, "docked"), "return_to_base": _select(state, "returning")}}})


def _media_player(c: _Config, e: HomeEntity) -> None:
    state = c.choice(e, "state", MEDIA_STATES)
    volume = c.number(e, "volume", VOLUME, 0, 1, 0.01)
    track = c.number(e, "track", 1, 1, 1000, 1)
    commands = {"turn_on": _select(state, "idle"), "turn_off": _select(state, "off"),
                "media_play": _select(state, "playing"), "media_pause": _select(state, "paused"),
                "media_stop": _select(state, "idle"), "media_next_track": _set("input_number.increment", track),
                "media_previous_track": _set("input_number.decrement", track),
                "volume_set": _set("input_number.set_value", volume, value="{{ volume_level }}")}
    # universal's commands are one service call each, not a script
    c.platform("media_player", {"platform": "universal", "name": e.name, "unique_id": e.unique_id,
                                "state_template": f"{{{{ states('{state}') }}}}",
                                "attributes": {"volume_level": volume, "media_track": track},
                                "commands": {k: v[0] for k, v in commands.items()}})
    # a player is playing after a reset: "pause" and "next" have something to act on
    c.resets.append(Call("input_select", "select_option", {"entity_id": state, "option": "playing"}))


def _climate(c: _Config, e: HomeEntity) -> None:
    sensor = f"{PREFIX}_{e.object_id}_room"
    c.top.setdefault("template", []).append({"sensor": [{
        "name": f"{e.name} room", "unique_id": f"{PREFIX}_{sensor}", "unit_of_measurement": "°C",
        "device_class": "temperature", "state": str(ROOM_TEMPERATURE)}]})
    heater = f"{PREFIX}_{e.object_id}_heater"
    c.platform("switch", {"platform": "template", "switches": {heater: {
        "unique_id": f"{PREFIX}_{heater}", "friendly_name": f"{e.name} heater", "turn_on": NOOP,
        "turn_off": NOOP}}})
    c.platform("climate", {"platform": "generic_thermostat", "name": e.name, "unique_id": e.unique_id,
                           "heater": f"switch.{heater}", "target_sensor": f"sensor.{slug(e.name + ' room')}",
                           "target_temp": TARGET_TEMPERATURE, "initial_hvac_mode": "heat",
                           "min_temp": 5, "max_temp": 35, "precision": 0.5})
    c.resets.append(Call("climate", "set_temperature", {"entity_id": f"climate.{e.object_id}",
                                                        "temperature": TARGET_TEMPERATURE}))


def _sensor(c: _Config, e: HomeEntity) -> None:
    c.top.setdefault("template", []).append({"sensor": [{"name": e.name, "unique_id": e.unique_id,
                                                         "state": str(SENSOR_VALUE)}]})


def _weather(c: _Config, e: HomeEntity) -> None:
    c.platform("weather", {"platform": "template", "name": e.name, "unique_id": e.unique_id,
                           "condition_template": "sunny", "temperature_template": str(OUTDOOR_TEMPERATURE),
                           "humidity_template": "{{ 50 }}", "temperature_unit": "°C"})


def _scene(c: _Config, e: HomeEntity) -> None:
    done = c.flag(e, "activated")
    c.top.setdefault("scene", []).append({"name": e.name, "id": e.unique_id, "entities": {done: "on"}})


def _script(c: _Config, e: HomeEntity) -> None:
    done = c.flag(e, "ran")
    # a YAML script's unique_id is its key
    c.top.setdefault("script", {})[e.unique_id] = {"alias": e.name, "sequence": _set("input_boolean.turn_on", done)}


def _todo(c: _Config, e: HomeEntity) -> None:
    # the shopping list's entry is made by its config flow (assist_setup); emptied on reset
    c.resets += [Call("shopping_list", "complete_all"), Call("shopping_list", "clear_completed_items")]


BUILDERS = {"light": _light, "switch": _switch, "cover": _cover, "lock": _lock, "fan": _fan, "vacuum": _vacuum,
            "media_player": _media_player, "climate": _climate, "sensor": _sensor, "weather": _weather,
            "scene": _scene, "script": _script, "todo": _todo}


def configuration(home: AssistHome, port: int) -> tuple[dict[str, Any], tuple[Call, ...]]:
    """configuration.yaml for `home`, served on 127.0.0.1:`port`, and the calls that reset it.
    No `default_config`: only what Assist and the home need, nothing that reaches the internet."""
    c = _Config()
    todo = [e for e in home.entities if e.domain == "todo"][:1]  # Home Assistant has one shopping list
    for e in home.entities:
        if e.domain != "todo" or e in todo:
            BUILDERS[e.domain](c, e)
    config: dict[str, Any] = {
        "homeassistant": {"name": "edgeasr test home", "latitude": 52.0, "longitude": 4.0, "elevation": 0,
                          "unit_system": "metric", "time_zone": "UTC", "currency": "EUR", "country": "NL",
                          "language": home.language},
        "http": {"server_host": "127.0.0.1", "server_port": port},
        "logger": {"default": "warning"},
        **{name: {} for name in ("api", "config", "onboarding", "conversation", "assist_pipeline", "intent",
                                 "websocket_api", "person")},
        **c.top, **c.platforms, **c.helpers,
    }
    return config, tuple(c.resets)


def exposed_ids(home: AssistHome, registry: Iterable[dict]) -> dict[str, HomeEntity]:
    """The home's entities by entity_id, found in the entity registry's list by unique_id (a todo
    by the shopping list's platform)."""
    by_unique = {e.unique_id: e for e in home.entities}
    todo = next((e for e in home.entities if e.domain == "todo"), None)
    found: dict[str, HomeEntity] = {}
    for entry in registry:
        entity = by_unique.get(entry.get("unique_id") or "")
        if entity is None and todo is not None and entry.get("platform") == "shopping_list":
            entity = todo
        if entity is not None:
            found[entry["entity_id"]] = entity
    return found
