"""RMS normalization, computed in float32 and cast back, in the same order as HF."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from jacana_engine.layers.linear import Linear
from jacana_engine.layers.ops import LayerOps, TorchOps

if TYPE_CHECKING:  # the kernel module imports Triton; the norm must not need it
    from jacana_engine.kernels.skinny_gemm import SkinnyConfig


# A split norm's producer runs one program for each thread of torch's reduction of a
# row (``kernels.skinny_gemm.stats_config``): below this many (more rows, wider rows)
# the producer's weight would stream through too few programs.
MIN_SPLIT_PROGRAMS = 128
# Every program of a split norm's consumer sums the producer's statistics again before
# its first product: on tiles of fewer weight rows (more programs) that costs more than
# the launch it saves (Qwen3-8B b1 on an H200, twenty-fifth run: with 2-row qkv and
# gate_up tiles the decode graph took 0.36 ms longer, with 8-row tiles it broke even).
MIN_SPLIT_CONSUMER_ROWS = 8
# Row counts at which a norm whose weight is in its consumer's runs inside the projections
# around it (``RMSNorm.between``): one, where it was measured (an H200, Qwen3-8B's chain of
# one-row picks: 3.404 against 3.452 ms); the tile kernel's several-row path is untimed.
FOLDED_NORM_ROWS = (1,)


def fold_norm_weight(weight: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] with an RMSNorm's ``norm_weight`` [K] multiplied into its columns
    (in float32, rounded once to weight's dtype): the weight a deferred norm with no
    weight of its own (``kernels.skinny_gemm.NormPrologue(None, eps, deferred=True)``)
    multiplies by, so ``rms_norm(x, norm_weight) @ weight.T`` is ``(x @ folded.T) /
    rms(x)`` up to that rounding."""
    if norm_weight.shape != (weight.shape[1],):
        shapes = f"{tuple(norm_weight.shape)} and {tuple(weight.shape)}"
        raise ValueError(f"norm weight and GEMM weight do not fit: {shapes}")
    return (weight.float() * norm_weight.float()[None, :]).to(weight.dtype)


