"""`edgeasr self-test [--prepare]`: does what the daemon runs load here?

Three parts, one line each: every runtime package imported (numpy, onnxruntime, soxr,
webrtcvad, paho, yaml, ...; Debian's systemd binding and HailoRT too where installed); the
embedded weights package's files read and checked against the sha256 sums pip recorded; the
graphs opened with onnxruntime: those of the bundle `model.path` names or of the prepared
embedded default (`--prepare` prepares it first, as the daemon's first start would), else a
small graph built in memory and run against numpy.

The imports and the graphs run in a child interpreter, so that a package that crashes the
process (a segfault in an extension built for another CPU or page size) is named instead of
taking the test down. A failure is one line naming the package, exit 70.

The package's postinst runs `python -m edgeasr.commands.selftest --prepare` as the service's
user: in that form nothing outside the standard library is imported before the imports are
tested (the `edgeasr` command line itself needs yaml and numpy).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import signal
import subprocess
import sys
from base64 import urlsafe_b64encode
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeasr.errors import EdgeAsrError, PackageLoadError

log = logging.getLogger(__name__)

# What the daemon, `transcribe` and the default bundle's import load (tests/test_selftest.py
# keeps it in step with edgeasr's required distributions).
RUNTIME_MODULES = (
    "numpy", "onnxruntime", "onnx", "safetensors", "yaml", "paho.mqtt.client", "soundfile", "soxr",
    "threadpoolctl", "tokenizers", "webrtcvad", "sounddevice", "tqdm", "wyoming.server", "wyoming.zeroconf",
    "zeroconf", "websockets.sync.client",
)
# Loaded where installed: journald and sd_notify (Debian's python3-systemd under the package) and
# HailoRT's binding (python3-hailort, or a wheel in /opt/edgeasr/wheels), which must run on the
# venv's numpy.
OPTIONAL_MODULES = ("systemd.daemon", "systemd.journal", "hailo_platform")
CHILD_TIMEOUT_S = 1800  # far above the slowest part seen (emulated arm64, a busy machine): a hang
MARK = "edgeasr-self-test "  # the child's report lines, told apart from what libraries print
PROBE_WIDTH = 8  # the in-memory graph: LayerNormalization then MatMul, on a [1, PROBE_WIDTH] input
PROBE_TOLERANCE = 1e-4
LAYER_NORM_EPSILON = 1e-5  # the operator's default
RECORD_ALGORITHM = "sha256"  # what pip writes into RECORD


@dataclass(frozen=True)
class Step:
    """One thing the child does: import a module, open a graph file, or run the in-memory graph."""

    kind: str  # "import", "graph" or "probe"
    target: str  # the module, the graph's path, or "" for the probe
    package: str  # what a failure names: a distribution and its version


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prepare", action="store_true",
                        help="prepare the embedded default bundle in state_dir first (as the daemon's first start "
                        "would) and open its graphs")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("self-test", help="import the runtime packages, read the default weights and open "
                              "the graphs with onnxruntime (the package's postinst runs it)")
    add_options(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    print(f"imports: {check_imports(runtime_modules())}")
    return check_loaded(args)


def check_loaded(args: argparse.Namespace) -> int:
    """The weights and the graphs (the imports passed: the configuration may be read)."""
    from edgeasr.commands.common import load

    cfg = load(args)
    if cfg.model.path is None:
        print(f"weights: {check_weights()}")
    else:
        print(f"weights: not used (model.path is {cfg.model.path})")
    print(f"graphs: {check_graphs(bundle_dir(cfg.model.path, cfg.state_dir, args.prepare))}")
    return 0


# --- the parts --------------------------------------------------------------------------------


def runtime_modules() -> list[str]:
    """RUNTIME_MODULES, then the optional ones whose top-level package is installed."""
    return [*RUNTIME_MODULES, *(m for m in OPTIONAL_MODULES if importlib.util.find_spec(m.split(".")[0]))]


def check_imports(modules: list[str], env: Mapping[str, str] | None = None) -> str:
    owners = importlib.metadata.packages_distributions()
    steps = [Step("import", m, _package(owners.get(m.split(".")[0], [m.split(".")[0]])[0])) for m in modules]
    packages = run_steps(steps, env)
    return f"ok ({len(steps)} modules: {', '.join(sorted(set(packages)))})"


def check_weights(dist: importlib.metadata.Distribution | None = None) -> str:
    """Every file of the embedded default's weights package (or of `dist`), read and checked
    against the sha256 sums in its RECORD."""
    from edgeasr.models.default import SOURCE

    if dist is None:
        try:
            dist = importlib.metadata.distribution(SOURCE)
        except importlib.metadata.PackageNotFoundError:
            raise PackageLoadError(f"self-test: cannot load {SOURCE}: not installed (the embedded default's "
                                   "weights; or set model.path to a bundle)") from None
    package = f"{dist.metadata['Name']} {dist.version}"
    total, checked = 0, 0
    for entry in dist.files or ():
        if entry.hash is None or entry.hash.mode != RECORD_ALGORITHM:
            continue  # RECORD itself, compiled bytecode
        path = Path(str(entry.locate()))
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise PackageLoadError(f"self-test: cannot load {package}: {path}: {exc.strerror or exc}") from exc
        digest = urlsafe_b64encode(hashlib.new(RECORD_ALGORITHM, data).digest()).rstrip(b"=").decode()
        if digest != entry.hash.value:
            raise PackageLoadError(f"self-test: cannot load {package}: {path} does not match its "
                                   f"{RECORD_ALGORITHM} in RECORD (corrupt)")
        total, checked = total + len(data), checked + 1
    if not checked:
        raise PackageLoadError(f"self-test: cannot load {package}: RECORD lists no files with a {RECORD_ALGORITHM}")
    return f"ok ({package}: {checked} files, {total / 1e6:.1f} MB, {RECORD_ALGORITHM} as recorded)"


def bundle_dir(model_path: Path | None, state_dir: Path, prepare: bool) -> Path | None:
    """The bundle whose graphs are opened: model.path's, else the embedded default if prepared
    (or prepared now), else None (the in-memory graph)."""
    if model_path is not None:
        return model_path
    from edgeasr.models.default import prepare_default, prepared_default

    return prepare_default(state_dir) if prepare else prepared_default(state_dir)


def check_graphs(bundle: Path | None, env: Mapping[str, str] | None = None) -> str:
    package = _package("onnxruntime")
    if bundle is None:
        run_steps([Step("probe", "", package)], env)
        return f"ok (no bundle prepared: a graph built in memory runs on {package} as numpy computes it)"
    from edgeasr.bundle import load_bundle

    manifest = load_bundle(bundle, verify_checksums=True).manifest
    graphs = sorted(entry["path"] for entry in manifest["files"].values() if entry["path"].endswith(".onnx"))
    run_steps([Step("graph", str(bundle / name), package) for name in graphs], env)
    return f"ok ({len(graphs)} graphs of {bundle} opened with {package})"


def _package(distribution: str) -> str:
    """The distribution and its installed version, as a failure names it: every version when a
    wheel added with --ignore-installed left two beside each other."""
    versions = sorted({dist.version for dist in importlib.metadata.distributions(name=distribution)})
    return f"{distribution} {' and '.join(versions)}" if versions else distribution


# --- the child interpreter ----------------------------------------------------------------------


def run_steps(steps: list[Step], env: Mapping[str, str] | None = None) -> list[str]:
    """Run the steps in a child interpreter (this one's, with `env` or our environment); returns
    each step's package. Raises
    PackageLoadError naming the packages whose step raised, or the one whose step the child
    died in (a signal, an exit, a hang)."""
    code = "from edgeasr.commands.selftest import child; child()"
    request = json.dumps([step.__dict__ for step in steps])
    try:
        done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], input=request,
                              capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT_S)
        stdout, stderr, returncode = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        stdout, stderr, returncode = _text(exc.stdout), _text(exc.stderr), None
    reports = [json.loads(line[len(MARK):]) for line in stdout.splitlines() if line.startswith(MARK)]
    if stderr.strip():
        log.debug("self-test child's stderr:\n%s", stderr.rstrip())
    failed = [f"{steps[r['step']].package} ({_what(steps[r['step']])}: {r['error']})" for r in reports if "error" in r]
    finished = {r["step"] for r in reports if "error" in r or "ok" in r}
    started = [r["step"] for r in reports if "start" in r]
    if returncode != 0 and started and started[-1] not in finished:
        step = steps[started[-1]]
        failed.append(f"{step.package} ({_what(step)}: {_death(returncode)})")
    elif returncode != 0 and not failed:
        failed.append(f"the self-test's child interpreter ({_death(returncode)}: {stderr.strip()[-200:]})")
    if failed:
        raise PackageLoadError(f"self-test: cannot load {'; '.join(failed)}")
    return [step.package for step in steps]


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def _what(step: Step) -> str:
    return {"import": f"import {step.target}", "graph": f"open {Path(step.target).name}",
            "probe": "run a graph built in memory"}[step.kind]


def _death(returncode: int | None) -> str:
    if returncode is None:
        return f"no answer in {CHILD_TIMEOUT_S} s"
    if returncode < 0:
        return f"crashed with {signal.Signals(-returncode).name}"
    return f"the interpreter exited with status {returncode}"


def child() -> None:
    """The child's side: read the steps as JSON from stdin, report each on stdout."""
    for index, raw in enumerate(json.load(sys.stdin)):
        step = Step(**raw)
        _report({"step": index, "start": True})
        try:
            _do(step)
        except Exception as exc:  # any failure to load is the finding, named by its step
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            _report({"step": index, "error": f"{type(exc).__name__}: {first}"})
        else:
            _report({"step": index, "ok": True})


def _report(message: dict) -> None:
    print(MARK + json.dumps(message), flush=True)


def _do(step: Step) -> None:
    if step.kind == "import":
        importlib.import_module(step.target)
    elif step.kind == "graph":
        from edgeasr.asr.encoder import ort_session

        ort_session(Path(step.target), threads=1)
    else:
        _run_probe()


def _run_probe() -> None:
    """LayerNormalization then MatMul on onnxruntime's CPU kernels, against numpy."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from edgeasr.models.graphs import DECODER_OPSET

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, PROBE_WIDTH)).astype(np.float32)
    w = rng.standard_normal((PROBE_WIDTH, PROBE_WIDTH)).astype(np.float32)
    scale, bias = np.ones(PROBE_WIDTH, np.float32), np.zeros(PROBE_WIDTH, np.float32)
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["normed"]),
         helper.make_node("MatMul", ["normed", "w"], ["y"])],
        "self_test",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, PROBE_WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, PROBE_WIDTH])],
        [numpy_helper.from_array(a, n) for a, n in ((scale, "scale"), (bias, "bias"), (w, "w"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DECODER_OPSET)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x})
    normed = (x - x.mean()) / np.sqrt(x.var() + LAYER_NORM_EPSILON)
    if not np.allclose(y, normed @ w, rtol=PROBE_TOLERANCE, atol=PROBE_TOLERANCE):
        raise ArithmeticError(f"onnxruntime computed {y.ravel()[:3]}..., numpy {(normed @ w).ravel()[:3]}...")


# --- `python -m edgeasr.commands.selftest`: the postinst's form ------------------------------------


def standalone(argv: list[str]) -> int:
    """The imports first, with nothing but the standard library loaded here; then the rest, with
    the shared options (--config, --set) as `edgeasr self-test` has them."""
    try:
        print(f"imports: {check_imports(runtime_modules())}")
        from edgeasr.commands.common import add_arguments

        parser = argparse.ArgumentParser(prog="python -m edgeasr.commands.selftest")
        add_options(parser)
        add_arguments(parser)
        return check_loaded(parser.parse_args(argv))
    except EdgeAsrError as exc:
        print(f"edgeasr: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(standalone(sys.argv[1:]))
