"""Stand-in for HailoRT's C extension `_pyhailort` (pybind11 module of libhailort).

Follows hailo-ai/hailort, branch `hailo8`, tag v4.23.0 (hailort/libhailort/bindings/python/src/*.cpp
and hailort/libhailort/include/hailo/hailort.h for status numbers and enum values). Failures
are raised as `HailoRTStatusException(str(status))`, as libhailort's bindings do; the Python
layer (pyhailort.py) turns them into the HailoRT exception classes.

The "chip" is onnxruntime running the ONNX file a stand-in HEF points to. What the simulated
system looks like is read from the environment at each call, so a test can change it:

  HAILO_STANDIN_DEVICES     comma-separated chips, e.g. "hailo8" (default), "hailo8l",
                            "hailo8,hailo8"; "" = no device (Device.scan() is empty)
  HAILO_STANDIN_LOCK_DIR    where device ownership is recorded with flock(2), as the hailo
                            driver marks a device used by one process (default: a dir in $TMPDIR)
  HAILO_STANDIN_SERVICE     "running" when hailort.service is up (needed for multi_process_service)
  HAILO_STANDIN_LATENCY_MS  time one frame takes on the "chip" (default 0)
  HAILO_STANDIN_DRIVER_VERSION  the hailo PCIe driver's version (default: the library's)
  HAILO_STANDIN_VERSION     HailoRT version to emulate: "4.23.0" (default), "4.20.0" (wrong-chip
                            HEFs fail with HAILO_INVALID_HEF), "4.17.0" (no InferModel API)
  HAILO_STANDIN_LIB_VERSION version of this "C extension" (default = HAILO_STANDIN_VERSION); a
                            different value makes `import hailo_platform` fail as a mismatched
                            pyhailort wheel does
  HAILO_STANDIN_CONTROL     a JSON file re-read at every scan, open and inference: faults injected
                            while running (latency, a lost device); see standin_control.py
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import threading
import time
from datetime import timedelta
from enum import IntEnum
from pathlib import Path

import numpy as np
import standin_control

HEF_MAGIC = b"HAILO-STANDIN-HEF\n"  # never a real HEF (real ones start with "\x01HEF")
HEF_FORMAT = 1


def standin_version() -> str:
    return os.environ.get("HAILO_STANDIN_VERSION", "4.23.0")


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:3])


__version__ = os.environ.get("HAILO_STANDIN_LIB_VERSION", standin_version())

# hailort.h HAILO_STATUS__X list (v4.23.0), the statuses the stand-in can produce or a caller may see.
_STATUS = {
    0: "HAILO_SUCCESS",
    1: "HAILO_UNINITIALIZED",
    2: "HAILO_INVALID_ARGUMENT",
    3: "HAILO_OUT_OF_HOST_MEMORY",
    4: "HAILO_TIMEOUT",
    6: "HAILO_INVALID_OPERATION",
    8: "HAILO_INTERNAL_FAILURE",
    13: "HAILO_OPEN_FILE_FAILURE",
    26: "HAILO_INVALID_HEF",
    36: "HAILO_DRIVER_OPERATION_FAILED",
    61: "HAILO_NOT_FOUND",
    62: "HAILO_COMMUNICATION_CLOSED",
    63: "HAILO_STREAM_ABORT",
    64: "HAILO_DRIVER_NOT_INSTALLED",
    69: "HAILO_NETWORK_GROUP_NOT_ACTIVATED",
    73: "HAILO_DEVICE_IN_USE",
    74: "HAILO_OUT_OF_PHYSICAL_DEVICES",
    75: "HAILO_INVALID_DEVICE_ARCHITECTURE",
    76: "HAILO_INVALID_DRIVER_VERSION",
    77: "HAILO_RPC_FAILED",
    78: "HAILO_INVALID_SERVICE_VERSION",
    79: "HAILO_NOT_SUPPORTED",
    85: "HAILO_DRIVER_INVALID_RESPONSE",
    86: "HAILO_DRIVER_INVALID_IOCTL",
    89: "HAILO_CONNECTION_REFUSED",
    91: "HAILO_HEF_FILE_CORRUPTED",
    92: "HAILO_HEF_NOT_SUPPORTED",
    93: "HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE",
}
_CODE = {name: code for code, name in _STATUS.items()}


class HailoRTStatusException(Exception):
    """pybind11-registered exception; args[0] is the status number as a string."""


class HailoRTCustomException(Exception):
    pass


def get_status_message(status_code: int) -> str:
    return _STATUS.get(int(status_code), "")


def _fail(name: str) -> None:
    raise HailoRTStatusException(str(_CODE[name]))


# -- enums (pybind11 py::enum_ in pyhailort.cpp; values from hailort.h) --------------------------
class FormatType(IntEnum):
    AUTO = 0
    UINT8 = 1
    UINT16 = 2
    FLOAT32 = 3


class FormatOrder(IntEnum):
    AUTO = 0
    NHWC = 1
    NHCW = 2
    FCR = 3
    F8CR = 4
    NHW = 5
    NC = 6


class SchedulingAlgorithm(IntEnum):
    NONE = 0
    ROUND_ROBIN = 1


class StreamInterface(IntEnum):
    PCIe = 0
    ETH = 1
    MIPI = 2
    INTEGRATED = 3


class StreamDirection(IntEnum):
    H2D = 0
    D2H = 1


_ARCH_CODE = {"hailo8": 1, "hailo8l": 2}  # DeviceArchitectureTypes (pyhailort.py)

_ITEM_BYTES = {FormatType.UINT8: 1, FormatType.UINT16: 2, FormatType.FLOAT32: 4}


class Format:
    def __init__(self, type: FormatType, order: FormatOrder) -> None:  # noqa: A002 - HailoRT's name
        self.type, self.order, self.flags = type, order, 0


def get_format_data_bytes(fmt: Format) -> int:
    return _ITEM_BYTES.get(fmt.type, 1)


class QuantInfo:
    def __init__(self) -> None:
        self.qp_zp, self.qp_scale, self.limvals_min, self.limvals_max = 0.0, 1.0, 0.0, 0.0


class VStreamInfo:
    """hailo_vstream_info_t: `shape` carries no batch; NHWC frames are (H, W, C)."""

    def __init__(self, name: str, network_name: str, direction: StreamDirection, shape: list[int]) -> None:
        self.name, self.network_name, self.direction = name, network_name, direction
        self._shape = tuple(int(d) for d in shape)
        order = (
            FormatOrder.NC
            if len(self._shape) == 1
            else FormatOrder.NHW
            if len(self._shape) == 2
            else FormatOrder.NHWC
        )
        # A compiled HEF's native vstream format is quantized (UINT8 here).
        self.format = Format(FormatType.UINT8, order)
        self.quant_info = QuantInfo()

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def __repr__(self) -> str:
        return f'VStreamInfo("{self.name}")'


# -- the simulated system ---------------------------------------------------------------------
def _devices() -> list[tuple[str, str]]:
    """[(device_id, arch)] as Device.scan() would see them (PCIe BDF ids); none while the
    control file says the device is lost (the driver deleted its nodes)."""
    if standin_control.device_lost():
        return []
    spec = os.environ.get("HAILO_STANDIN_DEVICES", "hailo8")
    arches = [a.strip().lower() for a in spec.split(",") if a.strip()]
    for a in arches:
        if a not in _ARCH_CODE:
            raise ValueError(f"HAILO_STANDIN_DEVICES: unknown chip {a!r}")
    return [(f"0000:0{i + 1}:00.0", a) for i, a in enumerate(arches)]


def _lock_dir() -> Path:
    d = Path(
        os.environ.get("HAILO_STANDIN_LOCK_DIR")
        or Path(tempfile.gettempdir()) / f"hailo-standin-{os.getuid()}"
    )
    d.mkdir(parents=True, exist_ok=True)
    return d


def _latency_s() -> float:
    """This frame's time on the chip: the control file's, else HAILO_STANDIN_LATENCY_MS."""
    return standin_control.take_latency_ms(float(os.environ.get("HAILO_STANDIN_LATENCY_MS", "0"))) / 1000.0


def _wrong_chip_status() -> str:
    # HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE appeared in 4.21 (device_internal.cpp check_hef_is_compatible).
    return (
        "HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE"
        if version_tuple(standin_version()) >= (4, 21)
        else "HAILO_INVALID_HEF"
    )


def _hef_fits(device_arch: str, hef_arch: str) -> bool:
    # DeviceBase::is_hef_compatible: a Hailo-8 runs hailo8 and hailo8l HEFs, a Hailo-8L only hailo8l.
    return hef_arch == "hailo8l" or device_arch == hef_arch


# -- HEF -----------------------------------------------------------------------------------------
class Hef:
    """A stand-in HEF: HEF_MAGIC + JSON {format, arch, network_group, onnx, inputs, outputs}.

    `onnx` is relative to the HEF's directory; each vstream is {name, shape (H, W, C), onnx_name}.
    """

    def __init__(self, meta: dict, base: Path) -> None:
        self.meta, self.base = meta, base
        self.arch = meta["arch"]
        self.network_group = meta["network_group"]
        self.onnx = (base / meta["onnx"]).resolve()
        self._in = [
            VStreamInfo(
                v["name"], f"{self.network_group}/{self.network_group}", StreamDirection.H2D, v["shape"]
            )
            for v in meta["inputs"]
        ]
        self._out = [
            VStreamInfo(
                v["name"], f"{self.network_group}/{self.network_group}", StreamDirection.D2H, v["shape"]
            )
            for v in meta["outputs"]
        ]
        self.onnx_names = {v["name"]: v["onnx_name"] for v in meta["inputs"] + meta["outputs"]}

    @staticmethod
    def create_from_file(path: str) -> Hef:
        try:
            data = Path(path).read_bytes()
        except OSError:
            _fail("HAILO_OPEN_FILE_FAILURE")
        return Hef._parse(data, Path(path).resolve().parent)

    @staticmethod
    def create_from_buffer(data: bytes) -> Hef:
        return Hef._parse(data, Path.cwd())

    @staticmethod
    def _parse(data: bytes, base: Path) -> Hef:
        if not data.startswith(HEF_MAGIC):
            _fail("HAILO_HEF_NOT_SUPPORTED")  # hef.cpp: bad header magic
        try:
            meta = json.loads(data[len(HEF_MAGIC) :])
            if meta.get("format") != HEF_FORMAT:
                _fail("HAILO_HEF_NOT_SUPPORTED")
            hef = Hef(meta, base)
        except (ValueError, KeyError, TypeError):
            _fail("HAILO_HEF_FILE_CORRUPTED")
        if not hef.onnx.is_file():
            _fail("HAILO_HEF_FILE_CORRUPTED")
        return hef

    def get_network_group_names(self) -> list[str]:
        return [self.network_group]

    def get_networks_names(self, name: str) -> list[str]:
        self._check_name(name)
        return [f"{self.network_group}/{self.network_group}"]

    def _check_name(self, name: str) -> None:
        if name and name not in (self.network_group, f"{self.network_group}/{self.network_group}"):
            _fail("HAILO_NOT_FOUND")

    def get_input_vstream_infos(self, name: str) -> list[VStreamInfo]:
        self._check_name(name)
        return list(self._in)

    def get_output_vstream_infos(self, name: str) -> list[VStreamInfo]:
        self._check_name(name)
        return list(self._out)

    def get_all_vstream_infos(self, name: str) -> list[VStreamInfo]:
        return self.get_input_vstream_infos(name) + self.get_output_vstream_infos(name)

    def get_sorted_output_names(self, network_group_name: str) -> list[str]:
        self._check_name(network_group_name)
        return [v.name for v in self._out]

    def create_configure_params(self, interface: StreamInterface) -> dict:
        return {self.network_group: ConfigureParams(interface)}


class ConfigureParams:
    def __init__(self, interface: StreamInterface) -> None:
        self.batch_size, self.power_mode, self.stream_interface = 0, 0, interface


# -- the "chip": onnxruntime on the HEF's ONNX ------------------------------------------------------
_SESSIONS: dict[Path, object] = {}
_SESSIONS_LOCK = threading.Lock()


def _session(onnx: Path):
    import onnxruntime as ort

    with _SESSIONS_LOCK:
        if onnx not in _SESSIONS:
            opts = ort.SessionOptions()
            opts.log_severity_level = 3
            _SESSIONS[onnx] = ort.InferenceSession(str(onnx), opts, providers=["CPUExecutionProvider"])
        return _SESSIONS[onnx]


def _run_frame(hef: Hef, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One frame through the network: vstream-shaped arrays in, vstream-shaped arrays out."""
    sess = _session(hef.onnx)
    feeds = {}
    for inp in sess.get_inputs():
        vname = next(n for n, o in hef.onnx_names.items() if o == inp.name)
        feeds[inp.name] = np.ascontiguousarray(inputs[vname], dtype=np.float32).reshape(inp.shape)
    wanted = [v.name for v in hef._out]
    results = sess.run([hef.onnx_names[n] for n in wanted], feeds)
    return {n: r.reshape(v.shape) for n, r, v in zip(wanted, results, hef._out, strict=True)}


