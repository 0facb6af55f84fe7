"""The names Home Assistant exposes to Assist, read over its websocket API, kept fresh on a
thread of its own. The only module that imports `websockets` (lazily).

One fetch is one connection to `ws(s)://HOST:8123/api/websocket`: Home Assistant greets with
`auth_required`; the client answers `{"type": "auth", "access_token": ...}` and waits for
`auth_ok` (`auth_invalid` ends it); then one command at a time, each with the next `id`, each
answered by `{"id", "type": "result", "success", "result" | "error": {"code", "message"}}`:

- `get_config`: the home's `language`;
- `homeassistant/expose_entity/list` (administrators only): `{"exposed_entities": {entity_id:
  {"conversation": true, ...}}}`; only the entities exposed to `conversation` (Assist) count;
- `config/entity_registry/get_entries` with their `entity_ids`: `{entity_id: {"name",
  "original_name", "aliases", ...} | null}`;
- `get_states`: `[{"entity_id", "attributes": {"friendly_name"}}]`, the name Assist itself
  matches (an entity without a registry entry has no other);
- `config/area_registry/list`: `[{"area_id", "name", "aliases", "floor_id"}]`;
- `config/floor_registry/list`: `[{"floor_id", "name", "aliases"}]` (a Home Assistant older
  than floors answers `unknown_command`: no floors).

An entity's name is its registry name, else its friendly name, else its original name; its
aliases are the registry's, and its friendly name when that differs from its name (Assist
matches it); its domain is its entity_id's prefix. Every wait is bounded, every answer at most
MAX_MESSAGE_BYTES, every list at most MAX_ITEMS. The token is never logged.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import ssl
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from edgeasr.errors import ConfigError, DeviceError, MissingInputError, ToolMissingError
from edgeasr.home.names import LANGUAGE, home_name, spoken, unique_names
from edgeasr.stages import HomeName, Vocabulary

if TYPE_CHECKING:
    from edgeasr.config import HomeAssistantApiConfig

log = logging.getLogger(__name__)
# websockets' own log: at DEBUG it would show the frames, the authentication one with the token
# in it, so it is held at INFO whatever the daemon's level
_wire_log = logging.getLogger(f"{__name__}.websockets")
_wire_log.setLevel(logging.INFO)

WEBSOCKET_PATH = "/api/websocket"
TIMEOUT_S = 10.0  # connecting, and each answer
MAX_MESSAGE_BYTES = 16 << 20  # get_states of a large home is a few MiB
MAX_ITEMS = 2000  # entities, areas, floors: each list cut there
MAX_SKIPPED = 100  # messages that answer nothing asked (events), before giving up
ENTITY_ID = re.compile(r"([a-z0-9_]+)\.[a-z0-9_]+")


class HomeAssistantError(DeviceError):
    """Home Assistant could not be read; the message says why (and never holds the token)."""


def import_websockets() -> ModuleType:
    try:
        import websockets.sync.client
    except ImportError as exc:
        raise ToolMissingError(f"homeassistant.url is set but websockets cannot load ({exc}): "
                               "pip install 'websockets>=15,<18'") from exc
    return websockets


def websocket_url(url: str) -> str:
    """homeassistant.url as the websocket API's address: http(s) becomes ws(s), and a URL with
    no path gets /api/websocket."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path if parts.path not in ("", "/") else WEBSOCKET_PATH
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def read_token(path: Path) -> str:
    """homeassistant.token_file's content, trimmed (config.py has already looked a relative name
    up in $CREDENTIALS_DIRECTORY). Warns when others than its owner may read it. Never logged."""
    try:
        text = path.read_text("utf-8")
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise MissingInputError(f"homeassistant.token_file: cannot read {path}: {reason}") from exc
    if mode & 0o077:  # still used: refusing would take the daemon down over a file mode
        log.warning("homeassistant.token_file: %s may be read by others than its owner (%s); restrict it: "
                    "chmod 600 %s", path, stat.filemode(mode), path)
    token = text.strip()
    if not token:
        raise ConfigError(f"homeassistant.token_file: {path} is empty")
    return token


