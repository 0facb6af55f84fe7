"""The Whisper encoder on a Hailo-8/8L NPU through HailoRT's Python API (`hailo_platform`).

The only module that imports hailo_platform, lazily. API as in hailo-ai/hailort, branch
`hailo8`, tags v4.18.0-v4.23.0 (hailort/libhailort/bindings/python/platform/hailo_platform/
pyhailort/pyhailort.py); the InferModel calls are those of Hailo's own Whisper app
(Hailo-Application-Code-Examples: runtime/python/speech_recognition/app/hailo_whisper_pipeline.py).

- HailoRT >= 4.18: VDevice(params) -> create_infer_model(hef) -> FLOAT32 input/output (HailoRT
  quantizes/dequantizes on the host with the HEF's quant info) -> configure() ->
  create_bindings(output_buffers=...) -> run([bindings], timeout_ms). The timeout is ours and
  finite: Hailo's app waits 1e8 ms, which would starve the systemd watchdog on a hung chip.
- Older 4.x (no VDevice.create_infer_model, e.g. 4.17): configure(hef) + InferVStreams.
- With the scheduler (ROUND_ROBIN, needed to share the chip) nothing is activated; with
  scheduling NONE the configured model is activated once and stays active.

HailoRT failures become one-line DeviceError/ModelError messages (edgeasr.asr.hailo_errors),
where the context (HEF, device, config key) is known.
"""

from __future__ import annotations

import logging
import math
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from edgeasr.asr.hailo_errors import (
    CONFIGURING,
    WRONG_CHIP,
    Context,
    NpuTimeoutError,
    status_name,
    tag,
    translate,
)
from edgeasr.bundle import Bundle
from edgeasr.config import HAILO_SCHEDULERS, EncoderConfig
from edgeasr.errors import (
    ConfigError,
    DeviceError,
    EdgeAsrError,
    MissingInputError,
    ModelError,
    ToolMissingError,
)

__all__ = ["HailoEncoder", "NpuTimeoutError", "check_vstreams", "hailo_available", "hef_vstreams",
           "status_name"]

log = logging.getLogger(__name__)

DEV_GLOB = "hailo[0-9]*"  # /dev/hailo0, ... created by the hailo PCIe driver


def _sdk():
    """hailo_platform, or a ToolMissingError saying what to install."""
    try:
        import hailo_platform
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "hailo_platform":
            raise ToolMissingError(f"hailo_platform cannot be loaded: {exc}") from exc
        raise ToolMissingError(
            "the hailo backend needs HailoRT's Python package hailo_platform (pyhailort 4.18+, "
            "from the Hailo Developer Zone or Raspberry Pi OS's python3-hailort, matching the "
            "installed HailoRT and hailo PCIe driver); or set encoder.backend: onnx"
        ) from exc
    except ImportError as exc:
        # e.g. "_pyhailort version (4.20.0) does not match pyhailort version (4.23.0)"
        raise ToolMissingError(
            f"hailo_platform is installed but cannot be loaded ({exc}): reinstall the pyhailort "
            "wheel that matches the installed HailoRT"
        ) from exc
    return hailo_platform


def hailo_available(dev_dir: Path = Path("/dev")) -> bool:
    """True when hailo_platform is importable and a Hailo device is present (for backend: auto)."""
    from importlib.util import find_spec

    try:
        if find_spec("hailo_platform") is None:
            return False
    except (ImportError, ValueError):
        return False
    if any(Path(dev_dir).glob(DEV_GLOB)):
        return True
    try:  # no device node: ask HailoRT (covers non-PCIe devices)
        return bool(_sdk().Device.scan())
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable", logged
        log.debug("Hailo device scan failed: %s", exc)
        return False


@dataclass(frozen=True)
class _Expected:
    """What the bundle says the HEF must look like."""

    input_hwc: tuple[int, int, int]  # HailoRT shapes carry no batch: (1, n_frames, n_mels)
    positions: int
    d_model: int
    input_name: str | None  # vstream names, when the manifest records the HEF's
    output_name: str | None
    arch: str | None  # the chip the HEF was compiled for, when the manifest records it