def _simulate_latency(timeout_s: float | None) -> None:
    latency = _latency_s()
    if timeout_s is not None and latency > timeout_s:
        time.sleep(timeout_s)
        _fail("HAILO_TIMEOUT")
    time.sleep(latency)


# -- devices ---------------------------------------------------------------------------------------
class Device:
    def __init__(self, device_id: str, arch: str) -> None:
        self.device_id, self.arch, self._valid = device_id, arch, True

    @staticmethod
    def scan() -> list[str]:
        return [i for i, _ in _devices()]

    @staticmethod
    def create(device_id: str) -> Device:
        for i, arch in _devices():
            if i == device_id:
                return Device(i, arch)
        _fail("HAILO_NOT_FOUND")

    def is_valid(self) -> bool:
        return self._valid

    def identify(self) -> _Identity:
        return _Identity(self.arch)

    def release(self) -> None:
        self._valid = False


class _FwVersion:
    major, minor, revision = 4, 23, 0


class _Identity:
    """hailo_device_identity_t"""

    def __init__(self, arch: str) -> None:
        self.protocol_version = 2
        self.fw_version = _FwVersion()
        self.logger_version = 0
        self.board_name = "Hailo-8" if arch == "hailo8" else "Hailo-8L"
        self.is_release = True
        self.extended_context_switch_buffer = False
        self.device_architecture = _ARCH_CODE[arch]
        self.serial_number = "STANDIN"
        self.part_number = "STANDIN"
        self.product_name = f"{self.board_name} stand-in"


