"""Errors users can act on, each with its own exit code (sysexits.h numbering).

Raise the most specific class where the problem is found; the CLI's one supervision
point prints `edgeasr: <message>` on one line and exits with `exit_code`.
"""

from __future__ import annotations


class EdgeAsrError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""

    exit_code = 1


class UsageError(EdgeAsrError):
    """Bad command-line arguments."""

    exit_code = 64  # EX_USAGE


class AudioError(EdgeAsrError):
    """An audio file or stream that cannot be decoded, or holds no usable audio."""

    exit_code = 65  # EX_DATAERR


class ModelError(EdgeAsrError):
    """A weights source or model bundle that is incomplete, corrupt or inconsistent."""

    exit_code = 65  # EX_DATAERR


class MissingInputError(EdgeAsrError):
    """A file or directory named by the user does not exist or cannot be read."""

    exit_code = 66  # EX_NOINPUT


class DeviceError(EdgeAsrError):
    """An audio device, the NPU or another piece of hardware is absent or busy."""

    exit_code = 69  # EX_UNAVAILABLE


class ToolMissingError(EdgeAsrError):
    """An optional SDK or tool (hailo_platform, the Hailo DFC, torch, ...) is not installed."""

    exit_code = 69  # EX_UNAVAILABLE


class PackageLoadError(EdgeAsrError):
    """An installed Python package that cannot be imported or used here: missing, corrupt, or
    built for another CPU or page size (`edgeasr self-test`)."""

    exit_code = 70  # EX_SOFTWARE


class OutputError(EdgeAsrError):
    """An output file or directory cannot be created or written."""

    exit_code = 73  # EX_CANTCREAT


class ConfigError(EdgeAsrError):
    """A configuration key with a bad value, or an unknown key; the message names the dotted key."""

    exit_code = 78  # EX_CONFIG


class LabNotInstalledError(EdgeAsrError):
    """A developer tool (`edgeasr bench`, `edgeasr models calibrate`, ...) asked of an installed
    product, which does not ship the lab (edgeasr/lab/) it lives in."""

    exit_code = 127  # no sysexits.h code says it: a shell's "command not found"


class Cancelled(Exception):
    """Work given up on purpose (a partial result overtaken by a final one, a speculation the
    speaker proved wrong). Not an error: nothing is reported."""
