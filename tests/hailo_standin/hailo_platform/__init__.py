"""STAND-IN for HailoRT's Python package `hailo_platform` (pyhailort), for edgeasr's tests only.

Follows pyhailort 4.23.0 from hailo-ai/hailort, branch `hailo8` (the 4.x line for Hailo-8/8L),
tag v4.23.0: the same top-level names as its hailo_platform/__init__.py and the same
`hailo_platform.pyhailort.pyhailort` / `hailo_platform.pyhailort._pyhailort` modules, for the
subset of the API edgeasr.asr.hailo uses. HEFs are stand-in HEFs (see standin_hef.py beside this
package): the "chip" runs the encoder's ONNX with onnxruntime, FLOAT32 buffers only.

It lives under tests/ and is importable only when tests put tests/hailo_standin on sys.path
(PYTHONPATH); the installed edgeasr package never sees it. Simulation knobs: see _pyhailort.
"""

import hailo_platform.pyhailort._pyhailort as _pyhailort
from hailo_platform.pyhailort.pyhailort import (
    HEF,
    AsyncInferJob,
    ConfigureParams,
    Device,
    FormatOrder,
    FormatType,
    HailoCommunicationClosedException,
    HailoRTException,
    HailoRTStreamAbortedByUser,
    HailoSchedulingAlgorithm,
    HailoStreamDirection,
    HailoStreamInterface,
    InferVStreams,
    InputVStreamParams,
    OutputVStreamParams,
    VDevice,
)

__version__ = _pyhailort.standin_version()
# As the real package does: the wheel's Python layer and its C extension must be one version.
if _pyhailort.__version__ != __version__:
    raise ImportError(
        f"_pyhailort version ({_pyhailort.__version__}) does not match pyhailort version ({__version__})"
    )

__all__ = [
    "HEF",
    "ConfigureParams",
    "FormatType",
    "FormatOrder",
    "HailoStreamInterface",
    "InputVStreamParams",
    "OutputVStreamParams",
    "InferVStreams",
    "HailoStreamDirection",
    "Device",
    "VDevice",
    "HailoRTException",
    "HailoSchedulingAlgorithm",
    "HailoRTStreamAbortedByUser",
    "AsyncInferJob",
    "HailoCommunicationClosedException",
]
