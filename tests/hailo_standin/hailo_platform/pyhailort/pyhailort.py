"""Stand-in for hailo_platform/pyhailort/pyhailort.py, HailoRT's Python layer.

Same class names, method names and signatures as hailo-ai/hailort branch `hailo8`, tag v4.23.0
(hailort/libhailort/bindings/python/platform/hailo_platform/pyhailort/pyhailort.py), for the
subset edgeasr uses: HEF, VDevice (+create_params), Device (+Control.identify), the InferModel
API (InferModel, ConfiguredInferModel, Bindings, AsyncInferJob) and the pre-4.18 vstreams API
(ConfigureParams, ConfiguredNetwork, InputVStreamParams, OutputVStreamParams, InferVStreams),
the exception classes and the status -> exception mapping. Written for these tests, not
copied; behaviour the tests rely on is noted where it was read from HailoRT's sources.

Version emulation (HAILO_STANDIN_VERSION, see _pyhailort): before 4.18 VDevice has no
create_infer_model; 4.18/4.19 name its 2nd parameter `network_name`, 4.20+ `name`.
"""

from __future__ import annotations

import gc
import os
from datetime import timedelta
from enum import IntEnum

import numpy

import hailo_platform.pyhailort._pyhailort as _pyhailort
from hailo_platform.pyhailort._pyhailort import FormatOrder, FormatType  # noqa: F401 - re-exported

_VERSION = _pyhailort.version_tuple(_pyhailort.standin_version())

DEFAULT_VSTREAM_TIMEOUT_MS = 10000
DEFAULT_VSTREAM_QUEUE_SIZE = 2

# pyhailort.py subclasses the pybind11 enums; Python enums with members cannot be subclassed.
HailoSchedulingAlgorithm = _pyhailort.SchedulingAlgorithm
HailoStreamInterface = _pyhailort.StreamInterface
HailoStreamDirection = _pyhailort.StreamDirection


class HailoRTException(Exception):
    pass


class HailoRTTimeout(HailoRTException):
    pass


class HailoRTStreamAborted(HailoRTException):
    pass


class HailoRTStreamAbortedByUser(HailoRTException):
    pass


class HailoRTInvalidOperationException(HailoRTException):
    pass


class HailoRTInvalidArgumentException(HailoRTException):
    pass


class HailoRTNotFoundException(HailoRTException):
    pass


class HailoRTInvalidHEFException(HailoRTException):
    pass


class HailoRTHEFNotCompatibleWithDevice(HailoRTException):
    pass


class HailoRTDriverOperationFailedException(HailoRTException):
    pass


class HailoRTNetworkGroupNotActivatedException(HailoRTException):
    pass


class HailoCommunicationClosedException(HailoRTException):
    pass


class HailoStatusInvalidValueException(Exception):
    pass


def get_status_message(status_code):
    message = _pyhailort.get_status_message(status_code)
    if message == "":
        raise HailoStatusInvalidValueException(f"Value {status_code} is not a valid status")
    return message


# Statuses with their own exception class in 4.23 (ExceptionWrapper.create_exception_from_status).
_BY_STATUS = {
    "HAILO_TIMEOUT": (
        HailoRTTimeout,
        "Received a timeout - hailort has failed because a timeout had occurred",
    ),
    "HAILO_STREAM_ABORT": (HailoRTStreamAborted, "Stream was aborted"),
    "HAILO_INVALID_OPERATION": (
        HailoRTInvalidOperationException,
        "Invalid operation. See hailort.log for more information",
    ),
    "HAILO_INVALID_ARGUMENT": (
        HailoRTInvalidArgumentException,
        "Invalid argument. See hailort.log for more information",
    ),
    "HAILO_NOT_FOUND": (HailoRTNotFoundException, "Item not found. See hailort.log for more information"),
    "HAILO_INVALID_HEF": (HailoRTInvalidHEFException, "Invalid HEF. See hailort.log for more information"),
    "HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE": (
        HailoRTHEFNotCompatibleWithDevice,
        "HEF file is not compatible with device. See hailort.log for more information",
    ),
    "HAILO_DRIVER_OPERATION_FAILED": (
        HailoRTDriverOperationFailedException,
        "Failure in hailort driver ioctl. run 'dmesg | grep hailo' for more information",
    ),
    "HAILO_COMMUNICATION_CLOSED": (
        HailoCommunicationClosedException,
        "Communication closed failure. Check server-client connection",
    ),
    "HAILO_NETWORK_GROUP_NOT_ACTIVATED": (
        HailoRTNetworkGroupNotActivatedException,
        "Network group is not activated",
    ),
}