class RMSNorm(nn.Module):
    """``y = weight * (x / sqrt(mean(x²) + eps))`` over the last dimension.

    The statistics and the scaling run in float32; the result is cast back to the input
    dtype *before* the multiplication by ``weight`` (HF Llama/Qwen order), so bf16 results
    round exactly like the reference. ``ops`` picks the implementation once, at build time.
    """

    # ``between`` splits this norm over the skinny kernels of its producer and consumer
    # where both run a row count there (set on CUDA from ``EngineConfig.split_norm``)
    split_between_gemms = False
    # the projection that reads this norm's output, where the model names one (a decoder
    # layer's QKV and gate/up): ``decode_gemm.fold_norm_weights`` multiplies the weight
    # into its columns and sets ``weight_in_consumer``, and ``between`` then runs no norm
    # at ``FOLDED_NORM_ROWS`` (the consumer scales its product by 1/rms instead)
    consumer: Linear | None = None
    weight_in_consumer = False

    def __init__(self, dim: int, eps: float, ops: LayerOps | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.ops = ops or TorchOps()

    def feeds(self, consumer: Linear) -> None:
        """Name the projection that reads this norm's output (``consumer``). Kept as a
        plain attribute, not a submodule: the layer stays where the model put it, under
        one name."""
        object.__setattr__(self, "consumer", consumer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, dim] -> [T, dim]
        return self.ops.rms_norm(x, self.weight, self.eps)

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual), both [T, dim]; may reuse the inputs' buffers."""
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)

    def then(
        self, linear: Linear, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(linear(norm(x + residual)), x + residual)``; without a residual
        ``(linear(norm(x)), x)``. Where ``linear`` runs x's row count with the norm folded
        into its kernel (``Linear.norm_configs``) that is one launch."""
        config = linear.norm_configs.get(x.shape[0])
        if config is not None:
            return linear.normed_forward(x, residual, self.weight, self.eps, config)
        if residual is None:
            return linear(self(x)), x
        h, residual = self.add_forward(x, residual)
        return linear(h), residual

    def between(
        self,
        producer: Linear,
        x: torch.Tensor,  # [T, producer.in] ([T, 2 * in] with ``gated``)
        residual: torch.Tensor,  # [T, dim]
        consumer: Linear | None,
        *,
        gated: bool = False,  # x is a gated MLP's gate_up (producer.gated_forward)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(consumer(norm(producer(x) + residual)), producer(x) + residual)``; without a
        consumer the normed rows themselves. With ``split_between_gemms``, where producer
        and consumer both run x's row count on the skinny kernel (the consumer on tiles of
        ``MIN_SPLIT_CONSUMER_ROWS`` weight rows or more) and torch's reduction of such
        rows has at least ``MIN_SPLIT_PROGRAMS`` threads, the producer's programs
        (one a thread) store the residual sum with their partial sums of squares and the
        consumer normalizes as it loads (``Linear.forward_with_stats``): no launch, no
        whole-row read, no last program, the norm kernel's bits. With
        ``weight_in_consumer``, at ``FOLDED_NORM_ROWS`` where both run on the skinny
        kernel, the producer adds the residual in its epilogue and the consumer scales
        its product by 1/rms of its input (``Linear.deferred_norm_forward``), before any
        split. Else, where the producer runs x's row count with the norm folded into the
        end of its kernel
        (``Linear.norm_tail_configs``), the norm costs no launch of its own; else the
        consumer may fold it in (``then``)."""
        folded = self._folded_configs(producer, consumer, x.shape[0])
        if folded is not None:
            residual = producer.forward_plus(x, residual, folded[0], gated=gated)
            return consumer.deferred_norm_forward(residual, self.eps, folded[1]), residual
        split = self._split_configs(producer, consumer, x.shape[0])
        if split is not None:
            stats = producer.forward_with_stats(x, residual, split[0], gated=gated)
            y, _ = consumer.normed_forward(
                residual, None, self.weight, self.eps, split[1], stats=stats
            )
            return y, residual
        config = producer.norm_tail_configs.get(x.shape[0])
        if config is not None:
            normed, residual = producer.forward_then_norm(
                x, residual, self.weight, self.eps, config, gated=gated
            )
            return (normed if consumer is None else consumer(normed)), residual
        y = producer.gated_forward(x, self.ops.silu_and_mul) if gated else producer(x)
        if consumer is None:
            return self.add_forward(y, residual)
        return self.then(consumer, y, residual)

    def _folded_configs(
        self, producer: Linear, consumer: Linear | None, rows: int
    ) -> tuple[SkinnyConfig, SkinnyConfig] | None:
        """(producer's, consumer's) skinny configs for ``rows`` where ``between`` runs
        this norm, its weight in the consumer's, inside the two projections; else None."""
        if not self.weight_in_consumer or consumer is not self.consumer:
            return None
        if rows not in FOLDED_NORM_ROWS or producer.bias is not None:
            return None
        first = producer.skinny_configs.get(rows)
        second = consumer.skinny_configs.get(rows)
        return None if first is None or second is None else (first, second)

    def _split_configs(
        self, producer: Linear, consumer: Linear | None, rows: int
    ) -> tuple[SkinnyConfig, SkinnyConfig] | None:
        """(producer's, consumer's) skinny configs for ``rows`` where ``between`` splits
        the norm over them, else None."""
        if not self.split_between_gemms or consumer is None or producer.bias is not None:
            return None
        first = producer.skinny_configs.get(rows)
        second = consumer.skinny_configs.get(rows)
        if first is None or second is None or second.block_n < MIN_SPLIT_CONSUMER_ROWS:
            return None
        if first.k_fold > 1 or second.k_fold > 1:  # the folded kernel folds no norm
            return None
        # only here: skinny configs mean Triton is there (the norm must not need it)
        from jacana_engine.kernels.skinny_gemm import stats_columns, stats_config

        if stats_columns(producer.out_features, rows) < MIN_SPLIT_PROGRAMS:
            return None
        first = stats_config(first, producer.out_features, rows)
        return None if first is None else (first, second)