def fetch_names(url: str, token: str, timeout_s: float = TIMEOUT_S,
                on_connect: Callable[[Any], None] | None = None) -> Vocabulary:
    """The names Home Assistant at `url` (ws:// or wss://) exposes to Assist, in one connection.
    HomeAssistantError, naming what failed, for anything but a complete answer. `on_connect`
    is given the open connection (so another thread may close it)."""
    websockets = import_websockets()
    session = _Session(timeout_s)
    try:
        with websockets.sync.client.connect(url, open_timeout=timeout_s, close_timeout=1, max_size=MAX_MESSAGE_BYTES,
                                            proxy=None, ping_interval=None, logger=_wire_log) as conn:
            if on_connect is not None:
                on_connect(conn)
            session.conn = conn
            return session.fetch(token)
    except HomeAssistantError:
        raise
    except TimeoutError:
        raise HomeAssistantError(f"no answer within {timeout_s:g} s {session.doing}") from None
    except websockets.exceptions.ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd is not None else None
        why = f"an answer larger than {MAX_MESSAGE_BYTES >> 20} MiB" if code == 1009 else "the connection closed"
        raise HomeAssistantError(f"{why} ({'code ' + str(code) if code else 'no close frame'}) "
                                 f"{session.doing}") from None
    except websockets.exceptions.InvalidStatus as exc:
        raise HomeAssistantError(f"HTTP {exc.response.status_code} to the websocket upgrade (is the path "
                                 f"{WEBSOCKET_PATH}?)") from None
    except ssl.SSLCertVerificationError as exc:
        raise HomeAssistantError(f"TLS: the server's certificate is not trusted ({exc.verify_message})") from None
    except socket.gaierror as exc:
        raise HomeAssistantError(f"cannot resolve the host ({exc.strerror or exc})") from None
    except OSError as exc:
        raise HomeAssistantError(f"cannot connect ({exc.strerror or exc})") from None
    except (websockets.exceptions.WebSocketException, ValueError) as exc:  # a bad handshake, URI or frame
        raise HomeAssistantError(f"{type(exc).__name__}: {str(exc)[:200]} {session.doing}") from None