class ExceptionWrapper:
    """Context manager turning the extension's status exceptions into HailoRT exception classes."""

    def __enter__(self):
        return None

    def __exit__(self, exc_type, value, traceback):
        if value is None:
            return False
        if isinstance(value, _pyhailort.HailoRTStatusException):
            raise self.create_exception_from_status(int(value.args[0])) from value
        if isinstance(value, _pyhailort.HailoRTCustomException):
            raise HailoRTException(str(value)) from value
        return False

    @staticmethod
    def create_exception_from_status(error_code):
        name = get_status_message(error_code)
        cls, text = _BY_STATUS.get(name, (None, None))
        if cls is None:
            return HailoRTException(f"libhailort failed with error: {error_code} ({name})")
        return cls(text)


# -- HEF ---------------------------------------------------------------------------------------------
class HEF:
    """A compiled model. `shape` of its vstream infos carries no batch: (H, W, C)."""

    def __init__(self, hef_source):
        with ExceptionWrapper():
            if isinstance(hef_source, str):
                self._hef = _pyhailort.Hef.create_from_file(hef_source)
                self._path = hef_source
            elif isinstance(hef_source, bytes):
                self._hef = _pyhailort.Hef.create_from_buffer(hef_source)
                self._path = None
            else:
                raise ValueError("HEF can only be created from a file path (str) or a buffer (bytes)")

    @property
    def path(self):
        return self._path

    def get_network_group_names(self):
        with ExceptionWrapper():
            return self._hef.get_network_group_names()

    def get_networks_names(self, network_group_name=None):
        with ExceptionWrapper():
            return self._hef.get_networks_names(network_group_name or "")

    def get_input_vstream_infos(self, name=None):
        with ExceptionWrapper():
            return self._hef.get_input_vstream_infos(name or "")

    def get_output_vstream_infos(self, name=None):
        with ExceptionWrapper():
            return self._hef.get_output_vstream_infos(name or "")

    def get_all_vstream_infos(self, name=None):
        with ExceptionWrapper():
            return self._hef.get_all_vstream_infos(name or "")

    def get_sorted_output_names(self, network_group_name=None):
        group = network_group_name or self.get_network_group_names()[0]
        with ExceptionWrapper():
            return self._hef.get_sorted_output_names(group)


# -- the vstreams API ---------------------------------------------------------------------------------
class ConfigureParams:
    @staticmethod
    def create_from_hef(hef, interface):
        with ExceptionWrapper():
            return hef._hef.create_configure_params(interface)


class EmptyContextManager:
    def __enter__(self):
        return None

    def __exit__(self, *args):
        return None


class ActivatedNetworkContextManager:
    def __init__(self, configured_network, activated_network):
        self._configured_network, self._activated_network = configured_network, activated_network

    def __enter__(self):
        with ExceptionWrapper():
            self._activated_network.__enter__()
        return self

    def __exit__(self, *args):
        self._activated_network.__exit__(*args)


class ConfiguredNetwork:
    """A network group loaded to the device."""

    def __init__(self, configured_network):
        self._configured_network = configured_network

    @property
    def name(self):
        return self._configured_network.get_name()

    def get_networks_names(self):
        return self._configured_network.get_networks_names()

    @staticmethod
    def create_params():
        return _pyhailort.ActivateNetworkGroupParams.default()

    def activate(self, network_group_params=None):
        if self._configured_network.is_scheduled():
            # 4.23: "Calls to `activate()` when working with scheduler are deprecated!" -> no-op
            return EmptyContextManager()
        params = network_group_params or self.create_params()
        with ExceptionWrapper():
            return ActivatedNetworkContextManager(self, self._configured_network.activate(params))

    def get_input_vstream_infos(self, network_name=None):
        return self._configured_network.get_input_vstream_infos(network_name or "")

    def get_output_vstream_infos(self, network_name=None):
        return self._configured_network.get_output_vstream_infos(network_name or "")

    def get_sorted_output_names(self):
        return self._configured_network.get_sorted_output_names()


def _make_vstream_params(maker, configured_network, format_type, timeout_ms, queue_size, network_name):
    format_type = FormatType.AUTO if format_type is None else format_type
    timeout_ms = DEFAULT_VSTREAM_TIMEOUT_MS if timeout_ms is None else timeout_ms
    queue_size = DEFAULT_VSTREAM_QUEUE_SIZE if queue_size is None else queue_size
    with ExceptionWrapper():
        return getattr(configured_network._configured_network, maker)(
            network_name or "", format_type, timeout_ms, queue_size
        )


