"""Home Assistant's Supervisor, as an add-on talks to it: its address from SUPERVISOR_URL (else
http://supervisor) and the add-on's own token from SUPERVISOR_TOKEN, which the Supervisor sets in
every add-on's environment.

Two of its endpoints are used:

- `POST /discovery` with `{"service": "wyoming", "config": {"uri": "tcp://HOST:PORT"}}` announces
  the Wyoming server, so that Home Assistant offers to add it (the add-on's config.yaml must list
  `wyoming` under `discovery`); the answer is `{"result": "ok", "data": {"uuid": ...}}`, or
  `{"result": "error", "message": ...}` with status 400;
- `/core/websocket` is Home Assistant's websocket API behind the Supervisor's proxy: the add-on
  authenticates with its token (config.yaml's `homeassistant_api: true` lets it), the proxy with
  its own, so the home's names are read with no token for the user to paste.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from edgeasr.errors import DeviceError

DEFAULT_URL = "http://supervisor"
URL_VARIABLE = "SUPERVISOR_URL"  # set by tests that stand in for the Supervisor
TOKEN_VARIABLE = "SUPERVISOR_TOKEN"
WEBSOCKET_PATH = "/core/websocket"
DISCOVERY_PATH = "/discovery"
WYOMING_SERVICE = "wyoming"
TIMEOUT_S = 10.0


class SupervisorError(DeviceError):
    """The Supervisor could not be reached or refused a request; the message says which."""


@dataclass(frozen=True)
class Supervisor:
    url: str  # http://supervisor, no trailing slash
    token: str

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> Supervisor | None:
        """The Supervisor this process runs under; None outside one (no SUPERVISOR_TOKEN: a
        plain Docker container)."""
        token = env.get(TOKEN_VARIABLE, "").strip()
        if not token:
            return None
        return cls(env.get(URL_VARIABLE, DEFAULT_URL).rstrip("/"), token)

    def websocket_url(self) -> str:
        """Home Assistant's websocket API through the Supervisor's proxy (ws:// for http://)."""
        parts = urlsplit(self.url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        return urlunsplit((scheme, parts.netloc, parts.path + WEBSOCKET_PATH, "", ""))

    def announce_wyoming(self, uri: str, timeout_s: float = TIMEOUT_S) -> str:
        """POST /discovery for the Wyoming server at `uri`; the message's uuid."""
        body = json.dumps({"service": WYOMING_SERVICE, "config": {"uri": uri}}).encode()
        request = urllib.request.Request(self.url + DISCOVERY_PATH, data=body, method="POST", headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                answer = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise SupervisorError(f"{DISCOVERY_PATH}: HTTP {exc.code} ({_message(exc)})") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SupervisorError(f"{DISCOVERY_PATH}: cannot reach {self.url} ({reason})") from None
        except ValueError:
            raise SupervisorError(f"{DISCOVERY_PATH}: an answer that is not JSON") from None
        data = answer.get("data") if isinstance(answer, dict) else None
        if answer.get("result") != "ok" or not isinstance(data, dict):
            raise SupervisorError(f"{DISCOVERY_PATH}: refused ({str(answer)[:200]})")
        return str(data.get("uuid", ""))


def _message(exc: urllib.error.HTTPError) -> str:
    """The Supervisor's own words for a refusal (its JSON `message`), else the HTTP reason."""
    try:
        return str(json.loads(exc.read()).get("message"))[:200]
    except (ValueError, AttributeError, OSError):
        return str(exc.reason)
