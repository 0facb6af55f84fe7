"""`edgeasr addon [--options FILE] [--check]`: the Home Assistant add-on's container
(packaging/homeassistant/edgeasr) starts here, as a Supervisor starts it or as `docker run` does.

1. The options (/data/options.json, which the Supervisor writes from the add-on's form) become
   an edgeasr configuration, /data/edgeasr.yaml (addon_options: the keys each option sets).
   A bad value is one line naming the option, with the exit code `edgeasr` gives that key.
2. HailoRT the user put in /share/edgeasr/hailort (Hailo's .deb and wheel, which no public
   index serves) is installed into the container (install_hailort).
3. The daemon runs in this process, as the .deb's service runs it: the Wyoming server only
   (`input.source: none`), its models and state under /data; SIGTERM stops it cleanly.
4. Under a Supervisor (SUPERVISOR_TOKEN set), once the server answers `describe`, it is announced
   through the Supervisor's discovery (`tcp://<this container's host name>:10300`), and, with
   `home_names` on, the home's names are read through the Supervisor's websocket proxy with the
   add-on's own token: nothing for the user to paste.

`--check` writes the configuration and runs `edgeasr check` on it instead of the daemon.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path

import yaml

from edgeasr.commands import addon_options
from edgeasr.commands.supervisor import Supervisor, SupervisorError
from edgeasr.config import load_config
from edgeasr.errors import ConfigError, EdgeAsrError, MissingInputError, OutputError, ToolMissingError

log = logging.getLogger(__name__)

CONFIG_NAME = "edgeasr.yaml"  # written into /data at every start
TOKEN_NAME = "supervisor-token"
HAILORT_DIR = Path("/share/edgeasr/hailort")
# the image's venv has no pip of its own: Debian's python3-pip-whl runs from its wheel
PIP_WHEELS = Path("/usr/share/python-wheels")
DESCRIBE_POLL_S = 0.5  # how often the announcer asks the server while it starts
DESCRIBE_TIMEOUT_S = 2.0


def register(subparsers) -> None:
    p = subparsers.add_parser("addon", help="the Home Assistant add-on's entry point (its container runs it)")
    p.add_argument("--options", type=Path, default=addon_options.OPTIONS_FILE, metavar="FILE",
                   help=f"the add-on's options (default {addon_options.OPTIONS_FILE})")
    p.add_argument("--check", action="store_true",
                   help="write the configuration and run `edgeasr check` on it instead of the daemon")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    # until the daemon installs its own handlers (the first start may spend minutes building the
    # default model), SIGTERM ends the start cleanly: a half-built bundle is removed on the way out
    signal.signal(signal.SIGTERM, _stop_starting)
    supervisor = Supervisor.from_environment()
    config = write_config(args.options, supervisor)
    if args.check:
        from edgeasr.commands import check

        return check.main(_daemon_args(config))
    from edgeasr.commands import run

    install_hailort(HAILORT_DIR)
    if supervisor is not None:
        port = addon_options.WYOMING_PORT
        uri, local = f"tcp://{socket.gethostname()}:{port}", f"tcp://127.0.0.1:{port}"
        threading.Thread(target=announce_when_serving, args=(supervisor, uri, local), name="edgeasr-discovery",
                         daemon=True).start()
    else:
        log.info("no Supervisor here (SUPERVISOR_TOKEN is not set): add the Wyoming integration by hand, "
                 "this host's port %d", addon_options.WYOMING_PORT)
    return run.main(_daemon_args(config))


def write_config(options_file: Path, supervisor: Supervisor | None) -> Path:
    """The configuration the options ask for, written beside them and loaded once, so that a bad
    value is reported by the option that set it (with that key's exit code)."""
    options = addon_options.read_options(options_file)
    names_url = token_file = None
    if options.get(addon_options.HOME_NAMES) is True:
        if supervisor is None:
            log.warning(
                "%s: on, but no Supervisor gives Home Assistant's names here (SUPERVISOR_TOKEN is not set)",
                addon_options.HOME_NAMES)
        else:
            names_url, token_file = supervisor.websocket_url(), _token_file(supervisor.token)
    keys = addon_options.config_keys(options, names_url, token_file)
    path = options_file.parent / CONFIG_NAME
    header = (f"# Written by `edgeasr addon` from {options_file.name} at every start: change the add-on's "
              "options, not this file.\n")
    try:
        path.write_text(header + yaml.safe_dump(addon_options.nested(keys), sort_keys=False), "utf-8")
    except OSError as exc:
        raise OutputError(f"{path}: cannot write the configuration ({exc.strerror or exc})") from None
    try:
        load_config(path)
    except (ConfigError, MissingInputError) as exc:
        raise addon_options.named_by_option(exc, options_file) from None
    return path


def _token_file(token: str) -> Path:
    """The Supervisor's token in a file only this process's user may read, in memory where the
    container has /dev/shm: edgeasr reads tokens from files (homeassistant.token_file)."""
    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(prefix="edgeasr-", dir=shm if shm.is_dir() else None))
    path = folder / TOKEN_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token)
    return path


