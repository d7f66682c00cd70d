"""How many KV blocks the pool gets: from a block count, a byte budget or a memory fraction.

Pure host-side arithmetic plus one memory probe; called by the model runner once, after
the weights are on the device and before the KV tensors are allocated. Precedence:

1. ``num_kv_blocks``: exactly that many blocks.
2. ``kv_cache_memory``: as many blocks as that many bytes hold.
3. ``kv_cache_fraction``: that fraction of the memory free right now. On CUDA it is
   ``torch.cuda.mem_get_info`` (free device memory once the weights are loaded, so the
   remainder is the headroom for activations, logits and the allocator). On CPU it is the
   memory available to this process: ``MemAvailable`` from ``/proc/meminfo`` (free plus
   reclaimable page cache), lowered to the cgroup's ``memory.max - memory.current`` when
   a container limit is set, or ``os.sysconf`` free pages where ``/proc`` is missing.
4. Nothing set: 90% of free memory on CUDA; a fixed 512 MiB on CPU, where the KV pool
   shares RAM with everything else on the machine and a large default would surprise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

DEFAULT_CUDA_FRACTION = 0.9
DEFAULT_CPU_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class KVCachePlan:
    """The pool's size and where it came from.

    num_blocks: blocks in the pool (>= 1).
    block_bytes: bytes of one block across all layers (K and V).
    source: a human-readable account of the budget, for the start-up log.
    """

    num_blocks: int
    block_size: int
    block_bytes: int
    source: str

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def max_concurrency(self, max_model_len: int) -> float:
        """How many requests of ``max_model_len`` tokens fit in the pool at once."""
        return self.num_tokens / max_model_len

    def describe(self, max_model_len: int, device: str) -> str:
        """One log line: blocks, tokens, bytes, budget source and concurrency."""
        return (
            f"KV cache: {self.num_blocks} blocks x {self.block_size} tokens = "
            f"{self.num_tokens} tokens, {self.num_bytes / 2**20:.1f} MiB on {device} "
            f"({self.source}); max concurrency at max_model_len {max_model_len}: "
            f"{self.max_concurrency(max_model_len):.2f}x"
        )


def kv_block_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> int:
    """Bytes one KV block takes across all layers (K and V)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * elem


def plan_kv_cache(
    *,
    block_bytes: int,
    block_size: int,
    device: torch.device,
    num_blocks: int | None = None,
    memory_bytes: int | None = None,
    fraction: float | None = None,
) -> KVCachePlan:
    """Size the pool (see the module docstring); raises ValueError if no block fits."""
    if block_bytes < 1 or block_size < 1:
        raise ValueError("block_bytes and block_size must be >= 1")
    if memory_bytes is not None and fraction is not None:
        raise ValueError("set either the KV cache memory budget or the fraction, not both")
    if num_blocks is not None:
        n, source = num_blocks, "num_kv_blocks"
    else:
        if memory_bytes is not None:
            budget, source = memory_bytes, f"budget {_gib(memory_bytes)}"
        else:
            if fraction is None and device.type != "cuda":
                budget, source = DEFAULT_CPU_BYTES, f"default CPU budget {_gib(DEFAULT_CPU_BYTES)}"
            else:
                frac = DEFAULT_CUDA_FRACTION if fraction is None else fraction
                if not 0.0 < frac <= 1.0:
                    raise ValueError(f"the KV cache fraction must be in (0, 1], got {frac}")
                free = free_memory_bytes(device)
                budget = int(frac * free)
                source = f"{frac:g} of {_gib(free)} free"
        n = budget // block_bytes
    if n < 1:
        raise ValueError(
            f"the KV cache holds no block of {block_bytes} bytes ({source}): raise the KV "
            "cache memory, its fraction, or num_kv_blocks"
        )
    return KVCachePlan(n, block_size, block_bytes, source)


def free_memory_bytes(device: torch.device) -> int:
    """Memory a KV pool on ``device`` could take right now (see the module docstring)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return available_host_memory()


def available_host_memory() -> int:
    """Bytes of RAM this process may still use: MemAvailable, capped by a cgroup limit."""
    available = _meminfo_available()
    if available is None:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    room = _cgroup_room()
    return available if room is None else min(available, room)


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the file says kB, meaning KiB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> int | None:
    """``memory.max - memory.current`` of this process's cgroup (v2), None if unlimited."""
    base = Path("/sys/fs/cgroup")
    try:
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int((base / "memory.current").read_text().strip())
        return max(0, int(limit) - used)
    except (OSError, ValueError):
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