class VDeviceParams:
    """hailo_vdevice_params_t wrapper; setters check types as pybind11 does."""

    _TYPES = {
        "scheduling_algorithm": SchedulingAlgorithm,
        "group_id": str,
        "multi_process_service": bool,
        "device_count": int,
        "device_ids": list,
    }

    def __init__(self) -> None:
        object.__setattr__(self, "device_count", 1)
        object.__setattr__(self, "device_ids", [])
        object.__setattr__(self, "scheduling_algorithm", SchedulingAlgorithm.NONE)
        object.__setattr__(self, "group_id", "UNIQUE")  # HAILO_UNIQUE_VDEVICE_GROUP_ID
        object.__setattr__(self, "multi_process_service", False)

    @staticmethod
    def default() -> VDeviceParams:
        return VDeviceParams()  # VDeviceParams.default(): scheduling NONE

    def __setattr__(self, name: str, value) -> None:
        kind = self._TYPES.get(name)
        if kind is None:
            raise AttributeError(f"'VDeviceParams' object has no attribute '{name}'")
        if not isinstance(value, kind):
            raise TypeError(f"VDeviceParams.{name}: incompatible type {type(value).__name__}")
        object.__setattr__(self, name, value)


class VDevice:
    def __init__(self, params: VDeviceParams, owned: list[tuple[str, str, object]]) -> None:
        self.params, self._owned = params, owned  # [(id, arch, lock file)]
        self._dead = False  # saw its device leave the bus

    @staticmethod
    def create(params: VDeviceParams, device_ids: list[str]) -> VDevice:
        driver = os.environ.get("HAILO_STANDIN_DRIVER_VERSION")
        if driver and driver != __version__:
            _fail("HAILO_INVALID_DRIVER_VERSION")  # hailort_driver.cpp validate_driver_version
        if params.multi_process_service:
            if os.environ.get("HAILO_STANDIN_SERVICE") != "running":
                _fail("HAILO_RPC_FAILED")  # no hailort.service to talk to
            if params.scheduling_algorithm == SchedulingAlgorithm.NONE:
                _fail("HAILO_INVALID_OPERATION")
        wanted = device_ids or [i for i, _ in _devices()]
        owned = []
        for dev_id, arch in _devices():
            if dev_id not in wanted or len(owned) == params.device_count:
                continue
            lock = _claim(dev_id, params)
            if lock is None:
                continue  # in use by another process: vdevice.cpp skips it (HAILO_DEVICE_IN_USE)
            owned.append((dev_id, arch, lock))
        if len(owned) != params.device_count:
            for _, _, lock in owned:
                lock.close()
            _fail("HAILO_OUT_OF_PHYSICAL_DEVICES")
        return VDevice(params, owned)

    @property
    def arch(self) -> str:
        return self._owned[0][1]

    def release(self) -> None:
        for _, _, lock in self._owned:
            lock.close()
        self._owned = []

    def get_physical_devices_ids(self) -> list[str]:
        return [i for i, _, _ in self._owned]

    def is_scheduled(self) -> bool:
        return self.params.scheduling_algorithm != SchedulingAlgorithm.NONE

    def check_alive(self) -> None:
        """Every ioctl fails (ENODEV) once the device left the bus, even after it is back."""
        if standin_control.device_lost():
            self._dead = True
        if self._dead:
            _fail("HAILO_DRIVER_OPERATION_FAILED")

    def check_hef(self, hef: Hef) -> None:
        self.check_alive()
        if not self._owned:
            _fail("HAILO_INVALID_OPERATION")
        if not _hef_fits(self.arch, hef.arch):
            _fail(_wrong_chip_status())

    def configure(self, hef: Hef, configure_params_by_name: dict) -> list[ConfiguredNetworkGroup]:
        self.check_hef(hef)
        _session(hef.onnx)  # loading the network is configure's cost, not the first frame's
        return [ConfiguredNetworkGroup(self, hef)]

    def create_infer_model_from_file(self, path: str, name: str) -> InferModel:
        return InferModel(self, Hef.create_from_file(path), name)

    def create_infer_model_from_buffer(self, data: bytes, name: str) -> InferModel:
        return InferModel(self, Hef.create_from_buffer(data), name)