def _daemon_args(config: Path) -> argparse.Namespace:
    """The command line `edgeasr --config FILE` parses to."""
    return argparse.Namespace(config=config, set=[], input=None, log_level=None)


def _stop_starting(signum: int, frame: object) -> None:
    log.info("%s before the server started: stopping", signal.Signals(signum).name)
    sys.exit(0)


def announce_when_serving(supervisor: Supervisor, uri: str, local: str) -> bool:
    """Wait until the server answers `describe` at `local`, then announce `uri` through the
    Supervisor's discovery, once; a failure is logged (Home Assistant can still add it by hand)."""
    from edgeasr.wyoming.client import describe

    while True:
        try:
            asyncio.run(describe(local, DESCRIBE_TIMEOUT_S))
            break
        except (OSError, TimeoutError, EdgeAsrError):
            threading.Event().wait(DESCRIBE_POLL_S)
    try:
        uuid = supervisor.announce_wyoming(uri)
    except SupervisorError as exc:
        log.error("announcing %s to Home Assistant failed: %s; add the Wyoming integration by hand", uri, exc)
        return False
    log.info("announced %s to Home Assistant through the Supervisor's discovery (%s)", uri, uuid)
    return True


def install_hailort(folder: Path) -> None:
    """HailoRT from `folder`, if the user put it there: Hailo's .deb (libhailort, unpacked into
    the container, whose next start unpacks it again) and its Python wheel (into this venv). The
    encoder runs on the CPU without them (encoder.backend auto), as the .deb's service does."""
    debs, wheels = sorted(folder.glob("*.deb")), sorted(folder.glob("*.whl"))
    if not debs and not wheels:
        return
    for deb in debs:
        _run_step(["dpkg-deb", "--extract", str(deb), "/"], f"unpacking {deb}")
    if debs:
        _run_step(["ldconfig"], "ldconfig")
    binding = ""
    if wheels:
        _run_step([*_pip(), "install", "--quiet", "--no-index", "--no-deps", "--disable-pip-version-check",
                   *map(str, wheels)], f"installing {', '.join(map(str, wheels))}")
        # in a child, as the daemon will import it: a wheel for another Python or a library of
        # another release stops the start here, in one line, not at the first window
        binding = "; " + _run_step([sys.executable, "-c", "import hailo_platform, importlib.metadata as m; "
                                    "print('hailo_platform', m.version('hailort'), 'from', hailo_platform.__file__)"],
                                   "importing hailo_platform")
    log.info("HailoRT from %s: %s%s", folder, ", ".join(p.name for p in debs + wheels), binding)


def _pip() -> list[str]:
    """pip for this interpreter: its own, else the one Debian keeps as a wheel (pip runs from it)."""
    import importlib.util

    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    wheel = next(iter(sorted(PIP_WHEELS.glob("pip-*.whl"))), None)
    return [sys.executable, f"{wheel}/pip"] if wheel is not None else [sys.executable, "-m", "pip"]


def _run_step(argv: list[str], what: str) -> str:
    """Run one step of the install; its output's last line, or a one-line error naming it."""
    import subprocess

    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ToolMissingError(f"HailoRT from {HAILORT_DIR}: {what} failed ({last[0][:200]})")
    return (done.stdout.strip().splitlines()[-1:] or [""])[0]
