"""The Wyoming speech-to-text servers compared through Home Assistant, each a process of its own
on a free loopback port: edgeasr (`edgeasr --config FILE` with a `wyoming:` section, and
`homeassistant:` when it reads the home's names), and wyoming-faster-whisper from a virtualenv
of its own (`--model DIR --local-files-only`, with `--hass-api` and its token file when it reads
the names too).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from edgeasr.errors import ToolMissingError
from edgeasr.lab.evaluation.assist_hass import free_port, stop, wait_started

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0  # a model loaded on a busy machine
THREADS = 2  # wyoming-faster-whisper's CPU threads: the machine's cores


@dataclass(frozen=True)
class Engine:
    """One speech-to-text server to start: its row's name and how to run it."""

    name: str
    kind: str  # "edgeasr" or "faster-whisper"
    names: bool  # reads the home's names from Home Assistant


ENGINES = {
    "edgeasr": Engine("edgeasr, no vocabulary", "edgeasr", names=False),
    "edgeasr-names": Engine("edgeasr, names from Home Assistant", "edgeasr", names=True),
    "faster-whisper": Engine("wyoming-faster-whisper, plain", "faster-whisper", names=False),
    "faster-whisper-names": Engine("wyoming-faster-whisper, --hass-api", "faster-whisper", names=True),
}


class EngineProcess:
    """A started engine; a context manager that stops it."""

    def __init__(self, engine: Engine, argv: list[str], port: int, workdir: Path, env: dict[str, str]) -> None:
        self.engine, self.argv, self.port, self.env = engine, argv, port, env
        self.log_path = workdir / f"{engine.name.replace(' ', '-')}.log"
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> EngineProcess:
        with self.log_path.open("wb") as out:
            self._proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        try:
            wait_started(self._proc, self._listening, self.engine.name, self.log_path, START_TIMEOUT_S)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def __exit__(self, *exc: object) -> None:
        stop(self._proc)


def edgeasr(engine: Engine, workdir: Path, bundle: Path | None, hass_url: str, token_file: Path) -> EngineProcess:
    port = free_port()
    config: dict = {"input": {"source": "none"},
                    "encoder": {"backend": "onnx"}, "wyoming": {"uri": f"tcp://127.0.0.1:{port}"},
                    "output": {"stdout": False}}
    if bundle is not None:
        config["model"] = {"path": str(bundle)}
    if engine.names:
        config["homeassistant"] = {"url": hass_url, "token_file": str(token_file)}
    path = workdir / f"edgeasr-{port}.yaml"
    path.write_text(yaml.safe_dump(config), "utf-8")
    argv = [sys.executable, "-m", "edgeasr", "--config", str(path)]
    return EngineProcess(engine, argv, port, workdir, dict(os.environ))


def faster_whisper(engine: Engine, workdir: Path, venv: Path, model: Path, hass_url: str,
                   token_file: Path) -> EngineProcess:
    python = venv / "bin" / "python"
    if not python.is_file():
        raise ToolMissingError(f"no wyoming-faster-whisper in {venv}: bash packaging/setup-faster-whisper.sh {venv}")
    port = free_port()
    data = workdir / f"wfw-{port}"
    data.mkdir(parents=True, exist_ok=True)
    argv = [str(python), "-m", "wyoming_faster_whisper", "--uri", f"tcp://127.0.0.1:{port}", "--model", str(model),
            "--data-dir", str(data), "--local-files-only", "--beam-size", "1", "--language", "en",
            "--cpu-threads", str(THREADS), "--compute-type", "int8"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if engine.names:
        argv += ["--hass-api", f"{hass_url}/api"]
        env["WYO_WHISPER_HASS_TOKEN_FILE"] = str(token_file)
    return EngineProcess(engine, argv, port, workdir, env)
