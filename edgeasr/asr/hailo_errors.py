"""HailoRT failures -> one-line edgeasr errors (the table behind edgeasr.asr.hailo).

HailoRT failures arrive as HailoRTException subclasses (pyhailort's ExceptionWrapper) named
for their status or naming it in their text. `status_name` finds the status; `translate`
turns it into a DeviceError/ModelError whose message says what to do, with the context
(HEF, stage, config key) the encoder knows. No hailo_platform import here: the encoder
passes what the messages need.

Statuses as in hailo-ai/hailort, branch `hailo8`, tag v4.23.0
(hailort/libhailort/include/hailo/hailort.h).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edgeasr.errors import DeviceError, EdgeAsrError, ModelError

# HailoRT status names by what they mean here.
# fmt: off
TIMEOUT = {"HAILO_TIMEOUT"}
WRONG_CHIP = {"HAILO_INVALID_HEF", "HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE"}  # 26 up to 4.20, 93 from 4.21
BAD_HEF = {"HAILO_INVALID_HEF", "HAILO_HEF_NOT_SUPPORTED", "HAILO_HEF_FILE_CORRUPTED",
           "HAILO_OPEN_FILE_FAILURE"}
BUSY = {"HAILO_OUT_OF_PHYSICAL_DEVICES", "HAILO_DEVICE_IN_USE"}
DRIVER_MISMATCH = {"HAILO_INVALID_DRIVER_VERSION", "HAILO_DRIVER_INVALID_RESPONSE",
                   "HAILO_DRIVER_INVALID_IOCTL"}
NO_DRIVER = {"HAILO_DRIVER_NOT_INSTALLED", "HAILO_PCIE_DRIVER_NOT_INSTALLED"}
NO_SERVICE = {"HAILO_RPC_FAILED", "HAILO_CONNECTION_REFUSED"}
SERVICE_MISMATCH = {"HAILO_INVALID_SERVICE_VERSION"}
# The device went away under an open VDevice. When the PCIe device is removed (or reset),
# the hailo driver answers every ioctl on the open file with ENODEV
# (hailort-drivers v4.23.0 linux/pcie/src/fops.c), which libhailort reports as
# HAILO_DRIVER_OPERATION_FAILED (36; driver_os_specific.cpp convert_errno_to_hailo_status;
# named HAILO_DRIVER_FAIL up to 4.19); a hung chip gives HAILO_DRIVER_TIMEOUT (87, "device
# reset may be required"); aborted transfers HAILO_STREAM_ABORT (63).
DEVICE_GONE = {"HAILO_DRIVER_OPERATION_FAILED", "HAILO_DRIVER_FAIL", "HAILO_DRIVER_TIMEOUT",
               "HAILO_STREAM_ABORT"}
SERVICE_GONE = {"HAILO_COMMUNICATION_CLOSED"}  # hailort.service went away (multi-process)
# fmt: on

# Exception classes of pyhailort.py that stand for one status (their text does not name it).
CLASS_STATUS = {
    "HailoRTTimeout": "HAILO_TIMEOUT",
    "HailoRTInvalidHEFException": "HAILO_INVALID_HEF",
    "HailoRTHEFNotCompatibleWithDevice": "HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE",
    "HailoRTNetworkGroupNotActivatedException": "HAILO_NETWORK_GROUP_NOT_ACTIVATED",
    "HailoCommunicationClosedException": "HAILO_COMMUNICATION_CLOSED",
    "HailoRTDriverOperationFailedException": "HAILO_DRIVER_OPERATION_FAILED",
    "HailoRTPCIeDriverException": "HAILO_DRIVER_FAIL",  # 4.18/4.19's class for status 36
    "HailoRTStreamAborted": "HAILO_STREAM_ABORT",
}

CONFIGURING = "configuring the HEF on the device"


class NpuTimeoutError(DeviceError):
    """HailoRT gave up waiting for the chip (encoder.timeout_ms); the encoder is then closed."""


# (statuses, when: always | group | no group (encoder.service_group set or not), error, message)
# fmt: off
_MESSAGES = (
    (TIMEOUT, "always", NpuTimeoutError,
     "the Hailo NPU did not answer within encoder.timeout_ms = {timeout_ms} ms while {stage}{tag}"),
    (BAD_HEF, "always", ModelError,
     "{hef}: HailoRT {version} cannot read this HEF{tag}: it is corrupt, not a HEF, or compiled by a "
     "Dataflow Compiler newer than this HailoRT"),
    (BUSY, "no group", DeviceError,
     "the Hailo device is busy: another process holds it{tag}; share it by setting encoder.service_group "
     "(the same group id in every process) with hailort.service running, or stop the other process"),
    (BUSY, "group", DeviceError,
     "no free Hailo device for encoder.service_group {group!r}{tag}: every process sharing the chip must "
     "use the same group through hailort.service"),
    (DRIVER_MISMATCH, "always", DeviceError,
     "HailoRT {version} and the hailo PCIe driver are different versions{tag}: install the "
     "hailort-pcie-driver of the same version (dmesg | grep hailo shows the driver's)"),
    (SERVICE_MISMATCH, "always", DeviceError,
     "hailort.service runs another HailoRT version than this process ({version}){tag}: update both"),
    (NO_SERVICE, "group", DeviceError,
     "encoder.service_group is set but hailort.service is not reachable{tag}: "
     "systemctl enable --now hailort.service"),
    (NO_DRIVER, "always", DeviceError,
     "the hailo PCIe driver is not loaded{tag}: install hailort-pcie-driver and reboot "
     "(ls /dev/hailo* should list a device)"),
    (DEVICE_GONE, "always", DeviceError,
     "the Hailo device stopped answering while {stage}{tag}: it was reset or left the PCIe bus "
     "(dmesg | grep hailo)"),
    (SERVICE_GONE, "always", DeviceError,
     "hailort.service closed the connection while {stage}{tag}: it stopped or restarted "
     "(systemctl status hailort.service)"),
)
# fmt: on


@dataclass(frozen=True)
class Context:
    """What the messages name: the encoder's HEF and settings, HailoRT's version."""

    hef: Path
    version: str
    timeout_ms: int
    group: str | None


def status_name(exc: BaseException) -> str | None:
    """The HailoRT status behind an exception from hailo_platform, e.g. 'HAILO_TIMEOUT': its
    class (HailoRTTimeout, ...) or the name in its text ("libhailort failed with error: 74
    (HAILO_OUT_OF_PHYSICAL_DEVICES)"), along the __cause__ chain."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__name__ in CLASS_STATUS:
            return CLASS_STATUS[type(e).__name__]
        match = re.search(r"\b(HAILO_[A-Z0-9_]+)\b", str(e))
        if match and match.group(1) != "HAILO_SUCCESS":
            return match.group(1)
        e = e.__cause__ or e.__context__
    return None


def tag(exc: BaseException) -> str:
    """' (STATUS)' for the end of a message, or the exception's text when no status is known."""
    status = status_name(exc)
    return f" ({status})" if status else f" ({exc})"


def translate(exc: BaseException, stage: str, ctx: Context) -> EdgeAsrError:
    """A one-line error for a HailoRT failure during `stage` (wrong-chip HEFs excepted: the
    encoder words those itself, after asking the device what it is)."""
    status = status_name(exc)
    for statuses, when, cls, template in _MESSAGES:
        if status in statuses and when in ("always", "group" if ctx.group else "no group"):
            return cls(template.format(hef=ctx.hef, version=ctx.version, tag=tag(exc), stage=stage,
                                       timeout_ms=ctx.timeout_ms, group=ctx.group))
    return DeviceError(f"HailoRT {ctx.version} failed while {stage}{tag(exc)}")
