"""The Home Assistant add-on (packaging/homeassistant/edgeasr, repository.yaml at the root).

Without Docker: the repository and the add-on's files pass the Supervisor's own rules
(supervisor_rules.py), the options' defaults and limits are edgeasr's, and `edgeasr addon` turns
the options into a configuration, names a bad option in one line with its key's exit code, and
talks to a stand-in for the Supervisor (supervisor_standin.py) as to the real one.

The image itself is built and run in tests/test_addon_image.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import voluptuous as vol
import yaml
from helpers.supervisor import TOKEN, StandinSupervisor
from helpers.supervisor_rules import (
    ADDON,
    BUILD,
    REPOSITORY,
    SCHEMA_ELEMENT,
    TRANSLATIONS,
    addon_configs,
    repository_file,
    validate_options,
)

from edgeasr import config as edgeasr_config
from edgeasr.commands import addon, addon_options
from edgeasr.commands.supervisor import Supervisor, SupervisorError
from edgeasr.errors import ConfigError, MissingInputError, ToolMissingError
from edgeasr.lab.evaluation.assist_hass import free_port

REPO = Path(__file__).resolve().parents[1]
ADDON_DIR = REPO / "packaging" / "homeassistant" / "edgeasr"
CONFIG = yaml.safe_load((ADDON_DIR / "config.yaml").read_text())


def tracked_files() -> list[str]:
    """What a commit holds: the tracked files and those not ignored."""
    return subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()


# --- the Supervisor's rules -----------------------------------------------------------------


def test_the_store_finds_the_repository_and_exactly_one_addon():
    found = repository_file(REPO)
    assert found == REPO / "repository.yaml"
    REPOSITORY(yaml.safe_load(found.read_text()))
    assert addon_configs(tracked_files()) == ["packaging/homeassistant/edgeasr/config.yaml"]


def test_the_store_rules_are_the_supervisors():
    """What the glob takes and leaves, on made-up paths (edgeasr/config.py is no add-on)."""
    assert addon_configs(["a/config.yaml", "b/config.json", "c/config.yml", "edgeasr/config.py",
                          "config/edgeasr.yaml", ".github/x/config.yaml", "a/rootfs/etc/config.json"]) == \
        ["a/config.yaml", "b/config.json", "c/config.yml"]


def test_the_addon_config_passes_the_supervisors_schema():
    valid = ADDON(CONFIG)
    assert valid["slug"] == "edgeasr" and set(valid["arch"]) == {"amd64", "aarch64"}
    assert valid["discovery"] == ["wyoming"] and valid["homeassistant_api"] is True
    assert f"{addon_options.WYOMING_PORT}/tcp" in valid["ports"]
    assert valid["devices"] == ["/dev/hailo0"]
    BUILD(yaml.safe_load((ADDON_DIR / "build.yaml").read_text()))
    assert set(yaml.safe_load((ADDON_DIR / "build.yaml").read_text())["build_from"]) == set(valid["arch"])


def test_a_misspelt_or_bad_key_is_refused():
    with pytest.raises(vol.Invalid):
        ADDON({**CONFIG, "homeasistant_api": True})
    with pytest.raises(vol.Invalid):
        ADDON({**CONFIG, "schema": {**CONFIG["schema"], "encoder": "choice(auto|onnx)"}})
    with pytest.raises(vol.Invalid):
        ADDON({**CONFIG, "slug": "edge asr"})


def test_the_translations_name_every_option_and_the_port():
    translations = TRANSLATIONS(yaml.safe_load((ADDON_DIR / "translations" / "en.yaml").read_text()))
    assert set(translations["configuration"]) == set(CONFIG["schema"])
    assert set(translations["network"]) == set(CONFIG["ports"])


def test_the_folder_holds_what_the_store_shows_and_the_build_needs():
    for name in ("Dockerfile", "DOCS.md", "icon.png", "build.yaml"):
        assert (ADDON_DIR / name).is_file(), name
    assert (ADDON_DIR / "icon.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    dockerfile = (ADDON_DIR / "Dockerfile").read_text()
    assert "ARG BUILD_FROM\nFROM ${BUILD_FROM} AS runtime\n" in dockerfile
    # the build context is this folder alone: every COPY names something inside it
    for source in [line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")]:
        assert not source.startswith(("/", "..")), source


def test_the_version_is_pyprojects():
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'\nversion = "{CONFIG["version"]}"\n' in pyproject


def test_vendored_wheels_if_any_are_this_versions():
    """A release commits wheels/ (build-addon.sh --vendor): edgeasr's wheel of the add-on's
    version and a lock naming it; between releases the folder may hold the last one's."""
    wheels = ADDON_DIR / "wheels"
    if not wheels.exists():
        assert "packaging/homeassistant/edgeasr/wheels" not in "\n".join(tracked_files())
        return
    own = sorted(p.name for p in wheels.glob("edgeasr-*.whl"))
    assert own == [f"edgeasr-{CONFIG['version']}-py3-none-any.whl"]
    assert f"edgeasr=={CONFIG['version']} --hash=sha256:" in (wheels / "requirements.txt").read_text()


