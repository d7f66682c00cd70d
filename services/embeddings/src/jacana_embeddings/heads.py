"""Modules that follow pooling in a sentence-transformers pipeline (Dense, LayerNorm,
Normalize): one interface, a registry keyed by the sentence-transformers class name.

Each head maps ``[B, D_in] -> [B, D_out]`` and is built from its module folder
(``config.json`` + ``model.safetensors``, as sentence-transformers saves them). Weights
live on the compute device; heads hold no per-request state.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from jacana_embeddings.errors import ModelLoadError

# Activation class names as sentence-transformers writes them ("torch.nn.modules.activation.Tanh").
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Identity": lambda x: x,
    "Tanh": torch.tanh,
    "ReLU": F.relu,
    "GELU": F.gelu,
    "Sigmoid": torch.sigmoid,
    "SiLU": F.silu,
}


class Head(ABC):
    """``head(x [B, D_in]) -> [B, D_out]``."""

    #: Whether the output has unit L2 norm whatever the input.
    normalizes: bool = False

    @abstractmethod
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def out_dim(self, in_dim: int) -> int: ...

    def to(self, dtype: torch.dtype, device: torch.device) -> Head:
        return self


def _module_weights(module_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = module_dir / "model.safetensors"
    if not path.exists():
        raise ModelLoadError(f"{module_dir}: no model.safetensors (pytorch_model.bin is not read)")
    return load_file(str(path))


def _module_config(module_dir: Path) -> dict:
    try:
        return json.loads((module_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {module_dir / 'config.json'}: {exc}") from None


class NormalizeHead(Head):
    normalizes = True

    @classmethod
    def load(cls, module_dir: Path) -> NormalizeHead:
        return cls()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, p=2, dim=-1)

    def out_dim(self, in_dim: int) -> int:
        return in_dim


class DenseHead(Head):
    """``act(x W^T + b)``, plus the input (or its projection) when ``use_residual``."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str,
        residual: torch.Tensor | None,
        use_residual: bool,
    ) -> None:
        if activation not in _ACTIVATIONS:
            raise ModelLoadError(f"Dense: unsupported activation {activation!r}")
        self.weight, self.bias, self.residual = weight, bias, residual  # weight: [D_out, D_in]
        self.activation = activation
        self.use_residual = use_residual

    @classmethod
    def load(cls, module_dir: Path) -> DenseHead:
        cfg = _module_config(module_dir)
        w = _module_weights(module_dir)
        shape = (int(cfg["out_features"]), int(cfg["in_features"]))
        if "linear.weight" not in w or tuple(w["linear.weight"].shape) != shape:
            raise ModelLoadError(f"{module_dir}: linear.weight missing or not {shape}")
        activation = str(cfg.get("activation_function") or "Identity").rsplit(".", 1)[-1]
        return cls(
            weight=w["linear.weight"],
            bias=w.get("linear.bias") if cfg.get("bias", True) else None,
            activation=activation,
            residual=w.get("residual.weight"),
            use_residual=bool(cfg.get("use_residual", False)),
        )

    def to(self, dtype: torch.dtype, device: torch.device) -> DenseHead:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device=device, dtype=dtype)

        return DenseHead(
            move(self.weight),
            move(self.bias),
            self.activation,
            move(self.residual),
            self.use_residual,
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = _ACTIVATIONS[self.activation](F.linear(x, self.weight, self.bias))
        if self.use_residual:
            out = out + (x if self.residual is None else F.linear(x, self.residual))
        return out

    def out_dim(self, in_dim: int) -> int:
        return self.weight.shape[0]


class LayerNormHead(Head):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        self.weight, self.bias = weight, bias

    @classmethod
    def load(cls, module_dir: Path) -> LayerNormHead:
        w = _module_weights(module_dir)
        return cls(w["norm.weight"], w["norm.bias"])

    def to(self, dtype: torch.dtype, device: torch.device) -> LayerNormHead:
        return LayerNormHead(self.weight.to(device, dtype), self.bias.to(device, dtype))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias)

    def out_dim(self, in_dim: int) -> int:
        return in_dim


# sentence-transformers module class name (last part of modules.json "type") -> loader.
HEADS: dict[str, Callable[[Path], Head]] = {
    "Normalize": NormalizeHead.load,
    "Dense": DenseHead.load,
    "LayerNorm": LayerNormHead.load,
}
