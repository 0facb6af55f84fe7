"""A loopback websocket server speaking Home Assistant's websocket API, with a made-up home.

No real Home Assistant runs with it (helpers.assist starts one for the Assist tests): the server
is a real websocket server (the `websockets` package, on 127.0.0.1) that speaks the protocol as
home-assistant/core documents it in its source: `auth_required`, `auth` with the access token, `auth_ok` or `auth_invalid`, then
`result` messages by command id, each command answering with the shape its handler in core sends
(components/websocket_api, components/homeassistant/exposed_entities.py,
components/config/{entity,area,floor}_registry.py)."""

from __future__ import annotations

import copy
import json
import threading

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import serve

TOKEN = "eyJ0eXAiOiJKV1QiLCJhbGciOiJIUzI1NiJ9.made-up-for-the-tests.c2lnbmF0dXJl"

# A made-up home, as Home Assistant's registries would describe it.
EXPOSED = {
    "light.reading_lamp": {"conversation": True, "cloud.alexa": False},
    "climate.thermo_x": {"conversation": True},   # named by its device: the friendly name says it all
    "switch.kettle": {"conversation": True},      # a YAML entity: no registry entry
    "light.porch": {"conversation": True},
    "sensor.nameless": {"conversation": True},    # no name anywhere: left out
    "cover.garage": {"cloud.alexa": True},        # exposed, but not to Assist
    "fan.attic": {"conversation": False},
    "lock.front_door": {},
}
REGISTRY = {
    "light.reading_lamp": {"entity_id": "light.reading_lamp", "name": "Reading Lamp", "original_name": "Lamp",
                           "aliases": ["Big light", None, "  "], "has_entity_name": True},
    "climate.thermo_x": {"entity_id": "climate.thermo_x", "name": None, "original_name": "Thermostat",
                         "aliases": [], "has_entity_name": True},
    "light.porch": {"entity_id": "light.porch", "name": "Porch Light", "original_name": None, "aliases": []},
    "sensor.nameless": {"entity_id": "sensor.nameless", "name": None, "original_name": None, "aliases": []},
    "cover.garage": {"entity_id": "cover.garage", "name": "Garage Door", "aliases": []},
}
STATES = [
    {"entity_id": "light.reading_lamp", "state": "on", "attributes": {"friendly_name": "Reading Lamp"}},
    {"entity_id": "climate.thermo_x", "state": "heat", "attributes": {"friendly_name": "Zentrix Thermo-X"}},
    {"entity_id": "switch.kettle", "state": "off", "attributes": {"friendly_name": "Kettle"}},
    {"entity_id": "light.porch", "state": "off", "attributes": {"friendly_name": "Front Porch"}},
    {"entity_id": "cover.garage", "state": "closed", "attributes": {"friendly_name": "Garage Door"}},
]
AREAS = [{"area_id": "living_room", "name": "Living Room", "aliases": ["Lounge"], "floor_id": "ground",
          "icon": None, "labels": [], "picture": None},
         {"area_id": "kitchen", "name": "Kitchen", "aliases": [], "floor_id": None}]
FLOORS = [{"floor_id": "ground", "name": "Ground Floor", "aliases": ["Downstairs"], "icon": None, "level": 0}]

class FakeHomeAssistant:
    """A loopback websocket server speaking Home Assistant's websocket protocol. `behaviour`
    maps a command type to what the server does instead of answering: ("error", code, message),
    "close" (the connection ends), "silent" (no answer)."""

    def __init__(self) -> None:
        self.registry = copy.deepcopy(REGISTRY)
        self.states = copy.deepcopy(STATES)
        self.floors: list | None = copy.deepcopy(FLOORS)
        self.behaviour: dict[str, object] = {}
        self.received: list[dict] = []
        self.connections = 0
        # no permessage-deflate: frames in the clear, as the log would show them
        self._server = serve(self._handle, "127.0.0.1", 0, process_request=self._route, compression=None)
        self.url = f"ws://127.0.0.1:{self._server.socket.getsockname()[1]}/api/websocket"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join(5)

    def _route(self, conn, request):
        if request.path != "/api/websocket":
            return conn.respond(404, "Not Found\n")
        return None

    def _handle(self, conn) -> None:
        self.connections += 1
        conn.send(json.dumps({"type": "auth_required", "ha_version": "2026.11.0"}))
        try:
            auth = json.loads(conn.recv(timeout=10))
            self.received.append(auth)
            if auth != {"type": "auth", "access_token": TOKEN}:
                conn.send(json.dumps({"type": "auth_invalid", "message": "Invalid access token or password"}))
                return
            conn.send(json.dumps({"type": "auth_ok", "ha_version": "2026.11.0"}))
            while True:
                message = json.loads(conn.recv(timeout=30))
                self.received.append(message)
                kind, iden = message["type"], message["id"]
                what = self.behaviour.get(kind)
                if what == "close":
                    return
                if what == "silent":
                    continue
                if isinstance(what, tuple):
                    conn.send(json.dumps({"id": iden, "type": "result", "success": False,
                                          "error": {"code": what[1], "message": what[2]}}))
                    continue
                if kind == "get_states":  # an event for another subscription comes first
                    conn.send(json.dumps({"id": 99, "type": "event", "event": {"event_type": "state_changed"}}))
                conn.send(json.dumps({"id": iden, "type": "result", "success": True,
                                      "result": self._answer(message)}))
        except (ConnectionClosed, TimeoutError):
            return

    def _answer(self, message: dict) -> object:
        kind = message["type"]
        if kind == "get_config":
            return {"language": "en", "location_name": "Home", "version": "2026.11.0"}
        if kind == "homeassistant/expose_entity/list":
            return {"exposed_entities": EXPOSED}
        if kind == "config/entity_registry/get_entries":
            return {eid: self.registry.get(eid) for eid in message["entity_ids"]}
        if kind == "get_states":
            return self.states
        if kind == "config/area_registry/list":
            return AREAS
        if kind == "config/floor_registry/list" and self.floors is not None:
            return self.floors
        raise AssertionError(f"unexpected command {kind}")
