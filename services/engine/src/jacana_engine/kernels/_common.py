"""Small host-side helpers shared by the kernel launchers (no Triton code here)."""

from __future__ import annotations

import functools

import torch


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (and >= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


@functools.lru_cache(maxsize=8)
def num_sms(device: torch.device) -> int:
    """The device's streaming multiprocessors (8 off CUDA, for the interpreter's tests)."""
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def check_kv_cache(kv_cache: torch.Tensor, n_kv_heads: int, head_dim: int) -> None:
    """Raise ``ValueError`` unless ``kv_cache`` is [2, num_blocks, block_size, n_kv, head_dim]
    with a unit stride on head_dim (other strides are free)."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(
            "kv_cache must be [2, num_blocks, block_size, n_kv, head_dim], "
            f"got {tuple(kv_cache.shape)}"
        )
    if kv_cache.shape[3] != n_kv_heads or kv_cache.shape[4] != head_dim:
        raise ValueError(
            f"kv_cache heads/head_dim {tuple(kv_cache.shape[3:])} != ({n_kv_heads}, {head_dim})"
        )
    if kv_cache.stride(4) != 1:
        raise ValueError("kv_cache must have unit stride on head_dim")


def check_kv_write(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Raise ``ValueError`` unless k and v [T, n_kv, head_dim] (unit stride on head_dim),
    ``slot_mapping`` [T] and ``kv_cache`` fit one store of this step's K/V."""
    num_tokens, n_kv, head_dim = k.shape
    check_kv_cache(kv_cache, n_kv, head_dim)
    if v.shape != k.shape or slot_mapping.shape != (num_tokens,):
        raise ValueError(
            f"k {tuple(k.shape)}, v {tuple(v.shape)} and slot_mapping "
            f"{tuple(slot_mapping.shape)} disagree"
        )
    check_last_dim_contiguous("k", k)
    check_last_dim_contiguous("v", v)


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``t``'s last dimension has unit stride."""
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride on its last dimension")


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: exact IEEE for float32 operands (no silent TF32)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def token_ids_out(out: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor:
    """``out`` checked to be [n] int64 (``ValueError`` otherwise), or a new such tensor on
    ``device``: where a kernel writes one token id per row."""
    if out is None:
        return torch.empty(n, dtype=torch.int64, device=device)
    if out.shape != (n,) or out.dtype != torch.int64:
        raise ValueError(f"out must be [{n}] int64")
    return out
