"""A real Home Assistant core for the harness: started from its own virtualenv on loopback with
a fresh configuration directory, onboarded over its REST API, and spoken to over its websocket
API. The harness's only module that imports `websockets` (lazily).

Home Assistant is started with `--skip-pip` (every requirement is installed up front by
packaging/setup-homeassistant.sh) and without `default_config`: nothing it runs installs a
package or reaches the internet. Onboarding skips the `core_config` step (it would add
integrations that do). Each websocket command is answered by `{"id", "type": "result",
"success", "result" | "error"}`; a subscription's events come as `{"id", "type": "event",
"event"}` until it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from edgeasr.errors import DeviceError, ToolMissingError

log = logging.getLogger(__name__)

START_TIMEOUT_S = 180.0  # a busy 2-core machine takes ~10-40 s
ANSWER_TIMEOUT_S = 60.0  # a websocket command or REST call
STOP_TIMEOUT_S = 30.0
POLL_S = 0.5  # between looks at the port while it starts
EVENT_QUEUE = 1000  # a subscription's unread events, bounded
USER = "edgeasr"
PASSWORD = "edgeasr-harness"  # of a throw-away home on loopback
# how a clip reaches Home Assistant: said to the satellite, or sent by assist_pipeline/run as its device
PATHS = ("satellite", "run")
VERSION = re.compile(r"(\d+)\.(\d+)")


class HomeAssistantFailed(DeviceError):
    """The Home Assistant under test did not start or refused a step; the message says which."""


@dataclass(frozen=True)
class Release:
    year: int
    month: int

    @property
    def has_timers(self) -> bool:
        """Timer intents (HassStartTimer and the rest) arrived in 2024.6."""
        return (self.year, self.month) >= (2024, 6)

    @classmethod
    def parse(cls, version: str) -> Release:
        m = VERSION.match(version)
        if m is None:
            raise HomeAssistantFailed(f"cannot read Home Assistant's version {version!r}")
        return cls(int(m.group(1)), int(m.group(2)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HassProcess:
    """`hass -c DIR --skip-pip` from `venv`, serving 127.0.0.1:`port`; a context manager."""

    def __init__(self, venv: Path, config_dir: Path, configuration: dict[str, Any], port: int) -> None:
        self.hass = venv / "bin" / "hass"
        if not self.hass.is_file():
            raise ToolMissingError(f"no Home Assistant in {venv}: bash packaging/setup-homeassistant.sh")
        self.config_dir, self.port = config_dir, port
        self.url = f"http://127.0.0.1:{port}"
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "configuration.yaml").write_text(
            yaml.safe_dump(configuration, sort_keys=False, allow_unicode=True), "utf-8")
        self._proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> HassProcess:
        self._log = (self.config_dir / "hass.out").open("wb")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self._proc = subprocess.Popen([str(self.hass), "-c", str(self.config_dir), "--skip-pip"],
                                      stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_started(self._proc, self._answers, f"Home Assistant on {self.url}", self.config_dir / "hass.out",
                         START_TIMEOUT_S)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/api/onboarding", timeout=2) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def __exit__(self, *exc: object) -> None:
        stop(self._proc)
        if self._log is not None:
            self._log.close()


def wait_started(proc: subprocess.Popen, ready: Callable[[], bool], what: str, log_path: Path,
                 timeout_s: float) -> None:
    """Until `ready()` (a port polled: nothing signals it); DeviceError when `proc` exits first
    or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise DeviceError(f"{what} did not start within {timeout_s:g} s: see {log_path}")
        try:  # a dying process ends the wait at once
            code = proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            continue
        raise DeviceError(f"{what} exited ({code}) while starting: see {log_path}")


