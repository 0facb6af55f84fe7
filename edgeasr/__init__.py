"""edgeasr: on-device speech-to-text for a Raspberry Pi 5 with a Hailo-8 NPU."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("edgeasr")  # pyproject.toml's, as installed
except PackageNotFoundError:  # a source tree run without installing it: no version to report
    __version__ = "0+unknown"
