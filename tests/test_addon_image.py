"""The add-on's image end to end: built by packaging/build-addon.sh on a Debian base made here
(packaging/local-base-image.sh; no registry is reachable), and run as the Supervisor runs it:
/data holding options.json with the add-on's defaults, SUPERVISOR_TOKEN and SUPERVISOR_URL set
(here the stand-in of supervisor_standin.py), the host's network (no bridge on these machines).

The first start builds the embedded model into /data; the next answers `describe` within
DESCRIBE_LIMIT_S, announces itself through the discovery endpoint, reads the home's names
through the websocket proxy (to the real Home Assistant core of test_assist_real.py) with the
add-on's token alone, and the satellite's commands through it do in Home Assistant what they
do through the daemon in this process. SIGTERM stops it with exit 0; a bad option is one line
and exit 78. The Docker daemon is started here when none runs, and stopped after.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from helpers.assist import HASS_VENV, HOME, PATH, SPOKEN, Clip, command_clips, dev_clips
from helpers.supervisor import TOKEN, StandinSupervisor

from edgeasr.commands import addon_options
from edgeasr.errors import ConfigError
from edgeasr.home.homeassistant import fetch_names, websocket_url
from edgeasr.lab.evaluation.assist_engines import Engine, edgeasr
from edgeasr.lab.evaluation.assist_home import home_from_files
from edgeasr.lab.evaluation.assist_judge import WRONG, Verdict, action, describe
from edgeasr.lab.evaluation.assist_runs import Heard
from edgeasr.lab.evaluation.assist_session import AssistSession
from edgeasr.wyoming.client import describe as wyoming_describe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the image built, the model too

REPO = Path(__file__).resolve().parents[1]
ADDON_DIR = REPO / "packaging" / "homeassistant" / "edgeasr"
CONFIG = yaml.safe_load((ADDON_DIR / "config.yaml").read_text())
BASE_TAG = "edgeasr/bookworm-base"  # kept by Docker between runs: debootstrap runs once per machine
IMAGE_TAG = f"edgeasr-test/addon:{CONFIG['version']}"
IMAGE_LIMIT_MB = 400
DESCRIBE_LIMIT_S = 30  # any start after the first
FIRST_START_LIMIT_S = 600  # the embedded model built on a busy machine
STOP_TIMEOUT_S = CONFIG["timeout"]
DOCKERD_START_S = 60
PORT = addon_options.WYOMING_PORT
NAMES_LINE = "Home Assistant names from "


def run(argv: list[str], timeout: float = 900, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)


def docker_answers() -> bool:
    return shutil.which("docker") is not None and run(["docker", "info"], timeout=30).returncode == 0


@pytest.fixture(scope="module")
def docker(tmp_path_factory):
    """A Docker daemon: the one running, else dockerd started here (no bridge, no iptables: the
    containers use the host's network) and stopped after the module."""
    if docker_answers():
        yield
        return
    assert shutil.which("dockerd"), "no dockerd: apt-get install docker.io (setup-dev.sh --tests does)"
    log = tmp_path_factory.mktemp("dockerd") / "dockerd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + DOCKERD_START_S
        while not docker_answers():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        proc.wait(60)


@dataclass(frozen=True)
class Built:
    tag: str
    seconds: float
    size_mb: float


@pytest.fixture(scope="module")
def image(docker) -> Built:
    """The image, built once per module from this checkout on the local base."""
    base = run(["bash", str(REPO / "packaging" / "local-base-image.sh"), BASE_TAG], timeout=1800)
    assert base.returncode == 0, base.stderr
    started = time.monotonic()
    built = run(["bash", str(REPO / "packaging" / "build-addon.sh"), "--base", BASE_TAG, "--tag", IMAGE_TAG],
                timeout=1800)
    seconds = time.monotonic() - started
    assert built.returncode == 0, built.stderr[-5000:]
    assert built.stdout.strip().splitlines()[-1] == IMAGE_TAG
    size = int(run(["docker", "image", "inspect", "-f", "{{.Size}}", IMAGE_TAG]).stdout)
    yield Built(IMAGE_TAG, seconds, size / 1e6)
    run(["docker", "image", "rm", "-f", IMAGE_TAG])


class Container:
    """The add-on's container as the Supervisor runs it; `start()` times until it answers
    describe on the add-on's port, `stop()` sends SIGTERM and times the exit."""

    def __init__(self, tag: str, data: Path, supervisor_url: str | None, share: Path | None = None) -> None:
        self.tag, self.data = tag, data
        self.name = f"edgeasr-addon-test-{os.getpid()}"
        self.env = ["-e", f"SUPERVISOR_TOKEN={TOKEN}", "-e", f"SUPERVISOR_URL={supervisor_url}"] \
            if supervisor_url else []
        self.env += ["-v", f"{share}:/share:ro"] if share is not None else []  # config.yaml's map: share:ro

    def start(self, limit_s: float) -> float:
        with socket.socket() as probe:  # the add-on's port is fixed: another user of it is named
            assert probe.connect_ex(("127.0.0.1", PORT)) != 0, f"port {PORT} is in use: the add-on needs it"
        started = time.monotonic()
        done = run(["docker", "run", "-d", "--name", self.name, "--network", "host", "-v", f"{self.data}:/data",
                    *self.env, self.tag])
        assert done.returncode == 0, done.stderr
        while True:
            try:
                asyncio.run(wyoming_describe(f"tcp://127.0.0.1:{PORT}", 2))
                return time.monotonic() - started
            except (OSError, TimeoutError):
                state = run(["docker", "inspect", "-f", "{{.State.Running}}", self.name]).stdout.strip()
                assert state == "true", f"the container exited:\n{self.logs()}"
                assert time.monotonic() - started < limit_s, f"no describe within {limit_s} s:\n{self.logs()}"
                time.sleep(0.25)

    def read(self, path: str) -> str:
        """A file of the running container, through the daemon (`docker cp`: `docker exec` in a
        dockerd run in a chroot, as the fresh-machine check's, enters the host's root)."""
        done = subprocess.run(["docker", "cp", f"{self.name}:{path}", "-"], capture_output=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr.decode()
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
            member = tar.extractfile(tar.getmembers()[0])
            assert member is not None, f"{path} is no file"
            return member.read().decode()

    def logs(self) -> str:
        done = run(["docker", "logs", self.name])
        return done.stdout + done.stderr

    def wait_for_log(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while text not in (logs := self.logs()):
            assert time.monotonic() < deadline, f"no {text!r} in the log:\n{logs}"
            time.sleep(0.5)
        return logs

    def stop(self) -> tuple[float, int, str]:
        started = time.monotonic()
        run(["docker", "stop", "-t", str(STOP_TIMEOUT_S), self.name], timeout=STOP_TIMEOUT_S + 30)
        seconds = time.monotonic() - started
        code = int(run(["docker", "inspect", "-f", "{{.State.ExitCode}}", self.name]).stdout)
        logs = self.logs()
        run(["docker", "rm", "-f", self.name])
        return seconds, code, logs


def data_dir(root: Path, **options) -> Path:
    """/data as the Supervisor leaves it before a start: options.json from the add-on's defaults."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "options.json").write_text(json.dumps({**CONFIG["options"], **options}))
    return root


HAILORT = "4.21.0"  # Home Assistant OS 16.0's driver


def hailort_files(share: Path) -> Path:
    """What a user copies into /share/edgeasr/hailort, played by the tests' HailoRT stand-in
    (tests/hailo_standin) as the wheel and a library file as the .deb: the files are not
    HailoRT's, the way the add-on installs them is."""
    import base64
    import hashlib
    import zipfile

    folder = share / "edgeasr" / "hailort"
    folder.mkdir(parents=True)
    package = Path(__file__).with_name("hailo_standin")
    wheel = folder / f"hailort-{HAILORT}-py3-none-any.whl"
    info = f"hailort-{HAILORT}.dist-info"
    modules = [*package.rglob("hailo_platform/**/*.py"), package / "standin_control.py"]
    files = {str(p.relative_to(package)): p.read_bytes() for p in sorted(modules)}
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: hailort\nVersion: {HAILORT}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: edgeasr-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
              f"{len(data)}" for name, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    root = share / "deb-root"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(f"Package: hailort\nVersion: {HAILORT}\nArchitecture: all\n"
                                             "Maintainer: edgeasr tests <tests@localhost>\nDescription: stand-in\n")
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "usr" / "lib" / f"libhailort.so.{HAILORT}").write_text("a stand-in for the library\n")
    done = run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(folder / f"hailort_{HAILORT}_all.deb")])
    assert done.returncode == 0, done.stderr
    shutil.rmtree(root)
    return share


