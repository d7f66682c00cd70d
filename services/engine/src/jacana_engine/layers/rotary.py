"""Rotary position embedding (RoPE), HF "rotate half" layout.

The inverse frequencies are computed on the host in float32 exactly as HF does (so the
angles match bit for bit), then kept as a non-persistent buffer on the model's device.
cos/sin are computed per step from the token positions; no position table is cached, so
there is no length limit and nothing to resize.

Scaling variants are a registry keyed by HF's ``rope_type``; unknown types are rejected
by ``check_rope_scaling`` when the model config is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

InvFreqFn = Callable[[int, float, dict[str, Any]], torch.Tensor]


def _default_inv_freq(head_dim: int, theta: float, params: dict[str, Any]) -> torch.Tensor:
    # inv_freq: [head_dim // 2] float32 on the host
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta**exponents)


def _linear_inv_freq(head_dim: int, theta: float, params: dict[str, Any]) -> torch.Tensor:
    # Position interpolation: positions / factor, folded into the frequencies.
    return _default_inv_freq(head_dim, theta, params) / float(params["factor"])


def _llama3_inv_freq(head_dim: int, theta: float, params: dict[str, Any]) -> torch.Tensor:
    # Llama 3.1: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    inv_freq = _default_inv_freq(head_dim, theta, params)
    factor = float(params["factor"])
    low_freq_factor = float(params["low_freq_factor"])
    high_freq_factor = float(params["high_freq_factor"])
    old_context_len = params["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor

    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


# rope_type -> (inverse-frequency function, keys it requires)
ROPE_TYPES: dict[str, tuple[InvFreqFn, tuple[str, ...]]] = {
    "default": (_default_inv_freq, ()),
    "linear": (_linear_inv_freq, ("factor",)),
    "llama3": (
        _llama3_inv_freq,
        ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    ),
}


def rope_type_of(scaling: dict[str, Any] | None) -> str:
    """The HF rope type named by a ``rope_scaling`` dict (None means "default")."""
    if not scaling:
        return "default"
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def check_rope_scaling(scaling: dict[str, Any] | None) -> None:
    """Raise ``ValueError`` unless ``scaling`` names a supported rope type with its keys."""
    rope_type = rope_type_of(scaling)
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"rope_scaling type {rope_type!r} is not supported; supported: {sorted(ROPE_TYPES)}"
        )
    missing = [k for k in ROPE_TYPES[rope_type][1] if k not in (scaling or {})]
    if missing:
        raise ValueError(f"rope_scaling type {rope_type!r} lacks {missing}")


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2], float32, on the host."""
    check_rope_scaling(scaling)
    fn, _ = ROPE_TYPES[rope_type_of(scaling)]
    return fn(head_dim, theta, dict(scaling or {}))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    # x: [..., d] -> [-x2, x1]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, n_heads, head_dim]; cos, sin: [T, head_dim] in x's dtype."""
    cos = cos.unsqueeze(1)  # [T, 1, head_dim]
    sin = sin.unsqueeze(1)
    return (x * cos) + (rotate_half(x) * sin)


class RotaryEmbedding(nn.Module):
    """Turns positions into the cos/sin tables that ``apply_rotary`` consumes."""

    inv_freq: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        theta: float,
        scaling: dict[str, Any] | None,
        max_positions: int | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        self.scaling = dict(scaling) if scaling else None
        self.max_positions = max_positions
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta, scaling), persistent=False)
        self._cos_sin_cache: torch.Tensor | None = None

    def reset_buffers(self, device: torch.device | str) -> None:
        """Recompute ``inv_freq`` in float32 on ``device`` (after ``to_empty``/dtype casts)."""
        self.inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling).to(device)
        self._cos_sin_cache = None

    def cos_sin_cache(self) -> torch.Tensor:
        """[max_positions, head_dim] float32, ``cat(cos, sin)`` of HF's float32 angles for
        every position, on ``inv_freq``'s device; built on first use, then kept."""
        if self._cos_sin_cache is None:
            if self.max_positions is None:
                raise ValueError("this rotary embedding was built without max_positions")
            positions = torch.arange(self.max_positions, device=self.inv_freq.device).float()
            freqs = positions[:, None] * self.inv_freq.float()[None, :]
            self._cos_sin_cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
        return self._cos_sin_cache

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T] -> cos, sin: [T, head_dim] in `dtype`
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]  # [T, head_dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)