class InputVStreamParams:
    @staticmethod
    def make(
        configured_network,
        quantized=None,
        format_type=None,
        timeout_ms=None,
        queue_size=None,
        network_name=None,
    ):
        return _make_vstream_params(
            "make_input_vstream_params", configured_network, format_type, timeout_ms, queue_size, network_name
        )


class OutputVStreamParams:
    @staticmethod
    def make(
        configured_network,
        quantized=None,
        format_type=None,
        timeout_ms=None,
        queue_size=None,
        network_name=None,
    ):
        return _make_vstream_params(
            "make_output_vstream_params",
            configured_network,
            format_type,
            timeout_ms,
            queue_size,
            network_name,
        )


class InferVStreams:
    """Blocking inference pipeline; infer() returns {output name: [batch, *vstream shape]}."""

    def __init__(
        self, configured_net_group, input_vstreams_params, output_vstreams_params, tf_nms_format=False
    ):
        self._configured_net_group = configured_net_group
        self._input_vstreams_params = input_vstreams_params
        self._output_vstreams_params = output_vstreams_params
        self._infer_pipeline = None

    def __enter__(self):
        with ExceptionWrapper():
            self._infer_pipeline = _pyhailort.InferVStreams(
                self._configured_net_group._configured_network,
                self._input_vstreams_params,
                self._output_vstreams_params,
            )
        return self

    def __exit__(self, *args):
        self._infer_pipeline = None

    def infer(self, input_data):
        if not isinstance(input_data, dict):
            infos = self._configured_net_group.get_input_vstream_infos()
            if len(infos) != 1:
                raise Exception("when there is more than one input, the input_data should be of type dict")
            input_data = {infos[0].name: input_data}
        batch = {a.shape[0] for a in input_data.values()}
        if len(batch) != 1:
            raise ValueError("The number of frames on all input_tensors should be equal!")
        batch_size = batch.pop()
        outputs = {}
        for info in self._configured_net_group.get_output_vstream_infos():
            if info.name in self._output_vstreams_params:
                dtype = self._infer_pipeline.get_host_dtype(info.name)
                outputs[info.name] = numpy.empty([batch_size, *info.shape], dtype=dtype)
        for name, data in list(input_data.items()):
            fmt = self._input_vstreams_params[name].user_buffer_format
            if data.dtype.itemsize != _pyhailort.get_format_data_bytes(fmt):
                raise HailoRTException(
                    f"{name} numpy array item size is {data.dtype.itemsize}, "
                    f"not {_pyhailort.get_format_data_bytes(fmt)}"
                )
            if not data.flags.c_contiguous:
                input_data[name] = numpy.asarray(data, order="C")
        with ExceptionWrapper():
            self._infer_pipeline.infer(input_data, outputs, batch_size)
        return outputs


# -- devices -----------------------------------------------------------------------------------------
class DeviceArchitectureTypes(IntEnum):
    HAILO8_A0 = 0
    HAILO8 = 1
    HAILO8L = 2
    HAILO15H = 3
    HAILO15L = 4
    HAILO15M = 5
    HAILO10H = 6

    def __str__(self):
        return self.name


class BoardInformation:
    def __init__(self, identity):
        self.protocol_version = identity.protocol_version
        self.firmware_version = (
            identity.fw_version.major,
            identity.fw_version.minor,
            identity.fw_version.revision,
        )
        self.logger_version = identity.logger_version
        self.board_name = identity.board_name
        self.is_release = identity.is_release
        self.extended_context_switch_buffer = identity.extended_context_switch_buffer
        self.device_architecture = DeviceArchitectureTypes(int(identity.device_architecture))
        self.serial_number = identity.serial_number
        self.part_number = identity.part_number
        self.product_name = identity.product_name


class Control:
    def __init__(self, device):
        self.__device = device

    @property
    def _device(self):
        if not self.__device.is_valid():
            raise HailoRTInvalidOperationException("The device in use has been released.")
        return self.__device

    @property
    def device_id(self):
        return self._device.device_id

    def identify(self):
        with ExceptionWrapper():
            return BoardInformation(self._device.identify())


class Device:
    """A physical device (inference goes through VDevice)."""

    @classmethod
    def scan(cls):
        return _pyhailort.Device.scan()

    def __init__(self, device_id=None):
        gc.collect()
        self._device = None
        if device_id is None:
            ids = Device.scan()
            if not ids:
                raise HailoRTException("HailoRT device not found in the system")
            device_id = ids[0]
        self._device_id = device_id
        with ExceptionWrapper():
            self._device = _pyhailort.Device.create(device_id)
        self._control_object = Control(self._device)

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.release()
        return False

    def __del__(self):
        self.release()

    def release(self):
        if self._device is not None:
            self._device.release()
            self._device = None

    @property
    def device_id(self):
        return self._device_id

    @property
    def control(self):
        return self._control_object


