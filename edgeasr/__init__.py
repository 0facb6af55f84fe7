"""edgeasr: on-device speech-to-text for a Raspberry Pi 5 with a Hailo-8 NPU."""

__version__ = "0.6.0"
