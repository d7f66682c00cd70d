"""Read a GGUF file's header — metadata and tensor directory — without touching tensor data.

A single forward pass over the header with ``struct``; large arrays (the vocabulary)
decode in one go for numeric types and one string at a time otherwise, which is far
cheaper than building a full ``gguf.GGUFReader``. Used for the model config and by the
tokenizer.

Strings decode as UTF-8 with ``surrogateescape``: identical for valid UTF-8, lossless
(re-encodable with the same handler) for the rare vocabularies that are not.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32

# GGUF value type id -> (struct format, numpy dtype) for fixed-size scalars
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("B", "u1"),
    1: ("b", "i1"),
    2: ("H", "<u2"),
    3: ("h", "<i2"),
    4: ("I", "<u4"),
    5: ("i", "<i4"),
    6: ("f", "<f4"),
    7: ("?", "?"),
    10: ("Q", "<u8"),
    11: ("q", "<i8"),
    12: ("d", "<f8"),
}
_STRING = 8
_ARRAY = 9


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One entry of the tensor directory; ``shape`` in numpy (row-major) order."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class GGUFHeader:
    """Everything before the tensor data."""

    version: int
    metadata: dict[str, Any]
    tensors: list[GGUFTensorInfo]
    data_offset: int  # absolute file offset of the data section

    def tensor(self, name: str) -> GGUFTensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)


class _Cursor:
    """Little-endian reads from a buffer, advancing an offset."""

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type = self.scalar("I")
            count = self.scalar("Q")
            return self.array(item_type, count)
        if vtype not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {vtype} at byte {self.pos}")
        return self.scalar(_SCALARS[vtype][0])

    def array(self, item_type: int, count: int) -> list[Any]:
        if item_type in _SCALARS:
            dtype = np.dtype(_SCALARS[item_type][1])
            end = self.pos + count * dtype.itemsize
            values = np.frombuffer(self.buf[self.pos : end], dtype=dtype).tolist()
            self.pos = end
            return values
        return [self.value(item_type) for _ in range(count)]


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """Parse the header of a (little-endian, v2/v3) GGUF file."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        buf = memoryview(mm)
        try:
            return _parse(buf, str(path))
        finally:
            buf.release()


def _parse(buf: memoryview, path: str) -> GGUFHeader:
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file (bad magic)")
    cur = _Cursor(buf)
    cur.pos = 4
    version = cur.scalar("I")
    if version not in (2, 3):
        # a big-endian file reads as a huge version number
        raise ValueError(f"{path}: unsupported GGUF version {version} (need v2/v3 little-endian)")
    n_tensors = cur.scalar("Q")
    n_kv = cur.scalar("Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("I"))
    tensors = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.scalar("I")
        dims = [cur.scalar("Q") for _ in range(n_dims)]
        ggml_type = cur.scalar("I")
        offset = cur.scalar("Q")
        # GGUF lists dimensions innermost first; numpy order is the reverse
        tensors.append(GGUFTensorInfo(name, tuple(reversed(dims)), ggml_type, offset))
    alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
    data_offset = -(-cur.pos // alignment) * alignment
    return GGUFHeader(version, metadata, tensors, data_offset)


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """Decoded key/value metadata of a GGUF file (strings as ``str``, arrays as lists)."""
    return read_gguf_header(path).metadata
