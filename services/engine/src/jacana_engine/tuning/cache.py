"""On-disk memory of the decode-GEMM tuner's choices (``tuning/decode_gemm.py``).

Timing cuBLAS against every skinny-kernel candidate takes seconds at start-up (~5 s for
Qwen3-8B on an H200), and its answer depends only on the GPU, the software and the
shapes. A JSON file keeps each answer under a key made of all of those, so a restart on
the same machine reads it back instead; a new GPU, CUDA, torch, Triton or model shape
misses and is timed afresh, and so does a change to the kernel or the tuner (their
source is part of the key, so new candidates get their chance). An unreadable file
counts as empty and an unwritable one is skipped, each with a warning: the cache can
cost a start-up its speed, never its correctness. Writers on one host take turns under a
lock file beside it and merge, so engines starting together keep each other's entries.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from jacana_engine.kernels.skinny_gemm import SkinnyConfig

log = logging.getLogger(__name__)


def device_fingerprint(device: torch.device) -> list[str]:
    """What a timing depends on besides the shape: the GPU and the software around it."""
    import triton

    versions = [torch.__version__, triton.__version__, str(torch.version.cuda)]
    if device.type != "cuda":
        return [device.type, *versions]
    props = torch.cuda.get_device_properties(device)
    return [props.name, f"sm{props.major}{props.minor}", str(props.total_memory), *versions]


@functools.cache
def code_fingerprint() -> str:
    """A digest of the skinny kernels' source (every module of the package) and the
    tuners', which decide what is timed and how."""
    from jacana_engine.kernels import skinny_gemm
    from jacana_engine.tuning import decode_gemm, graph_picks

    digest = hashlib.sha256()
    kernels = sorted(Path(skinny_gemm.__file__).parent.glob("*.py"))
    for path in [*kernels, Path(decode_gemm.__file__), Path(graph_picks.__file__)]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class TuningCache:
    """``get(key) -> {rows: SkinnyConfig} | None`` and ``put(key, choice)``, kept in the
    JSON file ``path`` (created with its folder on the first ``put``)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path).expanduser()
        self._entries: dict[str, dict[str, dict]] | None = None

    @staticmethod
    def key(kind: str, weight: torch.Tensor, rows: list[int], **variant: object) -> str:
        """The key of one tuning: ``kind`` (what was timed), the device and code
        fingerprints, the weight's shape and dtype, the row counts tried and the tuner's
        options (``variant``)."""
        parts = [kind, *device_fingerprint(weight.device), code_fingerprint()]
        parts += [list(weight.shape), str(weight.dtype)]
        return json.dumps([*parts, sorted(rows), sorted(variant.items())])

    def get(self, key: str) -> dict[int, SkinnyConfig] | None:
        from jacana_engine.kernels.skinny_gemm import SkinnyConfig

        entry = self._load().get(key)
        if entry is None:
            return None
        try:
            return {int(m): SkinnyConfig(**cfg) for m, cfg in entry.items()}
        except TypeError:  # written by a version whose configs had other fields
            return None

    def put(self, key: str, choice: dict[int, SkinnyConfig]) -> None:
        value = {str(m): dataclasses.asdict(cfg) for m, cfg in choice.items()}
        self._load()[key] = value  # this process remembers it even if the file cannot
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Engines starting together on one host share the file: under an exclusive
            # lock, re-read what the others wrote, add this entry, and replace the file
            # whole (readers without the lock see the old file or the new, never half).
            with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self._entries = entries = {**self._entries, **self._read(), key: value}
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name)
                with os.fdopen(fd, "w") as f:
                    json.dump(entries, f, indent=1, sort_keys=True)
                os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("decode GEMM tuning cache %s not written: %s", self.path, exc)

    def _load(self) -> dict[str, dict[str, dict]]:
        """The entries this object holds, read from the file the first time."""
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def _read(self) -> dict[str, dict[str, dict]]:
        """The file's entries now; empty when it is missing or unreadable (with a warning)."""
        try:
            loaded = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("decode GEMM tuning cache %s unreadable, ignored: %s", self.path, exc)
            return {}
        return loaded if isinstance(loaded, dict) else {}
