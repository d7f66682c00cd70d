"""Prompt logprobs: the logprob of every prompt token under the model, for requests that ask.

The one place the worker writes to a sequence: it appends to ``Sequence.prompt_logprobs``.
Such requests must compute every prompt position (a prompt served from the prefix cache
has no logits to read), which ``LLMEngine.add_request`` ensures with a unique cache salt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence as Seq

import torch

from jacana_engine.core.outputs import TokenLogprob
from jacana_engine.core.scheduler import ScheduledSequence
from jacana_engine.models.base import CausalLM
from jacana_engine.sample.sampler import token_logprobs

log = logging.getLogger(__name__)

PROMPT_LOGPROB_ROWS = 256  # prompt positions per logits slice: [256, V] float32 at a time


def collect_prompt_logprobs(
    model: CausalLM,
    hidden: torch.Tensor,
    scheduled: Seq[ScheduledSequence],
    query_start: list[int],
) -> None:
    """Append the logprobs of the prompt tokens this step's logits predict.

    The logits at position p predict token p + 1, so a chunk ``[start, end)`` covers
    prompt tokens ``start + 1 .. end`` (the prompt's own, not the first sampled one).
    Positions already collected (a chunk recomputed after a preemption) are skipped.
    """
    rows: list[int] = []  # rows of ``hidden`` [T, hidden]
    targets: list[int] = []
    owners: list[tuple[list[TokenLogprob], int]] = []  # (destination, num_top) per row
    for i, s in enumerate(scheduled):
        seq = s.seq
        num_top = seq.sampling_params.prompt_logprobs
        if num_top is None:
            continue
        collected = seq.prompt_logprobs
        if not collected:  # nothing predicts the first token
            collected.append(TokenLogprob(seq.prompt_token_ids[0], None))
        first = max(len(collected), s.start + 1)
        last = min(s.start + s.num_new_tokens, seq.num_prompt_tokens - 1)
        if first > last:
            continue
        if first != len(collected):  # positions never computed here (a cache hit)
            log.error(
                "%s: prompt logprobs lack positions %d..%d",
                seq.request_id,
                len(collected),
                first - 1,
            )
            collected.extend(
                TokenLogprob(t, None) for t in seq.prompt_token_ids[len(collected) : first]
            )
        for target in range(first, last + 1):
            rows.append(query_start[i] + target - 1 - s.start)
            targets.append(seq.prompt_token_ids[target])
            owners.append((collected, num_top))
    for lo in range(0, len(rows), PROMPT_LOGPROB_ROWS):
        hi = lo + PROMPT_LOGPROB_ROWS
        index = torch.tensor(rows[lo:hi], dtype=torch.int64).to(hidden.device)
        logits = model.compute_logits(hidden[index])  # [R, vocab]
        ids = torch.tensor(targets[lo:hi], dtype=torch.int64).to(hidden.device)
        found = token_logprobs(logits, ids, [k for _, k in owners[lo:hi]])
        for (collected, _), entry in zip(owners[lo:hi], found, strict=True):
            collected.append(entry)