# -- InferModel API -------------------------------------------------------------------------------------
class AsyncInferCompletionInfo:
    def __init__(self, exception):
        self._exception = exception

    @property
    def exception(self):
        return self._exception


class InferModel:
    class InferStream:
        def __init__(self, infer_stream):
            self._infer_stream = infer_stream

        @property
        def name(self):
            return self._infer_stream.name()

        @property
        def shape(self):
            return self._infer_stream.shape()  # list, no batch

        @property
        def format(self):
            return self._infer_stream.format()

        def set_format_type(self, type):  # noqa: A002 - HailoRT's name
            with ExceptionWrapper():
                self._infer_stream.set_format_type(type)

        def set_format_order(self, order):
            with ExceptionWrapper():
                self._infer_stream.set_format_order(order)

        @property
        def quant_infos(self):
            return self._infer_stream.get_quant_infos()

        @property
        def is_nms(self):
            return self._infer_stream.is_nms()

    def __init__(self, infer_model, hef_path):
        self._infer_model = infer_model
        self._hef_path = hef_path
        self._hef = None

    @property
    def hef(self):
        if not self._hef:
            self._hef = HEF(self._hef_path)
        return self._hef

    def set_batch_size(self, batch_size):
        with ExceptionWrapper():
            self._infer_model.set_batch_size(batch_size)

    def set_power_mode(self, power_mode):
        with ExceptionWrapper():
            self._infer_model.set_power_mode(power_mode)

    def configure(self):
        with ExceptionWrapper():
            return ConfiguredInferModel(self._infer_model.configure(), self)

    @property
    def input_names(self):
        return self._infer_model.get_input_names()

    @property
    def output_names(self):
        return self._infer_model.get_output_names()

    @property
    def inputs(self):
        return [self.InferStream(s) for s in self._infer_model.inputs()]

    @property
    def outputs(self):
        return [self.InferStream(s) for s in self._infer_model.outputs()]

    def input(self, name=""):
        with ExceptionWrapper():
            return self.InferStream(self._infer_model.input(name))

    def output(self, name=""):
        with ExceptionWrapper():
            return self.InferStream(self._infer_model.output(name))


class ConfiguredInferModel:
    class Bindings:
        class InferStream:
            def __init__(self, infer_stream):
                self._infer_stream = infer_stream
                self._buffer = None

            @staticmethod
            def _validate_c_contiguous(buffer):
                if not buffer.flags.c_contiguous:
                    raise HailoRTException("Buffer must be C_CONTIGUOUS")

            def set_buffer(self, buffer):
                with ExceptionWrapper():
                    self._validate_c_contiguous(buffer)
                    self._infer_stream.set_buffer(buffer)
                self._buffer = buffer

            def get_buffer(self, tf_format=False):
                return self._buffer

        def __init__(self, bindings, input_names, output_names):
            self._bindings = bindings
            self._input_names, self._output_names = input_names, output_names
            self._inputs, self._outputs = {}, {}

        def input(self, name=""):
            if name == "" and len(self._input_names) == 1:
                name = self._input_names[0]
            if name not in self._inputs:
                with ExceptionWrapper():
                    self._inputs[name] = self.InferStream(self._bindings.input(name))
            return self._inputs[name]

        def output(self, name=""):
            if name == "" and len(self._output_names) == 1:
                name = self._output_names[0]
            if name not in self._outputs:
                with ExceptionWrapper():
                    self._outputs[name] = self.InferStream(self._bindings.output(name))
            return self._outputs[name]

        def get(self):
            return self._bindings

    def __init__(self, configured_infer_model, infer_model):
        self._configured_infer_model = configured_infer_model
        self._input_names = infer_model.input_names
        self._output_names = infer_model.output_names
        self._infer_model = infer_model

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self._configured_infer_model = None

    def activate(self):
        """Invalid when the scheduler is enabled."""
        with ExceptionWrapper():
            self._configured_infer_model.activate()

    def deactivate(self):
        with ExceptionWrapper():
            self._configured_infer_model.deactivate()

    def create_bindings(self, input_buffers=None, output_buffers=None):
        with ExceptionWrapper():
            cpp = self._configured_infer_model.create_bindings()
        bindings = self.Bindings(cpp, self._input_names, self._output_names)
        for name, buffer in (input_buffers or {}).items():
            bindings.input(name).set_buffer(buffer)
        for name, buffer in (output_buffers or {}).items():
            bindings.output(name).set_buffer(buffer)
        return bindings

    def wait_for_async_ready(self, timeout_ms=1000, frames_count=1):
        with ExceptionWrapper():
            self._configured_infer_model.wait_for_async_ready(
                timedelta(milliseconds=timeout_ms), frames_count
            )

    def run(self, bindings, timeout):
        """Synchronous: run_async(bindings).wait(timeout); HailoRTTimeout when it takes longer."""
        with ExceptionWrapper():
            job = self.run_async(bindings)
            job.wait(timeout)

    def run_async(self, bindings, callback=None):
        def callback_wrapper(error_code):
            if callback:
                exc = ExceptionWrapper.create_exception_from_status(error_code) if error_code else None
                callback(completion_info=AsyncInferCompletionInfo(exc))

        with ExceptionWrapper():
            cpp_job = self._configured_infer_model.run_async([b.get() for b in bindings], callback_wrapper)
        return AsyncInferJob(cpp_job)

    def set_scheduler_timeout(self, timeout_ms):
        with ExceptionWrapper():
            self._configured_infer_model.set_scheduler_timeout(timedelta(milliseconds=timeout_ms))

    def set_scheduler_threshold(self, threshold):
        with ExceptionWrapper():
            self._configured_infer_model.set_scheduler_threshold(threshold)

    def set_scheduler_priority(self, priority):
        with ExceptionWrapper():
            self._configured_infer_model.set_scheduler_priority(priority)

    def get_async_queue_size(self):
        with ExceptionWrapper():
            return self._configured_infer_model.get_async_queue_size()

    def shutdown(self):
        with ExceptionWrapper():
            self._configured_infer_model.shutdown()


