"""`edgeasr models import SOURCE --out B --hef FILE`: a published encoder HEF with its weights.

Compiling a HEF needs Hailo's Dataflow Compiler (a licence, x86). Without it, a Hailo-8 user
takes an encoder HEF Hailo publishes for its own Whisper app and the Hugging Face Whisper
directory it was built from; `models import` exports the weights (the decoder runs on the
CPU), copies the HEF into the bundle and records it in its manifest (record_hef, which the lab's
compile-hef records the HEFs it compiles with too).

What is checked depends on what this machine has:
- always: the file exists and, when HailoRT cannot read it here, starts with the HEF magic
  ("\\x01HEF": hailort hef.cpp HEADER_MAGIC 0x01484546, big-endian), which catches an HTML
  error page saved by a failed download;
- with HailoRT (hailo_platform): its input and output shapes against the bundle: window
  frames and mel bins in, positions and width out. The window is checked before the import
  (it only depends on --window-s), the rest after it;
- with a Hailo device too: one window of a synthetic voice through the HEF and through the
  bundle's ONNX encoder. Their features must agree (MIN_SIMILARITY): a HEF compiled from other
  weights (Hailo's multilingual tiny HEF with tiny.en weights) gives unrelated features.
Without HailoRT the HEF is recorded unchecked: the daemon checks its shapes when it opens it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeasr.bundle import MANIFEST, Bundle, file_entry, load_bundle
from edgeasr.errors import DeviceError, MissingInputError, ModelError, OutputError, ToolMissingError, UsageError

log = logging.getLogger(__name__)

HEF_MAGIC = b"\x01HEF"
FRAMES_PER_S = 100  # Whisper's mel: 16 kHz, hop 160
WHISPER_BY_WIDTH = {384: "tiny", 512: "base", 768: "small", 1024: "medium", 1280: "large"}
# Per-channel-centred cosine similarity of the HEF's features and the ONNX encoder's. Measured
# on tiny.en (both inputs: this synthetic voice and a speech clip): int8 weights 0.993-0.996,
# the same graph with other weights 0.04. Hailo's quantised HEF was not measured (no device):
# the bound is set far from both.
MIN_SIMILARITY = 0.5


@dataclass(frozen=True)
class HefShapes:
    """A HEF's vstream shapes as HailoRT reports them (no batch; NHWC as (H, W, C))."""

    input: tuple[int, ...]
    output: tuple[int, ...]
    vstreams: dict  # names and shapes, for the manifest (edgeasr.asr.hailo.hef_vstreams)


@dataclass(frozen=True)
class AttachedHef:
    path: Path  # inside the bundle
    arch: str
    checked: str  # what was checked, for the user


def guess_arch(hef: Path) -> str:
    """Hailo names its Hailo-8L HEFs *_h8l.hef. (A wrong guess only words the wrong-chip error
    differently: a Hailo-8 runs Hailo-8L HEFs.)"""
    return "hailo8l" if Path(hef).stem.lower().endswith("_h8l") else "hailo8"


def read_shapes(hef: Path) -> HefShapes | None:
    """The HEF's shapes, or None when HailoRT is not installed here."""
    if not Path(hef).is_file():
        raise MissingInputError(f"--hef {hef}: file not found")
    from edgeasr.asr.hailo import hef_vstreams

    try:
        v = hef_vstreams(Path(hef))
    except ToolMissingError:
        if Path(hef).read_bytes()[:4] != HEF_MAGIC:
            raise ModelError(f"--hef {hef}: not a HEF (it does not start with the HEF magic; "
                             "a failed download?)") from None
        return None
    return HefShapes(tuple(v["input_shape"]), tuple(v["output_shape"]), v)


def window_problem(shapes: HefShapes, window_s: float) -> str | None:
    frames = shapes.input[-2] if len(shapes.input) >= 2 else None
    if frames is None or frames == round(window_s * FRAMES_PER_S):
        return None
    return (f"the HEF takes {frames} mel frames ({frames / FRAMES_PER_S:g} s windows), the bundle would "
            f"take {round(window_s * FRAMES_PER_S)} ({window_s:g} s): import with "
            f"--window-s {frames / FRAMES_PER_S:g}")


def _whisper(width: int) -> str:
    return f"Whisper {WHISPER_BY_WIDTH[width]}" if width in WHISPER_BY_WIDTH else f"a {width}-wide model"


def shape_problems(shapes: HefShapes, bundle: Bundle) -> list[str]:
    """What does not fit between the HEF and the bundle, each with how to fix it."""
    a, problems = bundle.audio, []
    hwc = tuple(shapes.input)
    if len(hwc) != 3 or hwc[0] != 1:
        return [f"the HEF's input is {hwc}; an encoder HEF takes one mel window (1, frames, mel bins)"]
    window = window_problem(shapes, a.window_s)
    if window:
        problems.append(window)
    if hwc[2] != a.n_mels:
        problems.append(f"the HEF takes {hwc[2]} mel bins, the model {a.n_mels}: it was compiled for "
                        "another model")
    width, positions = shapes.output[-1], int(np.prod(shapes.output[:-1]))
    if width != bundle.d_model:
        problems.append(f"the HEF gives {width}-wide features ({_whisper(width)}), the bundle's decoder "
                        f"is {_whisper(bundle.d_model)} ({bundle.d_model} wide): import the weights the "
                        f"HEF was compiled from (openai/whisper-{WHISPER_BY_WIDTH.get(width, '...')})")
    elif positions != a.n_positions and not window:
        problems.append(f"the HEF gives {positions} positions, the bundle's decoder reads {a.n_positions}")
    return problems