@dataclass(frozen=True)
class FirstStart:
    seconds: float  # to the first describe, the embedded model built meanwhile
    discovery: list[dict]
    stop_s: float
    exit_code: int
    logs: str
    hailort: str  # the library the running container unpacked from HailoRT's .deb


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return data_dir(tmp_path_factory.mktemp("addon") / "data")


@pytest.fixture(scope="module")
def first_start(image, data, tmp_path_factory) -> FirstStart:
    """The first start on an empty /data, under a Supervisor with no Home Assistant behind it,
    HailoRT's files (stand-ins) in /share."""
    share = hailort_files(tmp_path_factory.mktemp("share"))
    with StandinSupervisor(tmp_path_factory.mktemp("supervisor-first")) as supervisor:
        container = Container(image.tag, data, supervisor.url, share)
        try:
            seconds = container.start(FIRST_START_LIMIT_S)
            container.wait_for_log("announced tcp://", 30)
            hailort = container.read(f"/usr/lib/libhailort.so.{HAILORT}")
        finally:
            stop_s, code, logs = container.stop()
        return FirstStart(seconds, supervisor.recorded("discovery"), stop_s, code, logs, hailort)


def test_the_image_is_at_most_400_mb(image):
    print(f"\nimage {image.tag}: {image.size_mb:.0f} MB, built in {image.seconds:.0f} s")
    assert image.size_mb <= IMAGE_LIMIT_MB


