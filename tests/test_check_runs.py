"""What `edgeasr check` passes, the daemon runs; what the daemon would refuse, `check` refuses
first, with the same exit code and a line naming the key. The real CLI
in subprocesses: `python -m edgeasr check --config FILE` and the daemon on the same file."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers.daemon import run_edgeasr, write_config
from helpers.ports import free_port


def last_line(proc: subprocess.CompletedProcess) -> str:
    err = proc.stderr.strip().splitlines()
    assert err and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return err[-1]


# -- every number finite and within its real range ---------------------------------------------

OUT_OF_RANGE = [
    ("wyoming.max_audio_s", float("nan"), "wyoming.max_audio_s: nan is not allowed (0 < x <= 600)"),
    ("wyoming.max_audio_s", float("inf"), "wyoming.max_audio_s: inf is not allowed"),
    ("vad.threshold", float("nan"), "vad.threshold: nan is not allowed"),
    ("pipeline.stop_deadline_s", 1e300, "pipeline.stop_deadline_s: 1e+300 is not allowed (0 < x <= 3600)"),
    ("mqtt.keepalive_s", 1_000_000, "mqtt.keepalive_s: 1000000 is not allowed (1..65535)"),
    ("mqtt.session_expiry_s", 2**40, "mqtt.session_expiry_s: 1099511627776 is not allowed (0..4294967295)"),
    ("mqtt.client_id", "x" * 70_000, "mqtt.client_id: 'xxxx"),
    ("mqtt.metrics_interval_s", float("inf"), "mqtt.metrics_interval_s: inf is not allowed (0..86400)"),
    ("encoder.threads", 10**12, "encoder.threads: 1000000000000 is not allowed (1..64)"),
    ("decoder.threads", 10**12, "decoder.threads: 1000000000000 is not allowed (1..64)"),
    ("wyoming.uri", "tcp://0.0.0.0:99999", "wyoming.uri: tcp://0.0.0.0:99999 is not allowed (a port 1..65535)"),
    ("wyoming.uri", "tcp://0.0.0.0:0", "wyoming.uri: tcp://0.0.0.0:0 is not allowed (a port 1..65535)"),
    ("mqtt.topic_prefix", "home\x00edgeasr", "mqtt.topic_prefix: 'home\\x00edgeasr' is not allowed"),
    ("mqtt.topic_prefix", "$SYS", "mqtt.topic_prefix: '$SYS' is not allowed"),
    ("mqtt.host", "broker\x00.lan", "mqtt.host: 'broker\\x00.lan' is not allowed"),
    ("wyoming.allow", ["192.168.1.0/33"], "wyoming.allow: ['192.168.1.0/33'] is not allowed"),
    ("wyoming.max_connections", 100_000, "wyoming.max_connections: 100000 is not allowed (1..256)"),
    ("mqtt.port", 99999, "mqtt.port: 99999 is not allowed (1..65535)"),
    ("decoder.logprob_threshold", 1e300, "decoder.logprob_threshold: 1e+300 is not allowed (-100..0)"),
    ("encoder.max_failures", 10**12, "encoder.max_failures: 1000000000000 is not allowed (1..1000)"),
]


@pytest.mark.parametrize("key, value, message", OUT_OF_RANGE, ids=[f"{k}={str(v)[:20]!r}" for k, v, _ in OUT_OF_RANGE])
def test_check_and_the_daemon_refuse_the_same_values_with_78(tmp_path, capsys, key, value, message):
    """In process: the command line's main, which `python -m edgeasr` runs (the tests below run
    it whole), refuses the value while reading the configuration, before anything starts."""
    from edgeasr import cli

    settings = {"input.source": "none", "wyoming.uri": "tcp://127.0.0.1:10300", key: value}
    config = write_config(tmp_path / "edgeasr.yaml", settings)
    for args in (["check", "--config", str(config)], ["--config", str(config)]):
        code = cli.main(args)
        err = capsys.readouterr().err
        assert code == 78, err
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"edgeasr: {message}"), line
        assert len(line) < 400  # one readable line, whatever was given


def test_a_number_too_long_for_python_is_a_config_error(tmp_path):
    config = tmp_path / "edgeasr.yaml"
    config.write_text(f"wyoming:\n  max_sessions: {'9' * 5000}\n")
    proc = run_edgeasr("check", "--config", str(config))
    assert proc.returncode == 78 and "invalid YAML" in last_line(proc)


def test_what_check_passes_at_the_limits_the_daemon_runs(tiny_bundle, dev_dir, mosquitto, subscribe, tmp_path):
    """The largest values each key allows: check says ok, and the daemon transcribes a file and
    publishes it under the 256-character prefix with a 128-character client id."""
    prefix = "p" * 256
    settings = {**mosquitto.overrides(keepalive_s=65535, session_expiry_s=2**32 - 1, client_id="c" * 128,
                                      topic_prefix=prefix),
                "model.path": tiny_bundle, "encoder.backend": "onnx", "encoder.threads": 64,
                "decoder.threads": 64, "state_dir": tmp_path / "state", "device_id": "d" * 64,
                "input.source": "file", "input.path": dev_dir / "audio" / "cmu_goforward.wav",
                "wyoming.max_audio_s": 600.0, "pipeline.stop_deadline_s": 3600.0}
    config = write_config(tmp_path / "edgeasr.yaml", settings)
    sub = subscribe(mosquitto, [f"{prefix}/#"])
    check = run_edgeasr("check", "--config", str(config))
    assert check.returncode == 0, check.stdout + check.stderr
    daemon = run_edgeasr("--config", str(config))
    assert daemon.returncode == 0, daemon.stderr[-3000:]
    got = sub.wait_count(f"{prefix}/{'d' * 64}/transcript", 1, timeout_s=20)
    assert got and got[0].json()["text"]


# -- a unix socket path that holds something else is never deleted ------------------------------


@pytest.mark.parametrize("kind", ["file", "directory", "fifo"])
def test_a_unix_path_that_is_not_a_socket_is_refused_with_78_and_kept(tmp_path, kind):
    path = tmp_path / "wyoming.sock"
    if kind == "file":
        path.write_text("keep me")
    elif kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    config = write_config(tmp_path / "edgeasr.yaml", {"input.source": "none", "wyoming.uri": f"unix://{path}"})
    for args in (["check", "--config", str(config)], ["--config", str(config)]):
        proc = run_edgeasr(*args)
        assert proc.returncode == 78
        assert last_line(proc).startswith(f"edgeasr: wyoming.uri: {path} exists and is ")
        assert "not a socket" in last_line(proc)
    assert path.exists() and (kind != "file" or path.read_text() == "keep me")


def test_a_unix_socket_in_a_missing_directory_fails_check(tmp_path):
    config = write_config(tmp_path / "edgeasr.yaml", {"input.source": "none", "model.path": tmp_path,
                                                      "wyoming.uri": f"unix://{tmp_path}/no/such/dir/w.sock"})
    proc = run_edgeasr("check", "--config", str(config))
    assert "wyoming: FAILED: wyoming.uri: the socket's directory" in proc.stdout
    assert proc.returncode in (65, 73)  # the model dir is no bundle (65) comes first


def test_a_tcp_host_that_is_not_this_machine_fails_check_as_the_daemon_would(tmp_path, tiny_bundle):
    config = write_config(tmp_path / "edgeasr.yaml", {"input.source": "none", "model.path": tiny_bundle,
                                                      "encoder.backend": "onnx",
                                                      "wyoming.uri": "tcp://192.0.2.1:10300"})  # TEST-NET-1
    check = run_edgeasr("check", "--config", str(config))
    assert check.returncode == 78 and "wyoming: FAILED: wyoming.uri: cannot listen on 192.0.2.1" in check.stdout
    daemon = run_edgeasr("--config", str(config))
    assert daemon.returncode == 78 and "wyoming.uri: cannot serve tcp://192.0.2.1:10300" in last_line(daemon)


# -- the password file and state_dir, as the daemon will use them -------------------------------


def broker_config(tmp_path: Path, tiny_bundle: Path, **keys) -> Path:
    port = free_port()  # nobody listens on it: the daemon fails before it connects
    settings = {"input.source": "none", "wyoming.uri": f"tcp://127.0.0.1:{port}", "model.path": tiny_bundle,
                "encoder.backend": "onnx", "mqtt.host": "127.0.0.1", "mqtt.port": port,
                "state_dir": tmp_path / "state", **keys}
    return write_config(tmp_path / "edgeasr.yaml", settings)


def check_and_daemon(config: Path, prefix: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, ...]:
    return (run_edgeasr("check", "--config", str(config), prefix=prefix),
            run_edgeasr("--config", str(config), prefix=prefix, timeout=120))


def setup_case(case: str, tmp_path: Path) -> dict:
    if case == "missing password file":
        return {"mqtt.username": "u", "mqtt.password_file": tmp_path / "absent"}
    if case == "empty password file":
        (tmp_path / "pw").write_text("\n")
        return {"mqtt.username": "u", "mqtt.password_file": tmp_path / "pw"}
    if case == "dangling state_dir":
        (tmp_path / "state").symlink_to(tmp_path / "gone")
        return {}
    if case == "state_dir is a file":
        (tmp_path / "state").write_text("not a directory")
        return {}
    raise AssertionError(case)


UNUSABLE_PATHS = [("missing password file", 66, "mqtt.password_file: cannot read"),
        ("empty password file", 78, "mqtt.password_file: "),
        ("dangling state_dir", 73, "state_dir: "),
        ("state_dir is a file", 73, "state_dir: ")]


@pytest.mark.parametrize("case, code, named", UNUSABLE_PATHS, ids=[c for c, _, _ in UNUSABLE_PATHS])
def test_check_fails_as_the_daemon_would(tiny_bundle, tmp_path, case, code, named):
    config = broker_config(tmp_path, tiny_bundle, **setup_case(case, tmp_path))
    check, daemon = check_and_daemon(config)
    assert check.returncode == code, check.stdout + check.stderr
    assert last_line(check).startswith(f"edgeasr: {named}"), last_line(check)
    assert daemon.returncode == code, daemon.stderr[-2000:]
    assert last_line(daemon).startswith(f"edgeasr: {named}"), last_line(daemon)


def test_an_unwritable_state_dir_fails_check_as_the_daemon_would(tiny_bundle, tmp_path):
    """As the service user meets it: root without its power to write anywhere (setpriv drops
    CAP_DAC_OVERRIDE), a state_dir of mode 0555."""
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o555)
    config = broker_config(tmp_path, tiny_bundle)
    drop = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all", "--")
    try:
        check, daemon = check_and_daemon(config, prefix=drop)
    finally:
        state.chmod(0o755)
    assert check.returncode == 73 and "state_dir: FAILED: state_dir: " in check.stdout, check.stdout
    assert "cannot be written" in last_line(check)
    assert daemon.returncode == 73 and last_line(daemon).startswith("edgeasr: state_dir: "), daemon.stderr[-2000:]


def test_a_state_dir_still_to_be_made_passes_check_and_the_daemon_makes_it(tiny_bundle, tmp_path):
    config = broker_config(tmp_path, tiny_bundle, state_dir=tmp_path / "a" / "b" / "state")
    check = run_edgeasr("check", "--config", str(config))
    assert f"state_dir: ok ({tmp_path}/a/b/state, to be created in {tmp_path})" in check.stdout
    assert check.returncode == 69  # the broker's port is closed: only that fails