def _expected(bundle: Bundle, hef: Path) -> _Expected:
    mel = bundle.manifest.get("tensors", {}).get("encoder", {}).get("inputs", {}).get("mel")
    n_frames, n_mels = (mel[2], mel[3]) if mel else (bundle.audio.n_frames, bundle.audio.n_mels)
    names, arch = None, None
    entry = bundle.manifest.get("files", {}).get("encoder_hef")
    if entry and (bundle.root / entry["path"]).resolve() == hef.resolve():
        arch = entry.get("arch")
        names = bundle.manifest.get("hailo", {}).get("vstreams")
    return _Expected(
        input_hwc=(1, int(n_frames), int(n_mels)),
        positions=bundle.audio.n_positions,
        d_model=bundle.d_model,
        input_name=(names or {}).get("input"),
        output_name=(names or {}).get("output"),
        arch=arch,
    )


def check_vstreams(hef, path: Path, want: _Expected) -> tuple[str, str]:
    """Names of the HEF's input and output vstreams, checked against the bundle."""
    ins, outs = hef.get_input_vstream_infos(), hef.get_output_vstream_infos()
    if len(ins) != 1 or len(outs) != 1:
        raise ModelError(
            f"{path}: the encoder HEF must have one input and one output, it has inputs "
            f"{[i.name for i in ins]} and outputs {[o.name for o in outs]}"
        )
    i, o = ins[0], outs[0]
    if tuple(i.shape) != want.input_hwc:
        raise ModelError(
            f"{path}: HEF input {i.name} is {tuple(i.shape)} (H, W, C) but the bundle's encoder takes "
            f"mel [1, {', '.join(map(str, want.input_hwc))}], i.e. {want.input_hwc}: the HEF was "
            "compiled for another window or model"
        )
    out_shape = tuple(o.shape)
    if math.prod(out_shape) != want.positions * want.d_model or out_shape[-1] != want.d_model:
        raise ModelError(
            f"{path}: HEF output {o.name} is {out_shape} but the bundle's decoder needs "
            f"{want.positions} x {want.d_model} audio features"
        )
    for role, have, expect in (("input", i.name, want.input_name), ("output", o.name, want.output_name)):
        if expect is not None and have != expect:
            raise ModelError(
                f"{path}: HEF {role} vstream is {have!r}, manifest.json hailo.vstreams.{role} says "
                f"{expect!r} (the HEF was replaced: re-run `edgeasr models compile-hef`)"
            )
    return i.name, o.name


def hef_vstreams(path: Path) -> dict:
    """{'input': name, 'output': name, shapes} of a compiled HEF (for the bundle manifest)."""
    hp = _sdk()
    try:
        hef = hp.HEF(str(path))
        i, o = hef.get_input_vstream_infos()[0], hef.get_output_vstream_infos()[0]
    except hp.HailoRTException as exc:
        raise ModelError(f"{path}: HailoRT cannot read this HEF ({status_name(exc) or exc})") from exc
    return {"input": i.name, "output": o.name, "input_shape": list(i.shape), "output_shape": list(o.shape)}