class _Session:
    """One connection's conversation: authentication, then commands with increasing ids."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.conn: Any = None
        self.doing = "connecting"
        self.last_id = 0

    def fetch(self, token: str) -> Vocabulary:
        self.doing = "waiting for auth_required"
        greeting = self._receive(time.monotonic() + self.timeout_s)
        if greeting.get("type") != "auth_required":
            raise HomeAssistantError(f"expected auth_required, got {_type(greeting)}")
        self.doing = "waiting for auth_ok"
        self.conn.send(json.dumps({"type": "auth", "access_token": token}))
        answer = self._receive(time.monotonic() + self.timeout_s)
        if answer.get("type") == "auth_invalid":
            raise HomeAssistantError(f"authentication refused ({_said(answer.get('message'))}): check "
                                     "homeassistant.token_file")
        if answer.get("type") != "auth_ok":
            raise HomeAssistantError(f"expected auth_ok, got {_type(answer)}")
        config = self.command("get_config")
        exposed = self.command("homeassistant/expose_entity/list")
        entity_ids = exposed_to_assist(exposed)
        entries = self.command("config/entity_registry/get_entries", entity_ids=entity_ids) if entity_ids else {}
        states = self.command("get_states")
        areas = self.command("config/area_registry/list")
        floors = self.command("config/floor_registry/list", missing_ok=True)
        return vocabulary_from_answers(entity_ids, entries, states, areas, floors or [], config)

    def command(self, kind: str, missing_ok: bool = False, **fields: Any) -> Any:
        """Send command `kind` and return its result; HomeAssistantError when it failed (None
        for an unknown command when `missing_ok`)."""
        self.last_id += 1
        self.doing = f"waiting for the answer to {kind}"
        self.conn.send(json.dumps({"id": self.last_id, "type": kind, **fields}))
        deadline = time.monotonic() + self.timeout_s
        for _ in range(MAX_SKIPPED):
            message = self._receive(deadline)
            if message.get("id") == self.last_id and message.get("type") == "result":
                break
        else:
            raise HomeAssistantError(f"{kind}: no answer among {MAX_SKIPPED} messages")
        if message.get("success") is True:
            return message.get("result")
        error = message["error"] if isinstance(message.get("error"), dict) else {}
        code = _said(error.get("code"))
        if missing_ok and code == "unknown_command":
            return None
        hint = " (the token must be an administrator's)" if code == "unauthorized" else ""
        raise HomeAssistantError(f"{kind} failed: {code} ({_said(error.get('message'))}){hint}")

    def _receive(self, deadline: float) -> dict:
        data = self.conn.recv(timeout=max(0.0, deadline - time.monotonic()))
        if not isinstance(data, str):
            raise HomeAssistantError(f"a binary message {self.doing}")
        try:
            message = json.loads(data)
        except ValueError:
            raise HomeAssistantError(f"a message that is not JSON {self.doing}") from None
        if not isinstance(message, dict):
            raise HomeAssistantError(f"a message that is not a JSON object {self.doing}")
        return message


def exposed_to_assist(result: Any) -> list[str]:
    """The entity ids `homeassistant/expose_entity/list` marks exposed to `conversation`, sorted."""
    exposed = result.get("exposed_entities") if isinstance(result, dict) else None
    if not isinstance(exposed, dict):
        raise HomeAssistantError("homeassistant/expose_entity/list: no exposed_entities in its answer")
    return sorted(eid for eid, to in exposed.items()
                  if ENTITY_ID.fullmatch(eid) and isinstance(to, dict) and to.get("conversation") is True)


def vocabulary_from_answers(entity_ids: list[str], entries: Any, states: Any, areas: Any, floors: Any,
                            config: Any) -> Vocabulary:
    """The Vocabulary the answers describe (entity_ids: the exposed ones)."""
    entries = entries if isinstance(entries, dict) else {}
    friendly = {}
    for state in _listed(states, "get_states"):
        attributes = state.get("attributes")
        if isinstance(attributes, dict) and isinstance(state.get("entity_id"), str):
            friendly[state["entity_id"]] = spoken(attributes.get("friendly_name"))
    names = [n for n in (_entity(eid, entries.get(eid), friendly.get(eid)) for eid in entity_ids) if n][:MAX_ITEMS]
    names += _registry(areas, "config/area_registry/list", "area")
    names += _registry(floors, "config/floor_registry/list", "floor")
    language = config.get("language") if isinstance(config, dict) else None
    language = language if isinstance(language, str) and LANGUAGE.fullmatch(language) else None
    return Vocabulary(unique_names(names), (), language)


def _entity(entity_id: str, entry: Any, friendly: str | None) -> HomeName | None:
    entry = entry if isinstance(entry, dict) else {}
    name = spoken(entry.get("name")) or friendly or spoken(entry.get("original_name"))
    if name is None:
        return None
    said = [a for a in map(spoken, _list(entry.get("aliases"))) if a is not None]  # null: the name itself
    domain = entity_id.partition(".")[0]
    return home_name(name, "entity", domain, [*said, *([friendly] if friendly else [])])


def _registry(result: Any, command: str, kind: str) -> list[HomeName]:
    names = []
    for item in _listed(result, command)[:MAX_ITEMS]:
        name = spoken(item.get("name"))
        if name is not None:
            said = [a for a in map(spoken, _list(item.get("aliases"))) if a is not None]
            names.append(home_name(name, kind, None, said))
    return names


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _listed(result: Any, command: str) -> list[dict]:
    if not isinstance(result, list):
        raise HomeAssistantError(f"{command}: a list was expected in its answer, not {type(result).__name__}")
    return [item for item in result if isinstance(item, dict)]


def _said(value: Any) -> str:
    """Something the server said, made safe for one log line."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", str(value))[:120] if value is not None else "no reason given"


