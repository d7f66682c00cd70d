"""Top-k / top-p / min-p as one per-row logit threshold, computed with device torch ops.

The sampler keeps token j of row i iff ``logits[i, j] >= threshold[i]``. All three
filters keep an upper set of the row's ranking, so their intersection is one threshold:

- top-k: the k-th largest logit (ties with it are kept);
- top-p: over ``softmax(logits / T)`` renormalized to the top-k set, the smallest logit
  whose mass of strictly larger tokens is < top_p (so the kept set is the shortest
  prefix of the ranking holding >= top_p, ties at its edge kept);
- min-p: ``p_i >= min_p * p_max``, i.e. ``logit_i >= logit_max + T * log(min_p)``.

Thresholds live in raw-logit space so that the kernel compares the very values this
module sorted (no re-division by T that could round a boundary token out).

``FilterPlan`` carries what the host already knows from the request parameters (which
filters are on, the largest top-k), so the device work is sized without reading any
device tensor: nothing here syncs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FilterPlan:
    """Host-side shape of a batch's filtering work.

    active: some sampled row uses top-k, top-p or min-p; when False no threshold is
        computed at all.
    sort_width: how many of each row's largest logits the top-k/top-p pass must rank:
        0 = none (min-p only), the vocabulary size = a full sort, else the largest top_k
        (valid when every row with top_p < 1 also has 0 < top_k <= sort_width).
    """

    active: bool
    sort_width: int


def plan_filters(
    temperature: Sequence[float],
    top_k: Sequence[int],
    top_p: Sequence[float],
    min_p: Sequence[float],
    vocab_size: int,
) -> FilterPlan:
    """The cheapest plan that is exact for these per-row parameters (greedy rows need none)."""
    sampled = [i for i, t in enumerate(temperature) if t > 0.0]
    uses_k = [i for i in sampled if 0 < top_k[i] < vocab_size]
    uses_p = [i for i in sampled if top_p[i] < 1.0]
    uses_min_p = any(min_p[i] > 0.0 for i in sampled)
    if not (uses_k or uses_p or uses_min_p):
        return FilterPlan(active=False, sort_width=0)
    if any(not 0 < top_k[i] < vocab_size for i in uses_p):
        return FilterPlan(active=True, sort_width=vocab_size)
    width = max((top_k[i] for i in uses_k), default=0)
    return FilterPlan(active=True, sort_width=width)


def filter_thresholds(
    logits: torch.Tensor,  # [N, V] float32
    temperature: torch.Tensor,  # [N] float32
    top_k: torch.Tensor,  # [N] int; 0 (or >= V) = off
    top_p: torch.Tensor,  # [N] float32; 1 = off
    min_p: torch.Tensor,  # [N] float32; 0 = off
    sort_width: int,
) -> torch.Tensor:  # [N] float32 raw-logit thresholds, -inf = keep all
    """Per-row thresholds for ``plan.sort_width``; rows are independent of each other."""
    n, vocab = logits.shape
    neg_inf = torch.full((n,), float("-inf"), dtype=torch.float32, device=logits.device)
    temp = temperature.float().clamp_min(1e-6)  # greedy rows: thresholds unused
    threshold = neg_inf
    if sort_width > 0:
        width = min(sort_width, vocab)
        if width == vocab:
            ranked = logits.sort(dim=-1, descending=True).values  # [N, V]
        else:
            ranked = logits.topk(width, dim=-1, sorted=True).values  # [N, width]
        k = top_k.long()
        k_on = (k > 0) & (k < vocab)
        k = torch.where(k_on, k.clamp(max=width), width)
        kth = ranked.gather(1, (k - 1)[:, None])  # [N, 1]
        in_top_k = ranked >= kth  # [N, width]
        weights = torch.where(in_top_k, ((ranked - ranked[:, :1]) / temp[:, None]).exp(), 0.0)
        total = weights.sum(dim=-1, keepdim=True)
        mass_before = (weights.cumsum(dim=-1) - weights) / total  # [N, width]
        n_keep = ((mass_before < top_p[:, None]) & in_top_k).sum(dim=-1).clamp_min(1)
        top_p_edge = ranked.gather(1, (n_keep - 1)[:, None]).squeeze(1)
        threshold = torch.maximum(
            torch.where(k_on, kth.squeeze(1), neg_inf),
            torch.where(top_p < 1.0, top_p_edge, neg_inf),
        )
        row_max = ranked[:, 0]
    else:
        row_max = logits.max(dim=-1).values
    min_p_edge = row_max + temp * torch.log(min_p.float().clamp_min(1e-30))
    return torch.maximum(threshold, torch.where(min_p > 0.0, min_p_edge, neg_inf))