def test_the_default_options_pass_and_bad_ones_are_refused_by_the_supervisor():
    schema, defaults = CONFIG["schema"], CONFIG["options"]
    assert validate_options(schema, defaults) == defaults
    assert validate_options(schema, {**defaults, "endpoint_ms": "800"})["endpoint_ms"] == 800
    assert validate_options(schema, {**defaults, "model": "/share/edgeasr/models/base"})
    for bad in ({"endpoint_ms": 50}, {"endpoint_ms": 20000}, {"encoder": "gpu"}, {"log_level": "debug"},
                {"home_names": "perhaps"}, {"language": 5}):
        with pytest.raises(vol.Invalid):
            validate_options(schema, {**defaults, **bad})
    with pytest.raises(vol.Invalid, match="log_level"):
        validate_options(schema, {k: v for k, v in defaults.items() if k != "log_level"})


def edgeasr_field(key: str):
    """The dataclass field of edgeasr's dotted config key."""
    import dataclasses

    cls: type = edgeasr_config.Config
    *parents, leaf = key.split(".")
    for name in parents:
        cls = {f.name: f for f in dataclasses.fields(cls)}[name].default_factory  # type: ignore[assignment]
    return {f.name: f for f in dataclasses.fields(cls)}[leaf]


@pytest.mark.parametrize("option", sorted(addon_options.KEYS))
def test_an_option_is_its_edgeasr_key_with_its_default_and_limits(option):
    key = addon_options.KEYS[option]
    field = edgeasr_field(key)
    kind = CONFIG["schema"][option]
    match = SCHEMA_ELEMENT.match(kind)
    assert match, kind
    # null in edgeasr is an optional option left out of the defaults
    if field.default is None:
        assert kind.endswith("?") and option not in CONFIG["options"]
    else:
        assert not kind.endswith("?") and CONFIG["options"][option] == field.default
    rule = field.metadata["rule"]
    if match.group("list"):
        assert isinstance(rule, edgeasr_config.OneOf) and tuple(match.group("list").split("|")) == rule.values
    elif match.group("i_min") or match.group("i_max"):
        assert isinstance(rule, edgeasr_config.Range) and not rule.lo_open
        assert (float(match.group("i_min")), float(match.group("i_max"))) == (rule.lo, rule.hi)
    else:
        assert kind.rstrip("?") == "str" and rule is None


def test_every_option_is_in_the_schema_and_mapped():
    assert set(CONFIG["schema"]) == set(addon_options.OPTIONS)
    assert CONFIG["schema"][addon_options.HOME_NAMES] == "bool"


# --- the options become a configuration ----------------------------------------------------


def write_options(folder: Path, **changes) -> Path:
    path = folder / "options.json"
    path.write_text(json.dumps({**CONFIG["options"], **changes}))
    return path


def test_the_default_options_make_the_wyoming_server_with_names_through_the_proxy(tmp_path):
    supervisor = Supervisor("http://127.0.0.1:8099", TOKEN)
    path = addon.write_config(write_options(tmp_path), supervisor)
    assert path == tmp_path / "edgeasr.yaml"
    cfg = edgeasr_config.load_config(path)
    assert cfg.input.source == "none" and cfg.wyoming.uri == f"tcp://0.0.0.0:{addon_options.WYOMING_PORT}"
    assert cfg.state_dir == addon_options.DATA_DIR and cfg.model.path is None and cfg.encoder.backend == "auto"
    assert cfg.homeassistant.url == "ws://127.0.0.1:8099/core/websocket"
    token = cfg.homeassistant.token_file
    assert token is not None and token.read_text() == TOKEN
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert TOKEN not in path.read_text()
    shutil.rmtree(token.parent)  # in the container it goes with it


def test_options_set_their_keys_and_names_need_a_supervisor(tmp_path, caplog):
    options = write_options(tmp_path, language="de", encoder="onnx", endpoint_ms=700, log_level="DEBUG",
                            home_names=True, model="")
    cfg = edgeasr_config.load_config(addon.write_config(options, None))
    assert (cfg.model.language, cfg.encoder.backend, cfg.wyoming.endpoint_ms, cfg.log.level) == ("de", "onnx", 700,
                                                                                                "DEBUG")
    assert cfg.model.path is None and cfg.homeassistant.url is None
    assert "no Supervisor gives Home Assistant's names here" in caplog.text
    off = write_options(tmp_path, home_names=False)
    assert edgeasr_config.load_config(addon.write_config(off, Supervisor("http://x", TOKEN))).homeassistant.url is None


def test_a_bad_option_is_named_with_its_keys_exit_code(tmp_path):
    with pytest.raises(ConfigError, match=r"options.json: endpoint_ms: 50 is not allowed \(100..10000\)$"):
        addon.write_config(write_options(tmp_path, endpoint_ms=50), None)
    with pytest.raises(MissingInputError, match=r"options.json: model: /share/nowhere is not a directory$"):
        addon.write_config(write_options(tmp_path, model="/share/nowhere"), None)
    with pytest.raises(ConfigError, match=r"options.json: modle: unknown option \(allowed: model, "):
        addon.write_config(write_options(tmp_path, modle="x"), None)
    (tmp_path / "options.json").write_text("{")
    with pytest.raises(ConfigError, match="not JSON"):
        addon.write_config(tmp_path / "options.json", None)