def _type(message: dict) -> str:
    return _said(message.get("type")) if "type" in message else "a message without a type"


class HomeAssistantNames:
    """Home Assistant's names, fetched at start() and every `refresh_s` seconds on a daemon
    thread; `current()` is the last good list (empty before the first). A failed fetch is one
    warning naming the URL and the reason; the last good list is kept."""

    def __init__(self, url: str, token: str, refresh_s: float, timeout_s: float = TIMEOUT_S) -> None:
        import_websockets()  # missing: ToolMissingError (69) at start, not a warning every refresh
        self.url = websocket_url(url)
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self._token = token
        self._changed = threading.Condition()
        self._names = Vocabulary()
        self._fetched = False  # a fetch has succeeded
        self._failing = False  # the last fetch failed
        self.attempts = 0
        self.failures = 0
        self._conn: Any = None  # the connection of the fetch under way (close() closes it)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, section: HomeAssistantApiConfig) -> HomeAssistantNames | None:
        """From the `homeassistant` section (None when its url is not set); the token file is
        read here: MissingInputError (66) or ConfigError (78)."""
        if not section.url:
            return None
        if section.token_file is None:
            raise ConfigError("homeassistant.token_file: required when homeassistant.url is set")
        return cls(section.url, read_token(section.token_file), section.refresh_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="edgeasr-homeassistant", daemon=True)
        self._thread.start()

    def current(self) -> Vocabulary:
        with self._changed:
            return self._names

    def wait_for_attempts(self, count: int, timeout_s: float) -> bool:
        """Wait until `count` fetches have ended (well or not); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self.attempts >= count, timeout_s)

    def fetch(self, timeout_s: float | None = None) -> Vocabulary:
        """One fetch on the calling thread, nothing kept or logged (`edgeasr check`)."""
        return fetch_names(self.url, self._token, timeout_s or self.timeout_s)

    def refresh(self) -> bool:
        """One fetch, now, on the calling thread, kept when it succeeds (True) and logged when
        it fails."""
        try:
            names = fetch_names(self.url, self._token, self.timeout_s, on_connect=self._connected)
        except HomeAssistantError as exc:
            with self._changed:
                self._conn = None
                self.attempts += 1
                self.failures += 1
                self._failing = True
                kept = self._names
                self._changed.notify_all()
            if not self._stop.is_set():  # closing a fetch under way is no failure
                log.warning("Home Assistant names from %s: %s; %s", self.url, exc,
                            f"keeping the last good list ({_counts(kept)})" if self._fetched else "none yet")
            return False
        with self._changed:
            self._conn = None
            news = names != self._names or not self._fetched or self._failing  # first, changed or back
            self._names, self._fetched, self._failing = names, True, False
            self.attempts += 1
            self._changed.notify_all()
        (log.info if news else log.debug)("Home Assistant names from %s: %s", self.url, _counts(names))
        return True

    def close(self) -> None:
        """Stop the thread, ending a fetch under way; waits at most a few seconds."""
        self._stop.set()
        with self._changed:
            conn = self._conn
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing is best effort; the thread ends by its timeouts anyway
                pass
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 2)

    def _connected(self, conn: Any) -> None:
        with self._changed:
            self._conn = conn
        if self._stop.is_set():
            conn.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.refresh()
            self._stop.wait(max(0.0, started + self.refresh_s - time.monotonic()))


def _counts(names: Vocabulary) -> str:
    kinds = [n.kind for n in names.names]
    return (f"{kinds.count('entity')} entities, {kinds.count('area')} areas, {kinds.count('floor')} floors, "
            f"language {names.language or 'not given'}")
