"""Batched token sampling: logits ``[N, V]`` + per-row parameters -> token ids ``[N]``.

Runs on the logits' device (GPU in production, CPU in tests); holds no state between steps.
The only state is each request's ``torch.Generator``, owned by the engine's request record
and created by ``RequestRng``.

Order of operations per row (as Hugging Face ``generate``): temperature, top-k, top-p,
min-p, then a draw from the renormalized distribution. Greedy rows (temperature 0) take the
argmax of the raw logits and draw no randomness.

Per-request seeds: a sampled row draws its randomness only from its own generator, one
exponential variate per vocabulary entry per step, indexed by token id, and picks
``argmax(p / E)`` (the exponential race, equivalent to sampling from ``p``). What a row
samples therefore depends only on its logits, its parameters and its generator's state,
never on which other requests share the batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from jacana_engine.sampling_params import SamplingParams

_MAX_SEED = 2**63 - 1


class RequestRng:
    """Makes one ``torch.Generator`` per request; the engine keeps it with the request.

    A request with a seed gets a generator seeded with it. A request without one gets a seed
    drawn from this engine-level source (itself seeded by ``seed``, or from the OS), so
    unseeded runs are still reproducible when the engine is.
    """

    def __init__(self, seed: int | None = None, device: torch.device | str = "cpu") -> None:
        self._source = random.Random(seed)
        self._device = torch.device(device)

    def generator(self, seed: int | None) -> torch.Generator:
        if seed is None:
            seed = self._source.randrange(_MAX_SEED)
        generator = torch.Generator(device=self._device)
        generator.manual_seed(seed % _MAX_SEED)
        return generator


@dataclass(frozen=True)
class SamplingBatch:
    """The per-row parameters of one step, as tensors on the logits' device.

    temperature, top_p, min_p: [N] float32; top_k: [N] int64 (0 = off, stored as V).
    greedy: [N] bool, and the same flags as a tuple for host-side loops (no device sync).
    generators: one per row; None draws from the sampler's shared generator.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    greedy: torch.Tensor
    greedy_rows: tuple[bool, ...]
    generators: tuple[torch.Generator | None, ...]
    all_greedy: bool
    needs_sort: bool  # some sampled row uses top-k or top-p
    needs_min_p: bool

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        vocab_size: int,
        device: torch.device | str = "cpu",
    ) -> SamplingBatch:
        if len(params) != len(generators):
            raise ValueError(f"{len(params)} params but {len(generators)} generators")
        greedy = [p.greedy for p in params]
        sampled = [p for p in params if not p.greedy]
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]

        def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

        return cls(
            # Greedy rows are never scaled; 1.0 keeps the batched division finite.
            temperature=tensor([1.0 if p.greedy else p.temperature for p in params], torch.float32),
            top_k=tensor(top_k, torch.int64),
            top_p=tensor([p.top_p for p in params], torch.float32),
            min_p=tensor([p.min_p for p in params], torch.float32),
            greedy=tensor(greedy, torch.bool),
            greedy_rows=tuple(greedy),
            generators=tuple(generators),
            all_greedy=all(greedy),
            needs_sort=any((0 < p.top_k < vocab_size) or p.top_p < 1.0 for p in sampled),
            needs_min_p=any(p.min_p > 0.0 for p in sampled),
        )


class Sampler:
    """``sampler(logits, params, generators) -> token ids [N]`` (int64, logits' device)."""

    def __init__(self, default_generator: torch.Generator | None = None) -> None:
        self._default_generator = default_generator

    @staticmethod
    def generator_device(device: torch.device | str) -> torch.device:
        """Where a request's generator must live: on the device the logits are on."""
        return torch.device(device)

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> torch.Tensor:
        generators = generators if generators is not None else [None] * len(params)
        batch = SamplingBatch.build(params, generators, logits.shape[-1], logits.device)
        return self.sample(logits, batch)

    def sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        # logits: [N, V]
        if batch.all_greedy:
            return logits.argmax(dim=-1)
        logits = logits.float()
        probs = sampling_probs(logits, batch)  # [N, V]
        noise = self._exponential_noise(probs, batch)  # [N, V]
        sampled = probs.div_(noise).argmax(dim=-1)  # [N]
        return torch.where(batch.greedy, logits.argmax(dim=-1), sampled)

    def _exponential_noise(self, probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        noise = torch.empty_like(probs)
        shared = []
        rows = zip(batch.generators, batch.greedy_rows, strict=True)
        for row, (generator, greedy) in enumerate(rows):
            if greedy:
                noise[row].fill_(1.0)  # greedy rows draw nothing
            elif generator is None:
                shared.append(row)
            else:
                noise[row].exponential_(generator=generator)
        if shared:
            index = torch.tensor(shared, device=probs.device)
            drawn = torch.empty((len(shared), probs.shape[-1]), device=probs.device)
            noise[index] = drawn.exponential_(generator=self._default_generator)
        # Exp(1) can round to 0; p / 0 must not become inf or nan.
        return noise.clamp_min_(torch.finfo(noise.dtype).tiny)


def sampling_probs(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """The distribution each sampled row draws from: [N, V] float32, rows sum to 1.

    Greedy rows come back as the plain softmax (the caller takes their argmax instead).
    """
    scaled = logits / batch.temperature.unsqueeze(1)  # [N, V]
    if batch.needs_sort:
        scaled = _mask_top_k_top_p(scaled, batch.top_k, batch.top_p)
    if batch.needs_min_p:
        scaled = _mask_min_p(scaled, batch.min_p)
    return torch.softmax(scaled, dim=-1)


def _mask_top_k_top_p(
    scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    # Both keep a prefix of the tokens sorted by logit; stable so ties cut the same way in
    # any batch.
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)  # [N, V]
    positions = torch.arange(scaled.shape[-1], device=scaled.device)  # [V]
    drop = positions.unsqueeze(0) >= top_k.unsqueeze(1)  # [N, V]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    # top-p over what top-k kept: keep a token while the mass before it is below top_p; the
    # most likely token is always kept.
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    # Rows with top_p == 1 keep everything even where rounding lets the mass reach 1 early.
    drop = (mass_before >= top_p.unsqueeze(1)) & (top_p < 1.0).unsqueeze(1)
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, order, sorted_logits)


def _mask_min_p(scaled: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    # p_i < min_p * p_max  <=>  logit_i < logit_max + log(min_p); renormalization after top-k
    # or top-p does not change the ratio.
    top = scaled.max(dim=-1, keepdim=True).values  # [N, 1]
    threshold = top + torch.log(min_p).unsqueeze(1)  # log(0) = -inf keeps everything
    return scaled.masked_fill(scaled < threshold, float("-inf"))


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """argmax per row: [N, V] -> [N]."""
    return logits.argmax(dim=-1)


def logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, num_top: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities under the model's raw distribution (before temperature/filters).

    Returns (chosen [N], top_ids [N, num_top], top_logprobs [N, num_top]).
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # [N, V]
    chosen = log_probs.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)
    top = log_probs.topk(num_top, dim=-1) if num_top > 0 else None
    if top is None:
        empty = torch.empty((logits.shape[0], 0), device=logits.device)
        return chosen, empty.long(), empty
    return chosen, top.indices, top.values
