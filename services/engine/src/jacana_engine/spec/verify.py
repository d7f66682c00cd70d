"""Verification of draft tokens against the target model: pure functions.

Both rules return the tokens a request gains this step: the accepted prefix of the draft
followed by one token from the target (the correction at the first rejection, or the
bonus token after the last draft when all are accepted). So a step always yields between
1 and k + 1 tokens, and the target's distribution is preserved:

- greedy: a draft token is accepted iff it equals the target's argmax at its position
  (token-exact with decoding one token at a time);
- sampling: the rejection sampling rule of Leviathan et al. / Chen et al. A draft token x
  drawn from q is accepted with probability min(1, p(x) / q(x)); at the first rejection
  the replacement is drawn from norm(max(0, p - q)). Model-free proposers draft
  deterministically (q is one-hot on x), which the ``draft_probs=None`` case handles:
  accept with probability p(x), else draw from p with x removed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def greedy_accept(target_argmax: Sequence[int], draft: Sequence[int]) -> list[int]:
    """target_argmax: k + 1 argmax ids (position j predicts draft j; the last is the
    bonus); draft: k ids. Returns the accepted drafts and the target's next token."""
    if len(target_argmax) != len(draft) + 1:
        raise ValueError(f"need {len(draft) + 1} target tokens, got {len(target_argmax)}")
    out: list[int] = []
    for j, tok in enumerate(draft):
        if target_argmax[j] != tok:
            break
        out.append(tok)
    out.append(int(target_argmax[len(out)]))
    return out


def _uniform(generator: torch.Generator | None, device: torch.device) -> float:
    dev = generator.device if generator is not None else device
    return float(torch.rand((), generator=generator, device=dev))


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    # probs: [V], non-negative, not necessarily normalized
    if generator is not None and generator.device != probs.device:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator))


def rejection_sample(
    target_probs: torch.Tensor,
    draft: Sequence[int],
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Speculative sampling for one request.

    target_probs: [k + 1, V] float, the target's sampling distribution at each position
        (after temperature and top-k/top-p/min-p), rows summing to 1.
    draft: k drafted ids.
    draft_probs: [k, V] the distribution each draft was drawn from; None means drafted
        deterministically (one-hot).
    generator: the request's RNG (its device is used for the draws).
    Returns 1..k+1 tokens whose joint law equals sampling the target token by token.
    """
    k = len(draft)
    if target_probs.shape[0] != k + 1:
        raise ValueError(f"need {k + 1} target rows, got {target_probs.shape[0]}")
    target_probs = target_probs.float()
    out: list[int] = []
    for j, tok in enumerate(draft):
        p = target_probs[j]  # [V]
        p_x = float(p[tok])
        q_x = 1.0 if draft_probs is None else float(draft_probs[j, tok])
        if q_x > 0.0 and _uniform(generator, p.device) * q_x < p_x:
            out.append(tok)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[tok] = 0.0
        else:
            residual = (p - draft_probs[j].float()).clamp_min_(0.0)
        # p == q leaves no residual mass, but then x is never rejected; guard anyway.
        out.append(_draw(residual if float(residual.sum()) > 0.0 else p, generator))
        return out
    out.append(_draw(target_probs[k], generator))
    return out