def _claim(dev_id: str, params: VDeviceParams):
    """Mark a device used, as the driver does for one process; hailort.service clients share it."""
    f = open(_lock_dir() / f"{dev_id}.lock", "a+")  # noqa: SIM115 - held for the VDevice's life
    try:
        fcntl.flock(f, (fcntl.LOCK_SH if params.multi_process_service else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    return f


# -- configured network group + vstreams (pre-InferModel API) --------------------------------------
class ActivateNetworkGroupParams:
    @staticmethod
    def default() -> ActivateNetworkGroupParams:
        return ActivateNetworkGroupParams()


class ConfiguredNetworkGroup:
    def __init__(self, vdevice: VDevice, hef: Hef) -> None:
        self.vdevice, self.hef, self.active = vdevice, hef, False

    def get_name(self) -> str:
        return self.hef.network_group

    def get_networks_names(self) -> list[str]:
        return self.hef.get_networks_names("")

    def is_scheduled(self) -> bool:
        return self.vdevice.is_scheduled()

    def activate(self, params: ActivateNetworkGroupParams) -> _ActivatedNetworkGroup:
        if self.is_scheduled():
            _fail("HAILO_INVALID_OPERATION")
        return _ActivatedNetworkGroup(self)

    def get_input_vstream_infos(self, name: str) -> list[VStreamInfo]:
        return self.hef.get_input_vstream_infos("")

    def get_output_vstream_infos(self, name: str) -> list[VStreamInfo]:
        return self.hef.get_output_vstream_infos("")

    def get_sorted_output_names(self) -> list[str]:
        return self.hef.get_sorted_output_names("")

    def make_input_vstream_params(
        self, name: str, format_type: FormatType, timeout_ms: int, queue_size: int
    ) -> dict:
        return {v.name: VStreamParams(v, format_type, timeout_ms, queue_size) for v in self.hef._in}

    def make_output_vstream_params(
        self, name: str, format_type: FormatType, timeout_ms: int, queue_size: int
    ) -> dict:
        return {v.name: VStreamParams(v, format_type, timeout_ms, queue_size) for v in self.hef._out}


class _ActivatedNetworkGroup:
    def __init__(self, group: ConfiguredNetworkGroup) -> None:
        self.group = group

    def __enter__(self) -> _ActivatedNetworkGroup:
        self.group.active = True
        return self

    def __exit__(self, *exc) -> None:
        self.group.active = False

    def get_invalid_frames_count(self) -> int:
        return 0


class VStreamParams:
    def __init__(self, info: VStreamInfo, format_type: FormatType, timeout_ms: int, queue_size: int) -> None:
        fmt_type = info.format.type if format_type == FormatType.AUTO else format_type
        self.user_buffer_format = Format(fmt_type, info.format.order)
        self.timeout_ms, self.queue_size = timeout_ms, queue_size


def _float32_only(fmt_type: FormatType) -> None:
    if fmt_type != FormatType.FLOAT32:
        # Quantized buffers would need the HEF's real quant info: not simulated.
        raise HailoRTCustomException("the HailoRT stand-in simulates FLOAT32 buffers only")


class InferVStreams:
    def __init__(self, group: ConfiguredNetworkGroup, input_params: dict, output_params: dict) -> None:
        self.group, self.input_params, self.output_params = group, input_params, output_params
        for p in list(input_params.values()) + list(output_params.values()):
            _float32_only(p.user_buffer_format.type)

    def get_host_dtype(self, name: str):
        return np.dtype(np.float32)

    def infer(self, input_data: dict, output_buffers: dict, batch_size: int) -> None:
        g = self.group
        if not g.is_scheduled() and not g.active:
            _fail("HAILO_NETWORK_GROUP_NOT_ACTIVATED")
        timeout = min(p.timeout_ms for p in self.input_params.values()) / 1000.0
        for b in range(batch_size):
            g.vdevice.check_alive()
            _simulate_latency(timeout)
            out = _run_frame(g.hef, {n: a[b] for n, a in input_data.items()})
            for name, buf in output_buffers.items():
                buf[b] = out[name]


# -- InferModel API (HailoRT >= 4.18) ----------------------------------------------------------------
class InferStream:
    """InferModel::InferStream: one edge's user-side format."""

    def __init__(self, info: VStreamInfo) -> None:
        self.info = info
        self._format = Format(info.format.type, info.format.order)

    def name(self) -> str:
        return self.info.name

    def shape(self) -> list[int]:
        return list(self.info.shape)

    def format(self) -> Format:
        return self._format

    def set_format_type(self, type: FormatType) -> None:  # noqa: A002 - HailoRT's name
        self._format = Format(FormatType(type), self._format.order)

    def set_format_order(self, order: FormatOrder) -> None:
        self._format = Format(self._format.type, FormatOrder(order))

    def get_quant_infos(self) -> list[QuantInfo]:
        return [self.info.quant_info]

    def is_nms(self) -> bool:
        return False

    def frame_bytes(self) -> int:
        return int(np.prod(self.info.shape)) * _ITEM_BYTES.get(self._format.type, 1)


class InferModel:
    def __init__(self, vdevice: VDevice, hef: Hef, name: str) -> None:
        self.vdevice, self.hef, self.name = vdevice, hef, name
        self._inputs = {v.name: InferStream(v) for v in hef._in}
        self._outputs = {v.name: InferStream(v) for v in hef._out}
        self.batch_size = 0  # HAILO_DEFAULT_BATCH_SIZE

    @staticmethod
    def _pick(edges: dict, name: str) -> InferStream:
        if not name:
            if len(edges) != 1:
                _fail("HAILO_INVALID_OPERATION")  # "Model has more than one input!"
            return next(iter(edges.values()))
        if name not in edges:
            _fail("HAILO_NOT_FOUND")
        return edges[name]

    def input(self, name: str = "") -> InferStream:
        return self._pick(self._inputs, name)

    def output(self, name: str = "") -> InferStream:
        return self._pick(self._outputs, name)

    def inputs(self) -> list[InferStream]:
        return list(self._inputs.values())

    def outputs(self) -> list[InferStream]:
        return list(self._outputs.values())

    def get_input_names(self) -> list[str]:
        return list(self._inputs)

    def get_output_names(self) -> list[str]:
        return list(self._outputs)

    def set_batch_size(self, batch_size: int) -> None:
        self.batch_size = int(batch_size)

    def set_power_mode(self, power_mode) -> None:
        pass

    def configure(self) -> ConfiguredInferModel:
        self.vdevice.check_hef(self.hef)  # vdevice.cpp create_local_config_params
        _session(self.hef.onnx)  # loading the network is configure's cost, not the first frame's
        return ConfiguredInferModel(self)


class BindingsInferStream:
    def __init__(self, edge: InferStream) -> None:
        self.edge, self.buffer = edge, None

    def set_buffer(self, buffer: np.ndarray) -> None:
        self.buffer = buffer


class Bindings:
    def __init__(self, model: InferModel) -> None:
        self._inputs = {n: BindingsInferStream(e) for n, e in model._inputs.items()}
        self._outputs = {n: BindingsInferStream(e) for n, e in model._outputs.items()}

    def input(self, name: str) -> BindingsInferStream:
        if name not in self._inputs:
            _fail("HAILO_NOT_FOUND")
        return self._inputs[name]

    def output(self, name: str) -> BindingsInferStream:
        if name not in self._outputs:
            _fail("HAILO_NOT_FOUND")
        return self._outputs[name]


class AsyncInferJob:
    def __init__(self, thread: threading.Thread, state: dict) -> None:
        self._thread, self._state = thread, state

    def wait(self, timeout: timedelta) -> None:
        self._thread.join(timeout.total_seconds())
        if self._thread.is_alive():
            self._state["abandoned"] = True
            _fail("HAILO_TIMEOUT")
        if self._state.get("status"):
            raise HailoRTStatusException(str(self._state["status"]))


class ConfiguredInferModel:
    def __init__(self, model: InferModel) -> None:
        self.model, self.active = model, False

    def create_bindings(self) -> Bindings:
        return Bindings(self.model)

    def activate(self) -> None:
        if self.model.vdevice.is_scheduled():
            _fail("HAILO_INVALID_OPERATION")
        self.active = True

    def deactivate(self) -> None:
        self.active = False

    def wait_for_async_ready(self, timeout: timedelta, frames_count: int) -> None:
        pass

    def shutdown(self) -> None:
        self.active = False

    def set_scheduler_timeout(self, timeout: timedelta) -> None:
        self._scheduled_only()

    def set_scheduler_threshold(self, threshold: int) -> None:
        self._scheduled_only()

    def set_scheduler_priority(self, priority: int) -> None:
        self._scheduled_only()

    def _scheduled_only(self) -> None:
        if not self.model.vdevice.is_scheduled():
            _fail("HAILO_INVALID_OPERATION")

    def get_async_queue_size(self) -> int:
        return 2

    def _validate(self, bindings: Bindings) -> None:
        for edges in (bindings._inputs, bindings._outputs):
            for b in edges.values():
                if b.buffer is None:
                    _fail("HAILO_INVALID_OPERATION")  # "... buffer was not set"
                if b.buffer.nbytes != b.edge.frame_bytes():
                    _fail("HAILO_INVALID_OPERATION")  # infer_model.cpp: buffer size != frame size
                _float32_only(b.edge.format().type)

    def run_async(self, bindings: list[Bindings], callback) -> AsyncInferJob:
        if not self.model.vdevice.is_scheduled() and not self.active:
            _fail("HAILO_NETWORK_GROUP_NOT_ACTIVATED")
        for b in bindings:
            self._validate(b)
        vdevice = self.model.vdevice
        vdevice.check_alive()  # the ioctl that queues the transfer
        state: dict = {}

        def work() -> None:
            status = 0
            try:
                for b in bindings:
                    _simulate_latency(None)
                    vdevice.check_alive()  # the device may have left while the frame ran
                    if state.get("abandoned"):
                        # Simplification: the chip would still write this late frame into the
                        # buffers; the stand-in drops it rather than run onnxruntime in a thread
                        # nobody waits for (one still running at interpreter exit aborts it).
                        break
                    out = _run_frame(self.model.hef, {n: s.buffer for n, s in b._inputs.items()})
                    for name, s in b._outputs.items():
                        s.buffer.reshape(-1)[:] = out[name].reshape(-1)
            except HailoRTStatusException as exc:
                status = int(exc.args[0])
            except Exception:  # noqa: BLE001 - the chip failed: report it like libhailort would
                status = _CODE["HAILO_INTERNAL_FAILURE"]
            state["status"] = status
            callback(status)

        thread = threading.Thread(target=work, name="hailo-standin-infer", daemon=True)
        thread.start()
        return AsyncInferJob(thread, state)