class AsyncInferJob:
    def __init__(self, job):
        self._job = job

    def wait(self, timeout_ms):
        """HailoRTTimeout if the job did not finish within timeout_ms."""
        with ExceptionWrapper():
            self._job.wait(timedelta(milliseconds=timeout_ms))


class VDevice:
    """Virtual device over one or more physical devices; owns them until release()."""

    def __init__(self, params=None, *, device_ids=None):
        gc.collect()
        self._vdevice = None
        self._params = params
        self._device_ids = device_ids
        self._loaded_network_groups = []
        self._creation_pid = os.getpid()
        self._open_vdevice()

    def _open_vdevice(self):
        if self._params is None:
            self._params = VDevice.create_params()
        with ExceptionWrapper():
            self._vdevice = _pyhailort.VDevice.create(self._params, list(self._device_ids or []))

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.release()
        return False

    def __del__(self):
        self.release()

    def release(self):
        if getattr(self, "_vdevice", None) is not None:
            self._vdevice.release()
            self._vdevice = None

    @staticmethod
    def create_params():
        with ExceptionWrapper():
            return _pyhailort.VDeviceParams.default()

    def configure(self, hef, configure_params_by_name={}):  # noqa: B006 - HailoRT's signature
        if self._creation_pid != os.getpid():
            raise HailoRTException("VDevice can only be configured from the process it was created in.")
        with ExceptionWrapper():
            groups = self._vdevice.configure(hef._hef, configure_params_by_name)
        configured = [ConfiguredNetwork(g) for g in groups]
        self._loaded_network_groups.extend(configured)
        return configured

    def get_physical_devices_ids(self):
        with ExceptionWrapper():
            return self._vdevice.get_physical_devices_ids()

    def get_physical_devices(self):
        return [Device(i) for i in self.get_physical_devices_ids()]

    @property
    def loaded_network_groups(self):
        return self._loaded_network_groups

    def _create_infer_model(self, hef_source, name=""):
        if os.getpid() != self._creation_pid:
            raise HailoRTException("InferModel can be created only from the process VDevice was created in.")
        with ExceptionWrapper():
            if type(hef_source) is bytes:
                cpp = self._vdevice.create_infer_model_from_buffer(hef_source, name)
            else:
                cpp = self._vdevice.create_infer_model_from_file(hef_source, name)
        return InferModel(cpp, hef_source)


# The InferModel API appeared in 4.18; its 2nd parameter was renamed network_name -> name in 4.20.
if _VERSION >= (4, 20):

    def _create_infer_model_420(self, hef_source, name=""):
        return self._create_infer_model(hef_source, name)

    VDevice.create_infer_model = _create_infer_model_420
elif _VERSION >= (4, 18):

    def _create_infer_model_418(self, hef_source, network_name=""):
        return self._create_infer_model(hef_source, network_name)

    VDevice.create_infer_model = _create_infer_model_418