class HailoEncoder:
    """NHWC log-mel [1, 1, n_frames, n_mels] -> audio features [1, n_positions, d_model] on the NPU.

    Opens the device and configures the HEF once (slow); encode() is then one inference.
    Not for concurrent use from several threads (a lock serialises calls).
    """

    backend = "hailo"

    def __init__(
        self,
        hef_path: Path,
        bundle: Bundle,
        timeout_ms: int = EncoderConfig.timeout_ms,
        scheduler: str = EncoderConfig.scheduler,
        service_group: str | None = None,
    ) -> None:
        if scheduler not in HAILO_SCHEDULERS:
            raise ConfigError(f"encoder.scheduler: {scheduler!r} is not one of {', '.join(HAILO_SCHEDULERS)}")
        if int(timeout_ms) < 1:
            raise ConfigError(f"encoder.timeout_ms: must be at least 1, got {timeout_ms}")
        if service_group and scheduler == "none":
            raise ConfigError(
                "encoder.service_group needs encoder.scheduler: round_robin "
                "(hailort.service shares the chip through its scheduler)"
            )
        self.hef_path = Path(hef_path)
        if not self.hef_path.is_file():
            raise MissingInputError(f"encoder.hef: {self.hef_path} does not exist")
        self.timeout_ms = int(timeout_ms)
        self.scheduler = scheduler
        self.service_group = service_group
        self._want = _expected(bundle, self.hef_path)
        self._hp = _sdk()
        self._lock = threading.Lock()
        self._stack = ExitStack()  # what _open() entered: released by close()
        self._closed = False
        self._closed_why = ""
        try:
            self._open()
        except BaseException:
            self._stack.close()
            raise
        log.info(
            "Hailo encoder ready: %s (HailoRT %s, %s, scheduler %s%s)",
            self.hef_path,
            getattr(self._hp, "__version__", "?"),
            self.api,
            scheduler,
            f", group {service_group}" if service_group else "",
        )

    # -- set-up ---------------------------------------------------------------------------
    def _open(self) -> None:
        hp = self._hp
        with self._errors("reading the HEF"):
            hef = hp.HEF(str(self.hef_path))
            self._in_name, self._out_name = check_vstreams(hef, self.hef_path, self._want)
        with self._errors("looking for a Hailo device"):
            if not hp.Device.scan():
                raise DeviceError(
                    "no Hailo device found (HailoRT's Device.scan() lists none): is the hailo PCIe "
                    "driver loaded (ls /dev/hailo*)? Or set encoder.backend: onnx"
                )
        with self._errors("opening the Hailo device"):
            vdevice = self._stack.enter_context(hp.VDevice(self._vdevice_params()))
        with self._errors(CONFIGURING):
            if hasattr(vdevice, "create_infer_model"):
                self._infer = self._open_infer_model(vdevice)
                self.api = "InferModel"
            else:
                self._infer = self._open_vstreams(vdevice, hef)
                self.api = "InferVStreams"

    def _vdevice_params(self):
        hp = self._hp
        params = hp.VDevice.create_params()  # its default is scheduling NONE
        algo = "ROUND_ROBIN" if self.scheduler == "round_robin" else "NONE"
        params.scheduling_algorithm = getattr(hp.HailoSchedulingAlgorithm, algo)
        if self.service_group:
            params.multi_process_service = True  # through hailort.service
            params.group_id = self.service_group
        return params

    def _open_infer_model(self, vdevice):
        """HailoRT >= 4.18. The optional 2nd argument (network_name in 4.18/4.19, name from
        4.20) is left out: this HEF holds one network group."""
        hp = self._hp
        model = vdevice.create_infer_model(str(self.hef_path))
        model.set_batch_size(1)
        model.input().set_format_type(hp.FormatType.FLOAT32)
        model.output().set_format_type(hp.FormatType.FLOAT32)
        configured = self._stack.enter_context(model.configure())
        if self.scheduler == "none":
            configured.activate()  # "invalid in case scheduler is enabled" (ConfiguredInferModel)
            self._stack.callback(configured.deactivate)
        in_buf = np.zeros(tuple(model.input().shape), dtype=np.float32)
        out_buf = np.zeros(tuple(model.output().shape), dtype=np.float32)
        bindings = configured.create_bindings(output_buffers={model.output().name: out_buf})
        bindings.input().set_buffer(in_buf)  # HailoRT keeps a view: refill in place per call

        def infer(mel: np.ndarray) -> np.ndarray:
            np.copyto(in_buf, mel.reshape(in_buf.shape))
            configured.run([bindings], self.timeout_ms)
            return bindings.output().get_buffer()

        return infer

    def _open_vstreams(self, vdevice, hef):
        """HailoRT 4.x before InferModel (HRT_0/HRT_2 inference tutorials)."""
        hp = self._hp
        params = hp.ConfigureParams.create_from_hef(hef=hef, interface=hp.HailoStreamInterface.PCIe)
        group = vdevice.configure(hef, params)[0]
        in_params = hp.InputVStreamParams.make(
            group, format_type=hp.FormatType.FLOAT32, timeout_ms=self.timeout_ms
        )
        out_params = hp.OutputVStreamParams.make(
            group, format_type=hp.FormatType.FLOAT32, timeout_ms=self.timeout_ms
        )
        pipeline = self._stack.enter_context(hp.InferVStreams(group, in_params, out_params))
        if self.scheduler == "none":
            self._stack.enter_context(group.activate(group.create_params()))
        batch_shape = (1, *self._want.input_hwc)

        def infer(mel: np.ndarray) -> np.ndarray:
            data = np.ascontiguousarray(mel, dtype=np.float32).reshape(batch_shape)
            return pipeline.infer({self._in_name: data})[self._out_name]  # [1, H, W, C]

        return infer

    # -- inference ------------------------------------------------------------------------
    def encode(self, mel: np.ndarray) -> np.ndarray:
        want = (1, 1, *self._want.input_hwc[1:])
        if mel.shape != want:
            raise ValueError(f"expected a log-mel of shape {want}, got {mel.shape}")
        with self._lock:
            if self._closed:
                raise DeviceError(f"the Hailo encoder is closed{self._closed_why}")
            try:
                with self._errors("running the encoder"):
                    out = self._infer(np.ascontiguousarray(mel, dtype=np.float32))
            except NpuTimeoutError:
                # The late job may still write into our buffers: let go of the chip; the
                # supervisor (edgeasr.asr.supervision) opens a new HailoEncoder.
                self._closed_why = " (after a HailoRT timeout)"
                self._close_locked()
                raise
            # HailoRT hands back the vstream layout: (1, T, d), or (1, 1, T, d) via vstreams.
            return np.array(out, dtype=np.float32).reshape(1, self._want.positions, self._want.d_model)

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if not self._closed:
            self._closed = True
            self._stack.close()

    def __enter__(self) -> HailoEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- errors ---------------------------------------------------------------------------
    def _errors(self, stage: str):
        return _Translate(self, stage)

    def translate(self, exc: Exception, stage: str) -> EdgeAsrError:
        """A one-line error for a HailoRT failure during `stage`."""
        if status_name(exc) in WRONG_CHIP and stage == CONFIGURING:
            return DeviceError(self._wrong_chip_message(tag(exc)))
        version = getattr(self._hp, "__version__", "?")
        return translate(exc, stage, Context(self.hef_path, version, self.timeout_ms, self.service_group))

    def _wrong_chip_message(self, tag: str) -> str:
        self._stack.close()  # let go of the device before asking it what it is
        device = _device_arch(self._hp)
        built = self._want.arch or "another Hailo chip"
        return (
            f"{self.hef_path}: HEF was compiled for {built} but the device is "
            f"{device or 'a different chip'}{tag}; compile it with `edgeasr models compile-hef "
            f"BUNDLE --arch {device or 'hailo8|hailo8l'}`"
        )


class _Translate:
    """Context manager: HailoRT exceptions -> the encoder's one-line errors."""

    def __init__(self, encoder: HailoEncoder, stage: str) -> None:
        self.encoder, self.stage = encoder, stage

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        if exc is None or isinstance(exc, EdgeAsrError) or not isinstance(exc, Exception):
            return False
        if not isinstance(exc, self.encoder._hp.HailoRTException) and status_name(exc) is None:
            return False  # a bug, not a HailoRT failure: let it surface
        raise self.encoder.translate(exc, self.stage) from exc


def _device_arch(hp) -> str | None:
    """'hailo8' / 'hailo8l' of the first device, or None when it cannot be asked."""
    try:
        device = hp.Device(hp.Device.scan()[0])
        try:
            return device.control.identify().device_architecture.name.lower()
        finally:
            device.release()
    except Exception as exc:  # noqa: BLE001 - only improves an error message
        log.debug("cannot identify the Hailo device: %s", exc)
        return None
