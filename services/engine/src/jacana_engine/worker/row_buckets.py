"""Row buckets for eager steps: a step's token rows padded so cuBLAS meets few GEMM shapes.

Why: cuBLAS picks a kernel for a GEMM shape on the host the first time it meets that
shape, and an eager step (several prompts, or prompts beside decodes) runs its layer
GEMMs over as many rows as it has tokens, a count that changes nearly every step. On an
H200's host a call at a new row count takes 130-170 µs against 20-30 µs at one met
before (``research/first_use_gpu.py``), for each of a layer's four weight shapes: ~0.5 ms
a step on its critical path, for as long as new counts keep coming (up to
``max_num_batched_tokens`` of them, more than cuBLASLt's heuristics cache keeps). Padded
to a bucket, a step's rows are one of ~150 counts, all met at start-up by
:func:`warm_row_buckets`.

A padding row is token 0 at position 0 with KV slot -1: the KV write skips it and
``query_start_loc`` leaves it outside every sequence, so attention never reads or writes
it (as in ``prefill_graphs.py``); its hidden state is garbage and dropped. A GEMM's rows
are independent, but cuBLAS may pick another kernel for the padded count, so the real
rows may round differently than unpadded (as a prefill graph's may).

Buckets: every 16 rows up to 512 (GEMMs there stream their weights; extra rows cost
nearly nothing), then every 64 (tiles are 64-256 rows, so a padded count mostly fills
tiles the real one already started).
"""

from __future__ import annotations

import bisect
import dataclasses
import time

import torch

from jacana_engine.worker.attention_metadata import AttentionMetadata

_FINE_STEP, _FINE_UNTIL, _COARSE_STEP = 16, 512, 64


def row_buckets(max_tokens: int) -> list[int]:
    """Padded row counts for steps of up to ``max_tokens`` tokens, ascending; the last is
    ``max_tokens`` rounded up to its step."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    buckets = list(range(_FINE_STEP, min(max_tokens, _FINE_UNTIL) + _FINE_STEP, _FINE_STEP))
    if max_tokens > _FINE_UNTIL:
        top = -(-max_tokens // _COARSE_STEP) * _COARSE_STEP
        buckets += range(_FINE_UNTIL + _COARSE_STEP, top + 1, _COARSE_STEP)
    return buckets


def padded_rows(num_tokens: int, buckets: list[int]) -> int:
    """The smallest bucket that holds ``num_tokens``; ``num_tokens`` itself above them all."""
    i = bisect.bisect_left(buckets, num_tokens)
    return buckets[i] if i < len(buckets) else num_tokens


def pad_rows(
    input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, rows: int
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """(input_ids [rows], positions [rows], meta with slot_mapping [rows]) from a step's
    [T] host tensors: rows T.. are padding (token 0, position 0, slot -1). ``meta``'s
    sequences (``query_start_loc``, lengths, tables) are unchanged."""
    extra = rows - input_ids.shape[0]
    if extra <= 0:
        return input_ids, positions, meta
    zeros = torch.zeros(extra, dtype=input_ids.dtype)
    slots = torch.cat([meta.slot_mapping, torch.full((extra,), -1, dtype=torch.int64)])
    return (
        torch.cat([input_ids, zeros]),
        torch.cat([positions, zeros.to(positions.dtype)]),
        dataclasses.replace(meta, slot_mapping=slots),
    )


def warm_row_buckets(model: torch.nn.Module, buckets: list[int], logits_rows: int) -> float:
    """Run each distinct weight shape of ``model``'s cuBLAS layers (``Linear.backend_forward``)
    at every bucket, and the logits projection at 1 to ``logits_rows`` rows, so cuBLAS has
    chosen its kernel for every shape an eager step meets; returns the wall seconds."""
    from jacana_engine.layers.linear import Linear

    started = time.perf_counter()
    layers: dict[tuple[int, int], Linear] = {}
    for module in model.modules():
        if isinstance(module, Linear):
            layers.setdefault(tuple(module.weight.shape), module)
    weight = next(model.parameters())
    most = buckets[-1]
    with torch.inference_mode():
        # one contiguous input a width: the GEMM's leading dimension is part of its shape
        hidden = model.config.hidden_size
        inputs = {
            k: torch.zeros(most, k, dtype=weight.dtype, device=weight.device)
            for k in {k for _, k in layers} | {hidden}
        }
        for rows in buckets:
            for (_, k), layer in layers.items():
                layer.backend_forward(inputs[k][:rows])
        for rows in range(1, logits_rows + 1):  # a step's sampled rows
            model.compute_logits(inputs[hidden][:rows])
        if weight.device.type == "cuda":
            torch.cuda.synchronize(weight.device)
    return time.perf_counter() - started
