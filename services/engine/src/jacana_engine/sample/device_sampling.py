"""The CUDA fast path of sampling: greedy and plain temperature/top-k/top-p/min-p draws
in one Triton kernel, with no host work beyond six small parameter copies.

The model runner uses it only on CUDA, for the rows whose logits nothing edits (no
penalties, bias or min_tokens: ``SamplingParams.edits_logits``, which counts every field
outside the draw, the stopping rules and the logprobs, so fields added later fall back to
the full ``Sampler``); the logprobs of its rows are read off the raw logits beside it
(``sampler.RawLogprobs``). ``supported`` (no logprobs either) is the speculator's test.
Randomness is Philox keyed by (request seed, output position): a request's draws do not
depend on its batch neighbours, but they differ from the ``Sampler``'s generator stream,
so a seeded request is reproducible per path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from jacana_engine.sample.params import SamplingParams
from jacana_engine.worker.host_to_device import to_device


def supported(params: Sequence[SamplingParams]) -> bool:
    """Whether every row asks for nothing beyond the kernel's draw: no logits edits
    (``SamplingParams.edits_logits``: bias, penalties, min_tokens, fields added later)
    and no logprobs."""
    return not any(p.edits_logits or p.reads_logprobs for p in params)


def request_seed(params: SamplingParams, generator: torch.Generator | None) -> int:
    """The Philox key of a request: its seed, else its generator's seed (drawn by the
    engine's reproducible source), else 0 (greedy rows draw nothing)."""
    if params.seed is not None:
        return params.seed % (2**63 - 1)
    if generator is not None:
        return generator.initial_seed() % (2**63 - 1)
    return 0


class DeviceSampler:
    """``sample(logits, params, generators, steps) -> token ids [N]`` on the logits' device."""

    def __init__(self, vocab_size: int) -> None:
        from jacana_engine.kernels import argmax, sampling, sampling_filters

        self._argmax = argmax.argmax_rows  # one launch, where torch's takes a block per row
        self._sample = sampling.sample
        self._plan = sampling_filters.plan_filters
        self.vocab_size = vocab_size

    def sample(
        self,
        logits: torch.Tensor,  # [N, V] float32
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        steps: Sequence[int],  # per row: tokens the request has generated so far
    ) -> torch.Tensor:  # [N] int64
        if all(p.greedy for p in params):
            return self._argmax(logits)
        device = logits.device
        temperature = [p.temperature for p in params]
        top_k = [p.top_k for p in params]
        top_p = [p.top_p for p in params]
        min_p = [p.min_p for p in params]
        seeds = [request_seed(p, g) for p, g in zip(params, generators, strict=True)]
        plan = self._plan(temperature, top_k, top_p, min_p, self.vocab_size)
        floats = to_device(torch.tensor([temperature, top_p, min_p], dtype=torch.float32), device)
        ints = to_device(torch.tensor([top_k, seeds, list(steps)], dtype=torch.int64), device)
        return self._sample(
            logits.float(),
            floats[0],
            ints[0],
            floats[1],
            floats[2],
            ints[1],
            ints[2],
            plan=plan,
        )
