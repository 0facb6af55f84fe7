"""`edgeasr models compile-hef`: the bundle's Hailo-ready encoder ONNX -> a HEF for hailo8/hailo8l.

The three steps of the Hailo Dataflow Compiler (DFC, >= 3.27; x86-64 Ubuntu; from the Hailo
Developer Zone), through its Python API (hailo_sdk_client.ClientRunner) when importable, else
its `hailo` command:

  parse     ClientRunner(hw_arch).translate_onnx_model(onnx, net_name, start_node_names,
            end_node_names, net_input_shapes)  |  hailo parser onnx ... --har-path
  optimize  runner.load_model_script(alls); runner.optimize(calib)  |  hailo optimize ...
  compile   runner.compile() -> HEF bytes  |  hailo compiler ...

(Python API as hailocs/hailo-whisper conversion/convert_whisper_encoder.py uses it with DFC
3.31; CLI flags as public DFC 3.x conversion scripts use them -- the DFC User Guide is behind
the Developer Zone login and neither form was run here: no DFC on this machine.)

Layout. Our encoder's ONNX input is NHWC mel [1, 1, F, M] followed by a Transpose to NCHW
[1, M, 1, F] for the first Conv. The DFC parser wants NCHW convolution inputs and presents
every HEF input as NHWC without batch, so parsing starts at that first Conv
(start_node_names=[conv1], net_input_shapes={conv1: [1, M, 1, F]}): the Transpose stays out
of the HEF (nothing to run on the host for it) and the HEF input is the conv's NCHW input
seen as NHWC, (1, F, M) -- exactly the bytes of edgeasr.asr.features' [1, 1, F, M] window, and the
layout Hailo's own Whisper encoder HEF takes ((1, 1000, 80) for tiny, 10 s).

Quantization. The model script follows hailocs/hailo-whisper
conversion/optimization/tiny.en/hailo8/encoder_model_script_tiny.en.alls (commit ebe7a85; the
hailo8l script is identical): optimization level 2, no compression, finetune (6 epochs, lr 1e-5),
zero-point compensation and equalization on the matmuls, 16-bit element-wise adds, batch-1
compilation. Its per-layer lines (conv4..conv18 at a16_w16, ew_add1 at a8_w8) name layers by the
DFC's parse order of Hailo's graph and are left out: our graph's layer numbering may differ.
Finetune needs >= FINETUNE_MIN calibration windows (Hailo used 3340 of 4000).

The HEF is written into the bundle (default encoder.<arch>.hef) and recorded in manifest.json
as files.encoder_hef (sha256, arch) plus a `hailo` section (net name, vstream names when
HailoRT can read them here, calibration).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeasr.bundle import Bundle, load_bundle
from edgeasr.errors import (
    EdgeAsrError,
    MissingInputError,
    ModelError,
    OutputError,
    ToolMissingError,
    UsageError,
)
from edgeasr.lab.hailo import ARCHES
from edgeasr.models.hef_import import record_hef

log = logging.getLogger(__name__)

DFC_MIN = (3, 27)
NET_NAME = "edgeasr_encoder"
CALIB_PLACEHOLDER = "CALIB.npy"
# hailo-whisper tiny encoder script values (see the module docstring)
FINETUNE_DATASET = 3340
FINETUNE_EPOCHS = 6
FINETUNE_LR = "0.00001"
FINETUNE_BATCH = 4
FINETUNE_MIN = 1024
CALIB_BATCH = 8
CALIBSET_SIZE = 1024
NHWC_TO_NCHW = [0, 3, 1, 2]

DFC_MISSING = (
    "compiling a HEF needs the Hailo Dataflow Compiler >= 3.27 (Python package hailo_sdk_client, "
    "which provides the `hailo` command) from the Hailo Developer Zone, on x86-64 Ubuntu; "
    "run with --dry-run to print the commands"
)


@dataclass(frozen=True)
class Plan:
    bundle: Bundle
    arch: str
    onnx: Path
    start_node: str
    end_node: str
    start_shape: tuple[int, ...]  # NCHW shape at the start node
    calib: Path | None
    calib_count: int
    work_dir: Path
    out: Path

    @property
    def har(self) -> Path:
        return self.work_dir / f"{NET_NAME}.har"

    @property
    def optimized_har(self) -> Path:
        return self.work_dir / f"{NET_NAME}_optimized.har"

    @property
    def model_script(self) -> Path:
        return self.work_dir / f"{NET_NAME}.alls"

    @property
    def compiled_hef(self) -> Path:
        return self.work_dir / f"{NET_NAME}.hef"


def model_script(calib_count: int) -> str:
    """The .alls model script for a calibration set of calib_count windows."""
    if calib_count >= FINETUNE_MIN:
        finetune = (
            f"post_quantization_optimization(finetune, policy=enabled, "
            f"dataset_size={min(FINETUNE_DATASET, calib_count)}, epochs={FINETUNE_EPOCHS}, "
            f"learning_rate={FINETUNE_LR}, batch_size={FINETUNE_BATCH})"
        )
    else:
        finetune = "post_quantization_optimization(finetune, policy=disabled)"
    matmuls = "layers={matmul*}"
    lines = [
        "# edgeasr: Whisper encoder, after hailocs/hailo-whisper encoder_model_script_tiny.en.alls",
        "model_optimization_flavor(optimization_level=2, compression_level=0)",
        finetune,
        "pre_quantization_optimization(ew_add_fusing, policy=disabled)",
        f"pre_quantization_optimization(matmul_correction, {matmuls}, correction_type=zp_comp_block)",
        f"model_optimization_config(calibration, batch_size={min(CALIB_BATCH, calib_count)}, "
        f"calibset_size={min(CALIBSET_SIZE, calib_count)})",
        "quantization_param({ew_add*}, precision_mode=a16_w16)",
        f"pre_quantization_optimization(matmul_equalization, {matmuls}, matmul_bias=enabled)",
        "performance_param(compiler_optimization_level=max, optimize_for_batch=1)",
        "model_optimization_config(checker_cfg, policy=enabled)",
    ]
    return "\n".join(lines) + "\n"


def parse_points(onnx_path: Path) -> tuple[str, str, tuple[int, ...]]:
    """(start node, end node, NCHW shape at the start) for the DFC parser (see the docstring)."""
    try:
        import onnx
    except ImportError as exc:
        raise ToolMissingError("compile-hef needs the onnx package: pip install onnx") from exc
    try:
        g = onnx.load(str(onnx_path), load_external_data=False).graph
    except Exception as exc:  # noqa: BLE001 - protobuf errors for a bad file
        raise ModelError(f"{onnx_path}: not a readable ONNX model ({exc})") from exc
    inits = {i.name for i in g.initializer}
    inputs = [i for i in g.input if i.name not in inits]
    if len(inputs) != 1 or len(g.output) != 1:
        raise ModelError(f"{onnx_path}: the encoder must have one input and one output")
    mel = inputs[0]
    dims = tuple(d.dim_value for d in mel.type.tensor_type.shape.dim)
    end = next((n.name for n in g.node if g.output[0].name in n.output), None)
    if end is None:
        raise ModelError(f"{onnx_path}: no node produces the output {g.output[0].name}")
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    first = consumers.get(mel.name, [])
    if len(first) == 1 and first[0].op_type == "Transpose":
        perm = next((list(a.ints) for a in first[0].attribute if a.name == "perm"), None)
        after = consumers.get(first[0].output[0], [])
        if perm == NHWC_TO_NCHW and len(after) == 1 and after[0].op_type == "Conv":
            return after[0].name, end, tuple(dims[i] for i in NHWC_TO_NCHW)
    raise ModelError(
        f"{onnx_path}: expected the NHWC input {mel.name} to feed one Transpose(perm=[0, 3, 1, 2]) into "
        "a Conv (edgeasr's Hailo-ready encoder layout); re-export with `edgeasr models import`"
    )


def _calib_count(calib: Path, bundle: Bundle) -> int:
    if not calib.is_file():
        raise MissingInputError(f"--calib {calib}: file not found (make one with `edgeasr models calib`)")
    try:
        data = np.load(calib, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise ModelError(f"--calib {calib}: not a .npy array ({exc})") from exc
    want = (1, bundle.audio.n_frames, bundle.audio.n_mels)
    if data.ndim != 4 or tuple(data.shape[1:]) != want or data.dtype != np.float32 or not len(data):
        raise ModelError(
            f"--calib {calib}: {data.dtype} {tuple(data.shape)}, expected float32 "
            f"(N, {', '.join(map(str, want))}) log-mel windows for this bundle"
        )
    return int(data.shape[0])


def plan(bundle_dir: Path, arch: str, calib: Path | None, out: Path | None, dry_run: bool) -> Plan:
    if arch not in ARCHES:
        raise UsageError(f"--arch must be one of {', '.join(ARCHES)}, got {arch!r}")
    bundle = load_bundle(Path(bundle_dir))
    onnx_path = bundle.path("encoder")
    start, end, start_shape = parse_points(onnx_path)
    if calib is None and not dry_run:
        raise UsageError("--calib FILE is required (make one with `edgeasr models calib --audio DIR`)")
    count = _calib_count(Path(calib), bundle) if calib is not None else FINETUNE_MIN
    out = Path(out) if out else bundle.root / f"encoder.{arch}.hef"
    return Plan(
        bundle,
        arch,
        onnx_path,
        start,
        end,
        start_shape,
        Path(calib) if calib else None,
        count,
        bundle.root / "hailo-build" / arch,
        out,
    )


def commands(p: Plan) -> list[str]:
    """The DFC steps in CLI form (what --dry-run prints; the `hailo` CLI path runs them)."""
    calib = str(p.calib) if p.calib else CALIB_PLACEHOLDER
    return [
        shlex.join(c)
        for c in (
            [
                "hailo",
                "parser",
                "onnx",
                str(p.onnx),
                "--net-name",
                NET_NAME,
                "--hw-arch",
                p.arch,
                "--start-node-names",
                p.start_node,
                "--end-node-names",
                p.end_node,
                "--har-path",
                str(p.har),
                "-y",
            ],
            [
                "hailo",
                "optimize",
                str(p.har),
                "--hw-arch",
                p.arch,
                "--calib-set-path",
                calib,
                "--model-script",
                str(p.model_script),
                "--output-har-path",
                str(p.optimized_har),
            ],
            ["hailo", "compiler", str(p.optimized_har), "--hw-arch", p.arch, "--output-dir", str(p.work_dir)],
            ["cp", str(p.compiled_hef), str(p.out)],
        )
    ]


def _dfc() -> tuple[str, object]:
    """('python', hailo_sdk_client) or ('cli', path of `hailo`)."""
    from importlib.util import find_spec

    if find_spec("hailo_sdk_client") is not None:
        import hailo_sdk_client

        version = getattr(hailo_sdk_client, "__version__", "")
        parts = tuple(int(x) for x in version.split(".")[:2] if x.isdigit())
        if len(parts) == 2 and parts < DFC_MIN:
            raise ToolMissingError(
                f"the Hailo Dataflow Compiler is {version}; edgeasr needs >= 3.27 (DFC 3.x for Hailo-8/8L)"
            )
        return "python", hailo_sdk_client
    hailo = shutil.which("hailo")
    if hailo:
        return "cli", hailo
    raise ToolMissingError(DFC_MISSING)


def _write_script(p: Plan) -> None:
    try:
        p.work_dir.mkdir(parents=True, exist_ok=True)
        p.model_script.write_text(model_script(p.calib_count))
    except OSError as exc:
        raise OutputError(f"{p.work_dir}: cannot write the DFC work files ({exc.strerror or exc})") from exc


def compile_hef(
    bundle_dir: Path, arch: str, calib: Path | None, out: Path | None, dry_run: bool
) -> list[str]:
    """Compile (or with dry_run only plan) the bundle's encoder HEF; returns the CLI commands."""
    p = plan(bundle_dir, arch, calib, out, dry_run)
    cmds = commands(p)
    if dry_run:
        _write_script(p)  # an input of the printed commands
        return cmds
    kind, dfc = _dfc()
    from edgeasr.lab.hailo.lint import lint

    problems = lint(p.onnx)
    if problems:
        raise ModelError(
            f"{p.onnx}: {len(problems)} Hailo DFC problem(s), first: {problems[0]} "
            f"(see `edgeasr models lint-hailo {p.bundle.root}`)"
        )
    _write_script(p)
    if kind == "python":
        hef = _compile_python(p)
    else:
        _compile_cli(p, cmds[:3])
        if not p.compiled_hef.is_file():
            raise ModelError(f"the DFC finished but wrote no {p.compiled_hef}")
        hef = p.compiled_hef.read_bytes()
    _write_atomic(p.out, hef)
    record_hef(
        p.bundle.root,
        p.out,
        p.arch,
        _vstreams(p.out),
        {
            "net_name": NET_NAME,
            "start_node": p.start_node,
            "end_node": p.end_node,
            "calibration": {"file": str(p.calib), "windows": p.calib_count},
            "dfc": kind,
        },
    )
    return cmds