def precheck_hef(hef: Path, window_s: float) -> HefShapes | None:
    """Before the (long) import: the file, and the window when HailoRT can read the HEF."""
    shapes = read_shapes(hef)
    problem = window_problem(shapes, window_s) if shapes else None
    if problem:
        raise UsageError(f"--hef {hef}: {problem}")
    return shapes


def synthetic_voice(n_samples: int, sample_rate: int) -> np.ndarray:
    """A deterministic voiced signal (a gliding pitch, its harmonics, syllable-like bursts):
    enough to make the encoder's features depend on its weights; no audio file needed."""
    t = np.arange(n_samples) / sample_rate
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t) + 20 * np.sin(2 * np.pi * 2.3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 30))
    bursts = np.clip(np.sin(2 * np.pi * 1.9 * t), 0, None) ** 0.5 * (0.5 + 0.5 * np.sin(2 * np.pi * 0.25 * t))
    noise = 0.01 * np.random.default_rng(0).standard_normal(n_samples)
    x = voice * bursts + noise
    return (0.3 * x / np.abs(x).max()).astype(np.float32)


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two feature maps, each channel centred first (so a constant
    offset shared by every position, e.g. LayerNorm's bias, does not count as agreement)."""
    x, y = (np.asarray(f, np.float64).reshape(-1, f.shape[-1]) for f in (a, b))
    x, y = x - x.mean(0), y - y.mean(0)
    return float((x * y).sum() / (np.linalg.norm(x) * np.linalg.norm(y) + 1e-12))


def reference_check(hef: Path, bundle: Bundle) -> float:
    """Run one window through the HEF on the device and through the bundle's ONNX encoder (fp32
    when the bundle has it, else int8: it agrees with fp32 at 0.99 on this measure)."""
    from edgeasr.asr.encoder import OnnxEncoder
    from edgeasr.asr.features import MelSpec, log_mel
    from edgeasr.asr.hailo import HailoEncoder

    a = bundle.audio
    spec = MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, a.n_frames)
    mel = log_mel(synthetic_voice(spec.n_samples, a.sample_rate), spec)
    cpu = OnnxEncoder(bundle, "fp32" if bundle.has("encoder") else "int8", threads=1).encode(mel)
    with HailoEncoder(hef, bundle) as npu:  # DeviceError when it is busy (the daemon runs)
        return similarity(npu.encode(mel), cpu)


def _on_device(hef: Path, bundle: Bundle) -> str:
    """The reference check when a device is here; what it found, or why it did not run."""
    from edgeasr.asr.hailo import hailo_available

    if not hailo_available():
        return "features not compared (no Hailo device here)"
    try:
        agreement = reference_check(hef, bundle)
    except DeviceError as exc:
        return f"features not compared ({exc})"
    if agreement < MIN_SIMILARITY:
        raise ModelError(
            f"--hef {hef}: its features do not match the bundle's encoder (similarity {agreement:.2f}, "
            f"at least {MIN_SIMILARITY} expected): the HEF was compiled from other weights (Hailo's "
            "Hailo-8 tiny HEF is multilingual tiny: import openai/whisper-tiny, not tiny.en)")
    return f"on the device its features match the ONNX encoder's (similarity {agreement:.3f})"


def attach_hef(bundle_dir: Path, hef: Path) -> AttachedHef:
    """Check `hef` against the bundle as far as this machine can, copy it in and record it."""
    bundle = load_bundle(Path(bundle_dir))
    hef, arch = Path(hef), guess_arch(hef)
    shapes = read_shapes(hef)
    if shapes is None:
        checked = "not checked here (no HailoRT): the daemon checks its shapes when it opens it"
    else:
        problems = shape_problems(shapes, bundle)
        if problems:
            raise ModelError(f"--hef {hef} does not fit the bundle {bundle.root}: {'; '.join(problems)}")
        checked = f"shapes fit (input {shapes.input}, output {shapes.output})"
        checked += "; " + _on_device(hef, bundle)
    dest = bundle.root / f"encoder.{arch}.hef"
    try:
        if hef.resolve() != dest.resolve():
            shutil.copyfile(hef, dest)
    except OSError as exc:
        raise OutputError(f"{dest}: cannot copy the HEF ({exc.strerror or exc})") from exc
    vstreams = shapes.vstreams if shapes is not None else None
    record_hef(bundle.root, dest, arch, vstreams, {"source": {"file": hef.name, "kind": "published"}})
    log.info("encoder HEF %s -> %s (%s): %s", hef, dest, arch, checked)
    return AttachedHef(dest, arch, checked)


def record_hef(
    bundle_dir: Path, hef: Path, arch: str, vstreams: dict | None = None, info: dict | None = None
) -> dict:
    """Enter a HEF inside the bundle into manifest.json (files.encoder_hef + `hailo`)."""
    root = Path(bundle_dir).resolve()
    hef = Path(hef).resolve()
    if root not in hef.parents:
        log.warning("%s is outside the bundle %s: not recorded in its manifest (set encoder.hef)", hef, root)
        return json.loads((root / MANIFEST).read_text())
    manifest_path = root / MANIFEST
    m = json.loads(manifest_path.read_text())
    m["files"]["encoder_hef"] = {**file_entry(root, hef.relative_to(root).as_posix()), "arch": arch}
    m["hailo"] = {"arch": arch, **(info or {})}
    if vstreams:
        m["hailo"]["vstreams"] = vstreams
    tmp = manifest_path.with_name(f".{MANIFEST}.part")
    try:
        tmp.write_text(json.dumps(m, indent=2) + "\n")
        os.replace(tmp, manifest_path)
    except OSError as exc:
        raise OutputError(f"{manifest_path}: cannot update ({exc.strerror or exc})") from exc
    return m
