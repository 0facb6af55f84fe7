"""A fresh Home Assistant made into the home under test, through its own APIs only: areas, the
entities' names, aliases and areas, what is exposed to Assist, the shopping list, Wyoming
services and a satellite added by the wyoming integration's config flow, and one Assist
pipeline per speech-to-text service (the built-in conversation agent, no text-to-speech).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from edgeasr.lab.evaluation.assist_hass import Hass, HomeAssistantFailed, Release
from edgeasr.lab.evaluation.assist_home import AssistHome, HomeEntity, exposed_ids

log = logging.getLogger(__name__)

ASSISTANT = "conversation"  # Assist, in the exposure settings
REGISTRY_WAIT_S = 60.0  # a config entry's entities and device appear within seconds
HOST = "127.0.0.1"


@dataclass(frozen=True)
class SatelliteDevice:
    device_id: str
    entry_id: str
    # what tells that the satellite's pipeline run is over: its assist_satellite entity going
    # idle, or before that entity (2024.9) its binary_sensor "assist in progress" going off
    indicator: str
    idle: str


@dataclass(frozen=True)
class HomeIds:
    entities: dict[str, HomeEntity]  # entity_id -> the home's entity
    areas: dict[str, str]  # area name -> area_id


def agent_id(release: Release) -> str:
    """The built-in conversation agent's id: an entity since 2024.6."""
    return "conversation.home_assistant" if (release.year, release.month) >= (2024, 6) else "homeassistant"


async def make_home(hass: Hass, home: AssistHome) -> HomeIds:
    """Areas, names, aliases, areas of entities and exposure, as the home file says."""
    if any(e.domain == "todo" for e in home.entities):
        await _flow(hass, "shopping_list", {})
    # onboarding makes a few areas, named in the home's language ("Wohnzimmer"): none stays
    for area in await hass.call("config/area_registry/list"):
        await hass.call("config/area_registry/delete", area_id=area["area_id"])
    areas = {}
    for area in home.areas:
        made = await hass.call("config/area_registry/create", name=area.name, aliases=list(area.aliases))
        areas[area.name] = made["area_id"]
    entities = await _wait_for(hass, lambda found: len(found) == len(home.entities), home)
    for entity_id, e in entities.items():
        await hass.call("config/entity_registry/update", entity_id=entity_id, name=e.name,
                        aliases=list(e.aliases), area_id=areas[e.area])
    await hass.call("homeassistant/expose_new_entities/set", assistant=ASSISTANT, expose_new=False)
    states = await hass.call("get_states")
    others = [s["entity_id"] for s in states if s["entity_id"] not in entities]
    await hass.call("homeassistant/expose_entity", assistants=[ASSISTANT], entity_ids=others, should_expose=False)
    await hass.call("homeassistant/expose_entity", assistants=[ASSISTANT], entity_ids=list(entities),
                    should_expose=True)
    return HomeIds(entities, areas)


async def _wait_for(hass: Hass, complete, home: AssistHome) -> dict[str, HomeEntity]:
    """The home's entities in the registry, once `complete` says all are there (the shopping
    list's appears a moment after its entry); what is there after REGISTRY_WAIT_S otherwise."""
    found: dict[str, HomeEntity] = {}
    async with hass.subscribe("subscribe_events", event_type="entity_registry_updated") as events:
        try:
            async with asyncio.timeout(REGISTRY_WAIT_S):
                while not complete(found := exposed_ids(home, await hass.call("config/entity_registry/list"))):
                    await events.get()
        except TimeoutError:
            missing = {e.name for e in home.entities} - {e.name for e in found.values()}
            log.warning("not in Home Assistant's entity registry (left out): %s", ", ".join(sorted(missing)))
    return found


async def _flow(hass: Hass, handler: str, answer: dict) -> dict:
    """A config flow started and its form answered: the created entry's result."""
    step = await hass.rest("/api/config/config_entries/flow", {"handler": handler, "show_advanced_options": False})
    while step.get("type") == "form":
        step = await hass.rest(f"/api/config/config_entries/flow/{step['flow_id']}", answer)
        if step.get("errors"):
            raise HomeAssistantFailed(f"{handler}'s config flow refused {answer}: {step['errors']}")
    if step.get("type") != "create_entry":
        raise HomeAssistantFailed(f"{handler}'s config flow ended with {step.get('type')}: {step.get('reason')}")
    return dict(step["result"])


async def add_wyoming(hass: Hass, port: int) -> str:
    """A Wyoming speech-to-text service at 127.0.0.1:`port`, by the config flow: its stt entity."""
    entry = await _flow(hass, "wyoming", {"host": HOST, "port": port})
    entities = await _entry_entities(hass, entry["entry_id"], "stt.")
    return entities[0]


async def _entry_entities(hass: Hass, entry_id: str, domain: str) -> list[str]:
    """The entities of a config entry (of `domain`, or all when it is ""), once there are some."""
    async with hass.subscribe("subscribe_events", event_type="entity_registry_updated") as events:
        async with asyncio.timeout(REGISTRY_WAIT_S):
            while True:
                ids = [e["entity_id"] for e in await hass.call("config/entity_registry/list")
                       if e.get("config_entry_id") == entry_id and e["entity_id"].startswith(domain)]
                if ids:
                    return ids
                await events.get()


async def add_satellite(hass: Hass, port: int, area_id: str) -> SatelliteDevice:
    """The satellite at 127.0.0.1:`port`, by the wyoming config flow; its device put in `area_id`
    through the device registry (the integration suggests the area the satellite names too)."""
    entry = await _flow(hass, "wyoming", {"host": HOST, "port": port})
    devices = [d for d in await hass.call("config/device_registry/list") if entry["entry_id"] in d["config_entries"]]
    if not devices:
        raise HomeAssistantFailed("the wyoming integration made no device for the satellite")
    device_id = devices[0]["id"]
    await hass.call("config/device_registry/update", device_id=device_id, area_id=area_id)
    entities = await _entry_entities(hass, entry["entry_id"], "")
    satellites = [e for e in entities if e.startswith("assist_satellite.")]
    if satellites:
        return SatelliteDevice(device_id, entry["entry_id"], satellites[0], "idle")
    sensors = [e for e in entities if e.startswith("binary_sensor.")]
    return SatelliteDevice(device_id, entry["entry_id"], sensors[0], "off")


async def add_pipeline(hass: Hass, name: str, stt_entity: str, language: str, release: Release) -> str:
    """An Assist pipeline: `stt_entity`, the built-in agent, no wake word or text-to-speech."""
    made = await hass.call("assist_pipeline/pipeline/create", name=name, language=language,
                           conversation_engine=agent_id(release), conversation_language=language,
                           stt_engine=stt_entity, stt_language=language, tts_engine=None, tts_language=None,
                           tts_voice=None, wake_word_entity=None, wake_word_id=None)
    return str(made["id"])