def _compile_python(p: Plan) -> bytes:
    from hailo_sdk_client import ClientRunner

    step = "parse"
    try:
        runner = ClientRunner(hw_arch=p.arch)
        runner.translate_onnx_model(
            str(p.onnx),
            NET_NAME,
            start_node_names=[p.start_node],
            end_node_names=[p.end_node],
            net_input_shapes={p.start_node: list(p.start_shape)},
        )
        runner.save_har(str(p.har))
        step = "optimize"
        runner.load_model_script(str(p.model_script))
        runner.optimize(np.load(str(p.calib)))  # set: plan() requires --calib unless dry_run
        runner.save_har(str(p.optimized_har))
        step = "compile"
        return runner.compile()
    except EdgeAsrError:
        raise
    except Exception as exc:  # noqa: BLE001 - the DFC raises its own exception types
        raise ModelError(
            f"the Hailo DFC failed to {step} {p.onnx.name}: {type(exc).__name__}: {exc} "
            f"(logs in {p.work_dir})"
        ) from exc


def _compile_cli(p: Plan, cmds: list[str]) -> None:
    for cmd in cmds:
        log.info("running: %s", cmd)
        try:
            done = subprocess.run(shlex.split(cmd), cwd=p.work_dir)
        except OSError as exc:
            raise ToolMissingError(f"{DFC_MISSING} ({exc})") from exc
        if done.returncode:
            raise ModelError(f"the Hailo DFC failed (exit {done.returncode}): {cmd} (logs in {p.work_dir})")


def _vstreams(hef: Path) -> dict | None:
    """The HEF's vstream names, when HailoRT is installed here too."""
    try:
        from edgeasr.asr.hailo import hef_vstreams

        return hef_vstreams(hef)
    except (ToolMissingError, ModelError) as exc:
        log.info("vstream names not recorded: %s", exc)
        return None


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.part")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write ({exc.strerror or exc})") from exc