def test_the_first_start_builds_the_model_into_data_and_announces_itself(first_start, data):
    print(f"\nfirst start: describe answered after {first_start.seconds:.1f} s")
    assert "preparing the default model bundle in /data/models/" in first_start.logs
    assert [p.name for p in (data / "models").iterdir() if p.is_dir()][0].startswith("whisper-tiny.en-")
    assert [r["body"] for r in first_start.discovery] == [
        {"service": "wyoming", "config": {"uri": f"tcp://{socket.gethostname()}:{PORT}"}}]


def test_hailort_from_share_is_installed_and_the_encoder_stays_on_the_cpu(first_start):
    """The .deb unpacked and the wheel installed at the start; with no device and no HEF, auto
    is the CPU encoder, as the Debian package's."""
    assert (f"HailoRT from /share/edgeasr/hailort: hailort_{HAILORT}_all.deb, hailort-{HAILORT}-py3-none-any.whl; "
            f"hailo_platform {HAILORT} from /opt/edgeasr/lib/python3.11/site-packages/hailo_platform/__init__.py") \
        in first_start.logs
    assert first_start.hailort == "a stand-in for the library\n"
    assert "encoder backend: onnx (requested auto)" in first_start.logs


def test_sigterm_stops_it_cleanly(first_start):
    print(f"\nSIGTERM to exit: {first_start.stop_s:.1f} s")
    assert first_start.exit_code == 0, first_start.logs
    assert "SIGTERM: finishing the current speech and the queue" in first_start.logs
    assert first_start.stop_s < STOP_TIMEOUT_S


def test_a_bad_option_is_one_line_and_exit_78(image, tmp_path):
    bad = data_dir(tmp_path / "bad", endpoint_ms=50)
    done = run(["docker", "run", "--rm", "--network", "host", "-v", f"{bad}:/data", image.tag], timeout=120)
    assert done.returncode == ConfigError.exit_code
    assert done.stderr.strip().splitlines()[-1] == ("edgeasr: /data/options.json: endpoint_ms: 50 is not allowed "
                                                    "(100..10000)")


