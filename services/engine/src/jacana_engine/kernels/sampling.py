"""On-device token sampling: greedy, temperature, top-k, top-p and min-p, with no host sync.

Programs split each row's vocabulary into spans and stream the logits once; the
per-span winners are merged by an argmax over spans. Greedy rows (temperature 0) take the
first argmax. Sampled rows draw with the exponential race (Gumbel-max): the token is
``argmax_j logit_j / T - log(E_j)`` over the kept tokens, ``E_j ~ Exp(1)``, which picks j
with probability ``softmax(logits / T)_j`` renormalized to the kept set.

``E_j`` comes from Philox-4x32-10 keyed by the row's seed with counter
``(j, step_lo, step_hi, 0)``: a row's draws depend only on (seed, step, its logits), never
on its place in the batch or on the other rows. The engine advances ``step`` once per
generated token. ``reference.philox_reference`` reproduces the stream bit for bit.

Filtering (``sampling_filters``) reduces top-k/top-p/min-p to one logit threshold per
row with device torch ops (a sort or top-k when top-k/top-p are on), sized by a host
``FilterPlan`` so nothing is read back.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._common import token_ids_out
from jacana_engine.kernels.sampling_filters import FilterPlan, filter_thresholds

_BLOCK_V = 1024  # vocabulary entries per chunk
_VOCAB_SPLIT = 4096  # vocabulary entries per program


@triton.jit
def _exponential(bits):
    """Exp(1) sample from 32 uniform bits, accurate at both ends: E = -log(u) with
    u = 1 - v; for u near 1 it uses v directly (series for -log1p(-v)), so large noise
    values (small E) keep their resolution."""
    u = (bits.to(tl.float32) + 0.5) * 2.3283064365386963e-10  # (0, 1)
    v = ((~bits).to(tl.float32) + 0.5) * 2.3283064365386963e-10  # 1 - u, exact bits
    near_one = -tl.log(1.0 - v)
    series = v * (1.0 + v * (0.5 + v * (1.0 / 3.0)))
    return tl.where(u < 0.5, -tl.log(u), tl.where(v < 1e-2, series, near_one))


# seeds_ptr may point into a buffer at any row: its 16-byte alignment would select a
# binary of its own, compiled in the middle of serving (research/compile_stability_gpu.py).
@triton.jit(do_not_specialize=["seeds_ptr"])
def _sample_kernel(
    logits_ptr,
    threshold_ptr,
    temperature_ptr,
    seeds_ptr,
    steps_ptr,
    out_ptr,
    part_score_ptr,
    part_idx_ptr,
    stride_row,
    vocab,
    split_span,
    HAS_THRESHOLD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    # One program per (row, vocabulary split); each keeps its best (score, index).
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    lo = split * split_span
    hi = tl.minimum(lo + split_span, vocab)
    base = logits_ptr + row * stride_row
    temperature = tl.load(temperature_ptr + row)
    best = tl.full([], float("-inf"), dtype=tl.float32)
    best_idx = tl.full([], 0, dtype=tl.int32) + lo
    if temperature == 0.0:
        for start in range(lo, hi, BLOCK_V):
            j = start + tl.arange(0, BLOCK_V)
            x = tl.load(base + j, mask=j < hi, other=float("-inf"))
            chunk_best = tl.max(x, axis=0)
            chunk_idx = start + tl.argmax(x, axis=0)
            take = chunk_best > best  # strict: earlier chunks win ties
            best_idx = tl.where(take, chunk_idx, best_idx)
            best = tl.where(take, chunk_best, best)
    else:
        inv_t = 1.0 / temperature
        seed = tl.load(seeds_ptr + row)
        step = tl.load(steps_ptr + row).to(tl.int64)
        step_lo = (step & 0xFFFFFFFF).to(tl.uint32)
        step_hi = ((step >> 32) & 0xFFFFFFFF).to(tl.uint32)
        if HAS_THRESHOLD:  # noqa: SIM108 (a constexpr branch, not a value choice)
            threshold = tl.load(threshold_ptr + row)
        else:
            threshold = float("-inf")
        for start in range(lo, hi, BLOCK_V):
            j = start + tl.arange(0, BLOCK_V)
            in_row = j < hi
            x = tl.load(base + j, mask=in_row, other=float("-inf"))
            counter = j.to(tl.uint32)
            zero = counter * 0
            bits, _, _, _ = tl.philox(seed, counter, zero + step_lo, zero + step_hi, zero)
            score = x * inv_t - tl.log(_exponential(bits))
            score = tl.where(in_row & (x >= threshold), score, float("-inf"))
            chunk_best = tl.max(score, axis=0)
            chunk_idx = start + tl.argmax(score, axis=0)
            take = chunk_best > best
            best_idx = tl.where(take, chunk_idx, best_idx)
            best = tl.where(take, chunk_best, best)
    if NUM_SPLITS == 1:
        tl.store(out_ptr + row, best_idx.to(tl.int64))
    else:
        tl.store(part_score_ptr + row * NUM_SPLITS + split, best)
        tl.store(part_idx_ptr + row * NUM_SPLITS + split, best_idx.to(tl.int64))


def sample(
    logits: torch.Tensor,  # [N, V] float32
    temperature: torch.Tensor,  # [N] float32; 0 = greedy
    top_k: torch.Tensor,  # [N] int; 0 = off
    top_p: torch.Tensor,  # [N] float32; 1 = off
    min_p: torch.Tensor,  # [N] float32; 0 = off
    seeds: torch.Tensor,  # [N] int64, per request
    steps: torch.Tensor,  # [N] int64, per request, advanced once per generated token
    *,
    plan: FilterPlan | None = None,
    out: torch.Tensor | None = None,  # [N] int64
    vocab_split: int = _VOCAB_SPLIT,
) -> torch.Tensor:  # [N] int64 token ids, on logits' device
    """Draw one token per row (distribution: ``reference.sampling_probs_reference``).

    ``plan`` (from ``sampling_filters.plan_filters`` on the host copies of the
    parameters) lets rows without filters skip the sort; ``None`` is always exact but
    sorts every row. Same (seed, step, logits) -> same token, whatever the batch.
    ``vocab_split`` (a tuning knob, rounded up to the chunk width) is how many
    vocabulary entries one program scans; the per-split winners are merged with an
    argmax over splits, which keeps the first index on ties.
    """
    n, vocab = logits.shape
    if logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError("logits must be float32 with unit stride on the vocabulary")
    for name, t in (
        ("temperature", temperature),
        ("top_k", top_k),
        ("top_p", top_p),
        ("min_p", min_p),
        ("seeds", seeds),
        ("steps", steps),
    ):
        if t.shape != (n,):
            raise ValueError(f"{name} must be [{n}], got {tuple(t.shape)}")
    out = token_ids_out(out, n, logits.device)
    if n == 0:
        return out
    plan = plan or FilterPlan(active=True, sort_width=vocab)
    threshold = (
        filter_thresholds(logits, temperature, top_k, top_p, min_p, plan.sort_width)
        if plan.active
        else logits  # unused
    )
    block_v = min(_BLOCK_V, triton.next_power_of_2(min(vocab, max(1, vocab_split))))
    span = triton.cdiv(max(1, vocab_split), block_v) * block_v
    num_splits = triton.cdiv(vocab, span)
    if num_splits > 1:
        part_score = torch.empty(n, num_splits, dtype=torch.float32, device=logits.device)
        part_idx = torch.empty(n, num_splits, dtype=torch.int64, device=logits.device)
    else:
        part_score = part_idx = out  # unused
    _sample_kernel[(n, num_splits)](
        logits,
        threshold,
        temperature.float(),
        seeds.long(),
        steps.long(),
        out,
        part_score,
        part_idx,
        logits.stride(0),
        vocab,
        span,
        HAS_THRESHOLD=plan.active,
        NUM_SPLITS=num_splits,
        BLOCK_V=block_v,
        num_warps=4,
    )
    if num_splits > 1:
        winner = part_score.argmax(dim=1, keepdim=True)  # first split on ties
        out.copy_(part_idx.gather(1, winner).squeeze(1))
    return out
