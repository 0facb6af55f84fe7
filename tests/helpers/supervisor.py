"""The stand-in Supervisor (supervisor_standin.py, run with Home Assistant's virtualenv's Python,
which has aiohttp) as the tests start it: on a free loopback port, recording what it was sent."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

from helpers import REPO
from helpers.ports import free_port

HASS_VENV = Path(os.environ.get("EDGEASR_TEST_HASS_VENV", REPO / ".venv-homeassistant"))
STANDIN = Path(__file__).with_name("supervisor_standin.py")
TOKEN = "0123456789abcdef" * 4  # the add-on's SUPERVISOR_TOKEN in these tests
START_TIMEOUT_S = 30


class StandinSupervisor:
    """supervisor_standin.py in Home Assistant's virtualenv (aiohttp), on a free loopback port;
    `core`/`core_token_file`: the Home Assistant its websocket proxy forwards to."""

    def __init__(self, workdir: Path, core: str | None = None, core_token_file: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.records = workdir / f"supervisor-{self.port}.jsonl"
        self.argv = [str(HASS_VENV / "bin" / "python"), str(STANDIN), "--port", str(self.port), "--token", TOKEN,
                     "--discovery", "wyoming", "--record", str(self.records)]
        if core is not None and core_token_file is not None:
            self.argv += ["--core", core, "--core-token-file", str(core_token_file)]
        self.log = workdir / f"supervisor-{self.port}.log"
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> StandinSupervisor:
        assert (HASS_VENV / "bin" / "python").is_file(), f"no Home Assistant virtualenv in {HASS_VENV}"
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._proc.poll() is None, self.log.read_text()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"the stand-in Supervisor did not listen: {self.log.read_text()}")

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)

    def recorded(self, endpoint: str) -> list[dict]:
        if not self.records.exists():
            return []
        rows = [json.loads(line) for line in self.records.read_text().splitlines()]
        return [r for r in rows if r["endpoint"] == endpoint]
