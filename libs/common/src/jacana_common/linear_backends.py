"""Dense layers (``act(x W^T + b)``) behind one interface, with a registry of backends.

- ``torch``: ``F.linear`` then the activation; on CPU torch sends float32 GEMMs to MKL.
- ``onednn``: oneDNN's fused linear + activation (``torch.ops.mkldnn._linear_pointwise``,
  the op torch's own compiler emits for CPU). oneDNN picks its kernels from the CPU's
  instruction set, so on AVX-512 machines where MKL takes a narrower path its float32
  GEMMs are up to ~2x faster; the results agree with ``torch`` to float32 rounding.

:func:`select_linear_backend` resolves ``auto`` once at load time: ``onednn`` on CPU when
the op exists in this torch build and agrees with ``torch`` on a probe, ``torch``
otherwise (and always on CUDA). Backends hold no state; the weights stay ordinary
``nn.Linear`` parameters. Shared by the services that run torch models (the engine, the
embeddings service); it imports torch, so only they import it.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

# HF ``hidden_act`` names -> the activation as a torch function.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda x: x,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}

# The same activations as oneDNN post-ops: (attr, algorithm) of ``_linear_pointwise``.
_ONEDNN_POST_OPS: dict[str, tuple[str, str]] = {
    "identity": ("none", ""),
    "gelu": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
    "silu": ("swish", ""),
    "swish": ("swish", ""),
}


class LinearBackend(ABC):
    """``linear(x [N, in], weight [out, in], bias [out] | None, act) -> [N, out]``."""

    name: str

    @abstractmethod
    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str = "identity",
    ) -> torch.Tensor: ...


class TorchLinear(LinearBackend):
    name = "torch"

    def linear(self, x, weight, bias, activation="identity"):
        out = F.linear(x, weight, bias)
        return out if activation == "identity" else ACTIVATIONS[activation](out)


class OneDnnLinear(LinearBackend):
    """oneDNN's fused linear; 2-D inputs on CPU (the packed ``[T, H]`` rows)."""

    name = "onednn"

    def linear(self, x, weight, bias, activation="identity"):
        attr, algorithm = _ONEDNN_POST_OPS[activation]
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, attr, [], algorithm)

    @staticmethod
    def usable(dtype: torch.dtype) -> str | None:
        """None when this torch build runs the op and it agrees with ``torch``, else why not."""
        if not torch.backends.mkldnn.is_available():
            return "this torch build has no oneDNN"
        if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
            return "this torch build has no mkldnn._linear_pointwise"
        g = torch.Generator().manual_seed(0)
        x = torch.randn(5, 48, generator=g).to(dtype)  # [N, in]
        w = (torch.randn(40, 48, generator=g) / 7).to(dtype)  # [out, in]
        b = torch.randn(40, generator=g).to(dtype)
        tolerance = 1e-4 if dtype == torch.float32 else 5e-2
        try:
            with torch.inference_mode():
                for act in ("identity", "gelu"):
                    got = OneDnnLinear().linear(x, w, b, act).float()
                    want = TorchLinear().linear(x, w, b, act).float()
                    if not torch.allclose(got, want, atol=tolerance, rtol=tolerance):
                        return f"it disagrees with F.linear ({act})"
        except RuntimeError as exc:
            return f"it failed: {exc}"
        return None


LINEAR_BACKENDS: dict[str, type[LinearBackend]] = {
    TorchLinear.name: TorchLinear,
    OneDnnLinear.name: OneDnnLinear,
}


def select_linear_backend(name: str, device: torch.device, dtype: torch.dtype) -> LinearBackend:
    """The backend named ``name`` (``auto``, ``torch`` or ``onednn``) for ``device``.

    Raises ``ValueError`` for an unknown name, or when ``onednn`` is asked for explicitly
    and cannot run.
    """
    if name == "torch":
        return TorchLinear()
    if name not in ("auto", OneDnnLinear.name):
        raise ValueError(f"unknown linear backend {name!r}; known: auto, {list(LINEAR_BACKENDS)}")
    why_not = "it runs on CPU only" if device.type != "cpu" else OneDnnLinear.usable(dtype)
    if why_not is None:
        return OneDnnLinear()
    if name == OneDnnLinear.name:
        raise ValueError(f"linear backend 'onednn' is not usable: {why_not}")
    if device.type == "cpu":
        log.info("linear backend: torch (oneDNN not usable: %s)", why_not)
    return TorchLinear()