def test_no_options_file_is_every_key_at_its_default(tmp_path):
    """A Docker user's new volume: edgeasr's defaults, which the add-on's defaults are."""
    cfg = edgeasr_config.load_config(addon.write_config(tmp_path / "options.json", None))
    assert (cfg.encoder.backend, cfg.log.level, cfg.model.path, cfg.input.source) == ("auto", "INFO", None, "none")


def test_the_command_prints_one_line_and_exits_with_the_config_code(tmp_path):
    options = write_options(tmp_path, encoder="gpu")
    done = subprocess.run([sys.executable, "-m", "edgeasr", "addon", "--options", str(options), "--check"],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "SUPERVISOR_TOKEN"})
    assert done.returncode == ConfigError.exit_code
    assert done.stderr.strip().splitlines()[-1] == (f"edgeasr: {options}: encoder: 'gpu' is not allowed "
                                                    "(auto, onnx, hailo)")


# --- the Supervisor's endpoints, played by the stand-in ---------------------------------------


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    with StandinSupervisor(tmp_path_factory.mktemp("supervisor")) as s:
        yield s


def test_discovery_is_posted_as_the_supervisor_takes_it(standin):
    uuid = Supervisor(standin.url, TOKEN).announce_wyoming("tcp://edgeasr-host:10300")
    assert len(uuid) == 32
    assert standin.recorded("discovery")[-1]["body"] == {"service": "wyoming",
                                                         "config": {"uri": "tcp://edgeasr-host:10300"}}


def test_a_refused_discovery_says_why(standin):
    with pytest.raises(SupervisorError, match="HTTP 401"):
        Supervisor(standin.url, "not-the-token").announce_wyoming("tcp://edgeasr-host:10300")
    with pytest.raises(SupervisorError, match="HTTP 400 .invalid Wyoming Protocol URI"):
        Supervisor(standin.url, TOKEN).announce_wyoming("unix:///run/x.sock")
    with pytest.raises(SupervisorError, match="cannot reach"):
        Supervisor(f"http://127.0.0.1:{free_port()}", TOKEN).announce_wyoming("tcp://h:10300")


def test_the_supervisor_comes_from_the_environment():
    assert Supervisor.from_environment({}) is None
    default = Supervisor.from_environment({"SUPERVISOR_TOKEN": TOKEN})
    assert default == Supervisor("http://supervisor", TOKEN)
    assert default.websocket_url() == "ws://supervisor/core/websocket"
    assert Supervisor.from_environment({"SUPERVISOR_TOKEN": TOKEN, "SUPERVISOR_URL": "https://s:1/"}
                                       ).websocket_url() == "wss://s:1/core/websocket"


def test_the_announcement_waits_for_describe(standin):
    """Nothing is announced until the server answers describe; then once."""
    from wyoming.info import Info
    from wyoming.server import AsyncEventHandler, AsyncServer

    port = free_port()
    before = len(standin.recorded("discovery"))
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(addon.announce_when_serving(
        Supervisor(standin.url, TOKEN), "tcp://edgeasr-host:10300", f"tcp://127.0.0.1:{port}")))
    thread.start()
    time.sleep(3 * addon.DESCRIBE_POLL_S)
    assert thread.is_alive() and len(standin.recorded("discovery")) == before

    class Describe(AsyncEventHandler):
        async def handle_event(self, event) -> bool:
            await self.write_event(Info().event())
            return True

    async def serve() -> None:
        server = AsyncServer.from_uri(f"tcp://127.0.0.1:{port}")
        task = asyncio.create_task(server.run(Describe))
        await asyncio.to_thread(thread.join, 30)
        task.cancel()

    asyncio.run(serve())
    assert result == [True]
    assert len(standin.recorded("discovery")) == before + 1


def test_hailort_files_that_cannot_be_installed_stop_the_start_naming_the_file(tmp_path):
    addon.install_hailort(tmp_path)  # none there: nothing to do
    (tmp_path / "hailort_4.21.0_arm64.deb").write_bytes(b"not a Debian package")
    with pytest.raises(ToolMissingError, match=r"unpacking .*hailort_4\.21\.0_arm64\.deb failed \(.+\)$"):
        addon.install_hailort(tmp_path)


def test_a_hailort_binding_that_does_not_load_stops_the_start_in_one_line():
    """The check install_hailort runs after the wheel: the import in a child interpreter, its
    last line of error named."""
    import sys

    with pytest.raises(ToolMissingError, match=r"importing hailo_platform failed \(ModuleNotFoundError: No module "
                                               r"named 'hailo_platform_not_here'\)$"):
        addon._run_step([sys.executable, "-c", "import hailo_platform_not_here"], "importing hailo_platform")