def stop(proc: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL if it does not end within STOP_TIMEOUT_S."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rest(url: str, path: str, body: Any = None, token: str | None = None, form: bool = False) -> Any:
    """One REST call (POST with a body, else GET); the answer's JSON. Blocking."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        if form:
            data = urllib.parse.urlencode(body).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        else:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url + path, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S) as r:
            text = r.read().decode()
    except urllib.error.HTTPError as exc:
        raise HomeAssistantFailed(f"{path}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}") from None
    return json.loads(text) if text else None


def onboard(url: str, language: str) -> str:
    """Onboarding's steps but `core_config`; an access token of the owner (an administrator)."""
    client_id = f"{url}/"
    user = rest(url, "/api/onboarding/users", {"client_id": client_id, "name": USER, "username": USER,
                                               "password": PASSWORD, "language": language})
    tokens = rest(url, "/auth/token", {"grant_type": "authorization_code", "code": user["auth_code"],
                                       "client_id": client_id}, form=True)
    token = tokens["access_token"]
    rest(url, "/api/onboarding/analytics", {}, token)
    rest(url, "/api/onboarding/integration", {"client_id": client_id, "redirect_uri": f"{url}/?auth_callback=1"},
         token)
    return str(token)


class Hass:
    """One authenticated websocket connection: commands, and subscriptions read as queues."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._queues: dict[int, asyncio.Queue] = {}
        self._conn: Any = None
        self._reader: asyncio.Task | None = None
        self.version = ""

    async def __aenter__(self) -> Hass:
        try:
            from websockets.asyncio.client import connect
        except ImportError as exc:
            raise ToolMissingError(f"the Home Assistant harness needs websockets ({exc})") from exc
        ws_url = self.url.replace("http://", "ws://", 1) + "/api/websocket"
        self._conn = await connect(ws_url, max_size=64 << 20, ping_interval=None, proxy=None)
        json.loads(await self._conn.recv())  # auth_required
        await self._conn.send(json.dumps({"type": "auth", "access_token": self.token}))
        answer = json.loads(await self._conn.recv())
        if answer.get("type") != "auth_ok":
            raise HomeAssistantFailed(f"websocket authentication: {answer}")
        self.version = str(answer.get("ha_version", ""))
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._conn is not None:
            await self._conn.close()

    async def _read(self) -> None:
        async for raw in self._conn:
            message = json.loads(raw)
            for m in message if isinstance(message, list) else [message]:
                ident = m.get("id")
                if m.get("type") == "event" and ident in self._queues:
                    queue = self._queues[ident]
                    if queue.full():
                        queue.get_nowait()  # the oldest goes; a reader that far behind wants the latest
                    queue.put_nowait(m["event"])
                elif ident in self._waiting and not self._waiting[ident].done():
                    self._waiting[ident].set_result(m)

    async def call(self, kind: str, **data: Any) -> Any:
        """One command's result; HomeAssistantFailed naming it when refused."""
        ident, answer = await self._send(kind, data)
        if not answer.get("success", False):
            raise HomeAssistantFailed(f"{kind}: {answer.get('error')}")
        return answer.get("result")

    async def _send(self, kind: str, data: dict[str, Any], queue: asyncio.Queue | None = None) -> tuple[int, dict]:
        ident = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        if queue is not None:
            self._queues[ident] = queue
        try:
            await self._conn.send(json.dumps({"id": ident, "type": kind, **data}))
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                return ident, await future
        finally:
            del self._waiting[ident]

    @contextlib.asynccontextmanager
    async def subscribe(self, kind: str, **data: Any) -> AsyncIterator[asyncio.Queue]:
        """A command whose events are wanted (assist_pipeline/run, subscribe_events): its queue."""
        queue: asyncio.Queue = asyncio.Queue(EVENT_QUEUE)
        ident, answer = await self._send(kind, data, queue)
        try:
            if not answer.get("success", False):
                raise HomeAssistantFailed(f"{kind}: {answer.get('error')}")
            yield queue
        finally:
            self._queues.pop(ident, None)

    async def send_bytes(self, payload: bytes) -> None:
        await self._conn.send(payload)

    async def rest(self, path: str, body: Any = None) -> Any:
        return await asyncio.to_thread(rest, self.url, path, body, self.token)

    async def service(self, domain: str, service: str, data: dict[str, Any]) -> None:
        await self.call("call_service", domain=domain, service=service, service_data=data)
