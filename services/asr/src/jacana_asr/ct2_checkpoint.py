"""Reading a CTranslate2 model directory into torch tensors (host memory, no model code).

A CTranslate2 directory holds ``model.bin`` (the weights), ``config.json`` (model options such
as Whisper's suppressed token ids) and the vocabulary files. ``model.bin`` is little-endian:

    u32 binary_version
    str spec_name, u32 spec_revision                         (binary_version >= 2)
    u32 n_variables, then per variable:
        str name, u8 rank, u32 dims[rank],
        u8 dtype_id, u32 n_bytes                              (binary_version >= 4)
        u8 item_size, u32 n_items                             (binary_version <  4)
        bytes payload                                         (row-major)
    u32 n_aliases, then per alias: str alias, str target      (binary_version >= 3)

where ``str`` is a u16 length (counting a trailing NUL) followed by the bytes and the NUL.

Quantized weights (int8, int16) carry a companion ``<name>_scale``; the float weight is
``quantized / scale`` (int8: one scale per output row; int16: one scale for the tensor).
This module owns the parsing and that de-quantization; it knows nothing about Whisper's
layer structure beyond the set of spec names it accepts.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

MODEL_FILE = "model.bin"
CONFIG_FILE = "config.json"

# The binary versions this reader understands (CTranslate2 writes 6 today).
MIN_BINARY_VERSION = 2
MAX_BINARY_VERSION = 6

# Spec name -> newest revision whose layout this reader's users implement.
KNOWN_SPECS: Mapping[str, int] = {"WhisperSpec": 3}

# Type ids in CTranslate2's DataType enum order (include/ctranslate2/types.h).
_DTYPES_BY_ID: tuple[tuple[np.dtype | None, torch.dtype], ...] = (
    (np.dtype("<f4"), torch.float32),
    (np.dtype("i1"), torch.int8),
    (np.dtype("<i2"), torch.int16),
    (np.dtype("<i4"), torch.int32),
    (np.dtype("<f2"), torch.float16),
    (None, torch.bfloat16),  # numpy has no bfloat16: read as int16 bits, then reinterpret
)
# binary_version < 4 stored only the item size.
_TYPE_ID_BY_ITEM_SIZE = {4: 0, 2: 2, 1: 1}

_SCALE_SUFFIX = "_scale"


class CheckpointError(ValueError):
    """The directory or file is not a CTranslate2 model this reader can load."""


@dataclass(frozen=True)
class CT2Checkpoint:
    """One loaded CTranslate2 model directory (all tensors on CPU, in their stored dtype).

    variables: name -> tensor exactly as stored (an alias maps to the same tensor object as
    its target). Scalars are 0-dim tensors. config: the parsed config.json ({} if absent).
    """

    path: Path
    binary_version: int
    spec: str
    revision: int
    variables: Mapping[str, torch.Tensor]
    config: Mapping[str, Any] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.variables

    def scalar(self, name: str) -> int | float:
        """A stored scalar attribute (e.g. ``encoder/num_heads``) as a Python number."""
        tensor = self._get(name)
        if tensor.dim() != 0:
            raise CheckpointError(f"{name} is not a scalar: shape {tuple(tensor.shape)}")
        return tensor.item()

    def float_tensor(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A weight as floating point: float types are cast, quantized types de-quantized.

        int8 weights divide by their per-row ``<name>_scale`` ([rows] over dim 0, whatever
        the tensor's rank); int16 by a scalar scale.
        """
        tensor = self._get(name)
        if tensor.is_floating_point():
            return tensor.to(dtype)
        scale_name = name + _SCALE_SUFFIX
        if scale_name not in self.variables:
            raise CheckpointError(f"{name} is stored as {tensor.dtype} without {scale_name}")
        scale = self.variables[scale_name].to(torch.float32)
        # scale: [] or [rows]; broadcast over every dim after the first.
        scale = scale.reshape(scale.shape + (1,) * (tensor.dim() - scale.dim()))
        return (tensor.to(torch.float32) / scale).to(dtype)

    def _get(self, name: str) -> torch.Tensor:
        try:
            return self.variables[name]
        except KeyError:
            raise CheckpointError(f"{self.path}: no variable named {name!r}") from None


def load_checkpoint(path: str | Path) -> CT2Checkpoint:
    """Read a CTranslate2 model directory (or its model.bin) and its config.json.

    Raises CheckpointError when the file is missing, truncated, not in CTranslate2's
    format, or describes a spec/revision not in KNOWN_SPECS.
    """
    path = Path(path)
    directory = path.parent if path.is_file() else path
    model_file = directory / MODEL_FILE if path.is_dir() else path
    if not model_file.is_file():
        raise CheckpointError(f"{directory}: no {MODEL_FILE}; not a CTranslate2 model directory")
    with model_file.open("rb") as stream:
        binary_version, spec, revision, variables = _read_model_file(_Reader(stream, model_file))
    config_file = directory / CONFIG_FILE
    config: dict[str, Any] = {}
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{config_file}: not valid JSON ({exc})") from exc
    return CT2Checkpoint(directory, binary_version, spec, revision, variables, config)