def test_edgeasr_check_passes_inside_the_container(image, first_start, data):
    done = run(["docker", "run", "--rm", "--network", "host", "-v", f"{data}:/data", image.tag, "--check"],
               timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "config: ok (/data/edgeasr.yaml)" in lines
    assert any(line.startswith("model: ok (whisper-tiny.en, 10 s window, /data/models/") for line in lines), lines
    assert "audio input: none: a Wyoming server only" in lines


@dataclass(frozen=True)
class Assisted:
    restart_s: float
    discovery: list[dict]
    websocket: list[dict]
    names_line: str
    names_direct: str
    judged: dict[str, tuple[Heard, Heard, Verdict, Heard, Verdict]]  # oracle, in process, container
    logs: str


async def _assist(image: Built, data: Path, workdir: Path, bundle: Path, clips: list[Clip]) -> Assisted:
    async with AssistSession(HASS_VENV, home_from_files([HOME]), workdir) as session:
        core = websocket_url(session.url)
        with StandinSupervisor(workdir, core=core, core_token_file=session.token_file) as supervisor:
            container = Container(image.tag, data, supervisor.url)
            restart_s = await asyncio.to_thread(container.start, DESCRIBE_LIMIT_S)
            try:
                await asyncio.to_thread(container.wait_for_log, "announced tcp://", 30)
                logs = await asyncio.to_thread(container.wait_for_log, NAMES_LINE, 60)
                names_line = next(line for line in logs.splitlines() if NAMES_LINE in line)
                direct = await asyncio.to_thread(fetch_names, core, session.token_file.read_text().strip())
                uri = supervisor.recorded("discovery")[-1]["body"]["config"]["uri"]
                host, port = uri.removeprefix("tcp://").rsplit(":", 1)
                # the host network: the container has this machine's hostname (where that name
                # resolves is the machine's own setup: a fresh debootstrap root has no entry for it)
                assert host == socket.gethostname()
                in_process = await session.serve(edgeasr(Engine("edgeasr", "edgeasr", names=True), workdir, bundle,
                                                         session.url, session.token_file))
                through_addon = await session.add_stt("edgeasr add-on", int(port))
                judged = {}
                for clip in clips:
                    oracle, heard, verdict = await session.judged(clip.pcm, clip.reference, in_process, PATH)
                    _, addon_heard, addon_verdict = await session.judged(clip.pcm, clip.reference, through_addon,
                                                                         PATH)
                    judged[clip.id] = (oracle, heard, verdict, addon_heard, addon_verdict)
            finally:
                _, _, logs = await asyncio.to_thread(container.stop)
            return Assisted(restart_s, supervisor.recorded("discovery"), supervisor.recorded("websocket"),
                            names_line, _counts(direct), judged, logs)


def _counts(vocabulary) -> str:
    kinds = [n.kind for n in vocabulary.names]
    return f"{kinds.count('entity')} entities, {kinds.count('area')} areas, {kinds.count('floor')} floors"


@pytest.fixture(scope="module")
def assisted(image, first_start, data, tiny_bundle, tmp_path_factory) -> Assisted:
    assert (HASS_VENV / "bin" / "hass").is_file(), f"no Home Assistant in {HASS_VENV}"
    clips = command_clips()
    return asyncio.run(_assist(image, data, tmp_path_factory.mktemp("assist-addon"), tiny_bundle, clips))


def test_a_later_start_answers_describe_within_30_s(assisted):
    print(f"\nrestart: describe answered after {assisted.restart_s:.1f} s")
    assert assisted.restart_s <= DESCRIBE_LIMIT_S
    assert "preparing the default model bundle" not in assisted.logs


def test_it_announces_itself_with_the_supervisors_token(assisted):
    assert [r["body"] for r in assisted.discovery] == [
        {"service": "wyoming", "config": {"uri": f"tcp://{socket.gethostname()}:{PORT}"}}]


def test_the_names_come_through_the_proxy_with_the_addons_token_alone(assisted):
    """Every websocket the add-on opened authenticated with its SUPERVISOR_TOKEN (the stand-in
    refuses any other), and it read what Home Assistant gives an administrator directly."""
    assert assisted.websocket and all(r["token_ok"] for r in assisted.websocket)
    assert "/core/websocket: " + assisted.names_direct in assisted.names_line


def test_the_satellite_does_through_the_addon_what_it_does_through_the_daemon(assisted):
    different = [f"{clip}: in process {describe(heard)}; the add-on {describe(addon_heard)}"
                 for clip, (_, heard, _, addon_heard, _) in assisted.judged.items() if action(heard) != action(addon_heard)]
    assert not different, "\n".join(different)


def test_no_command_becomes_another_through_the_addon(assisted):
    wrong = [f"{clip}: {verdict.why}" for clip, (*_, verdict) in assisted.judged.items() if verdict.outcome == WRONG]
    assert not wrong, "\n".join(wrong)
    assert len(assisted.judged) == len(_clips_ids())


def _clips_ids() -> list[str]:
    return [i for i, _, _ in dev_clips()] + list(SPOKEN)