class _Reader:
    """Bounds-checked little-endian reads; every short read becomes a CheckpointError."""

    def __init__(self, stream: BinaryIO, name: Path) -> None:
        self._stream = stream
        self.name = name

    def bytes(self, n: int) -> bytes:
        data = self._stream.read(n)
        if len(data) != n:
            raise CheckpointError(f"{self.name}: truncated (wanted {n} bytes, got {len(data)})")
        return data

    def u8(self) -> int:
        return self.bytes(1)[0]

    def u16(self) -> int:
        return struct.unpack("<H", self.bytes(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.bytes(4))[0]

    def string(self) -> str:
        length = self.u16()
        raw = self.bytes(length) if length else b""
        if length == 0 or raw[-1] != 0:
            raise CheckpointError(f"{self.name}: malformed string; not a CTranslate2 model")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(f"{self.name}: non-UTF-8 name; not a CTranslate2 model") from None

    def at_end(self) -> bool:
        return self._stream.read(1) == b""


def _read_model_file(
    reader: _Reader,
) -> tuple[int, str, int, dict[str, torch.Tensor]]:
    binary_version = reader.u32()
    if not MIN_BINARY_VERSION <= binary_version <= MAX_BINARY_VERSION:
        raise CheckpointError(
            f"{reader.name}: binary version {binary_version} is not one this reader knows "
            f"({MIN_BINARY_VERSION}..{MAX_BINARY_VERSION}); not a CTranslate2 model?"
        )
    spec = reader.string()
    revision = reader.u32()
    if spec not in KNOWN_SPECS:
        raise CheckpointError(
            f"{reader.name}: spec {spec!r} is not supported (known: {sorted(KNOWN_SPECS)})"
        )
    if not 1 <= revision <= KNOWN_SPECS[spec]:
        raise CheckpointError(
            f"{reader.name}: {spec} revision {revision} is newer than supported "
            f"({KNOWN_SPECS[spec]})"
        )
    variables: dict[str, torch.Tensor] = {}
    for _ in range(reader.u32()):
        name = reader.string()
        shape = tuple(reader.u32() for _ in range(reader.u8()))
        variables[name] = _read_payload(reader, binary_version, name, shape)
    if binary_version >= 3:
        for _ in range(reader.u32()):
            alias, target = reader.string(), reader.string()
            if target not in variables:
                raise CheckpointError(f"{reader.name}: alias {alias!r} -> unknown {target!r}")
            variables[alias] = variables[target]
            # CTranslate2 also aliases the target's quantization scale.
            if target + _SCALE_SUFFIX in variables:
                variables[alias + _SCALE_SUFFIX] = variables[target + _SCALE_SUFFIX]
    if not reader.at_end():
        raise CheckpointError(f"{reader.name}: trailing bytes after the alias table")
    return binary_version, spec, revision, variables


def _read_payload(
    reader: _Reader, binary_version: int, name: str, shape: tuple[int, ...]
) -> torch.Tensor:
    if binary_version >= 4:
        type_id = reader.u8()
        n_bytes = reader.u32()
    else:
        item_size = reader.u8()
        type_id = _TYPE_ID_BY_ITEM_SIZE.get(item_size, -1)
        n_bytes = reader.u32() * item_size
    if not 0 <= type_id < len(_DTYPES_BY_ID):
        raise CheckpointError(f"{reader.name}: {name!r} has unknown type id {type_id}")
    np_dtype, torch_dtype = _DTYPES_BY_ID[type_id]
    item_size = torch.empty((), dtype=torch_dtype).element_size()
    n_items = int(np.prod(shape, dtype=np.int64))
    if n_bytes != n_items * item_size:
        raise CheckpointError(
            f"{reader.name}: {name!r} payload is {n_bytes} bytes, shape {shape} needs "
            f"{n_items * item_size}"
        )
    raw = reader.bytes(n_bytes)
    if np_dtype is None:  # bfloat16: same bit width as int16
        bits = np.frombuffer(raw, dtype="<i2").copy()
        return torch.from_numpy(bits).view(torch.bfloat16).reshape(shape)
    array = np.frombuffer(raw, dtype=np_dtype).astype(np_dtype.newbyteorder("="))
    return torch.from_numpy(array).reshape(shape)
