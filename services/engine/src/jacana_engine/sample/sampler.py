"""Batched token sampling: logits ``[N, V]`` + per-row parameters -> token ids ``[N]``.

Runs on the logits' device (GPU in production, CPU in tests); holds no state between steps.
The only state is each request's ``torch.Generator``, kept with the request by the engine
(``RequestRng`` shows how to make them: the seed, or one drawn from an engine-level source).

Order of operations per row (:meth:`Sampler.forward`): raw logprobs are read first (the
model's own distribution), then the logits processors edit the logits (penalties, bias,
min_tokens; :mod:`jacana_engine.sample.logits_processors`), then as Hugging Face ``generate``:
temperature, top-k, top-p, min-p, and a draw from the renormalized distribution. Greedy
rows (temperature 0) take the argmax of the processed logits and draw no randomness.

Per-request seeds: a sampled row draws its randomness only from its own generator, one
exponential variate per vocabulary entry per step, indexed by token id, and picks
``argmax(p / E)`` (the exponential race, equivalent to sampling from ``p``). What a row
samples therefore depends only on its logits, its parameters and its generator's state,
never on which other requests share the batch. Rows given no generator draw from the
sampler's shared one instead, with no such guarantee.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from jacana_engine.core.outputs import TokenLogprob
from jacana_engine.sample.logits_processors import LogitsProcessors, PendingTokens, TokenHistory
from jacana_engine.sample.params import SamplingParams
from jacana_engine.worker.host_to_device import index_on, to_device

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

    temperature, top_p, min_p: [N] float32; top_k: [N] int64 (V when off).
    greedy: [N] bool, and the same flags as a tuple for host-side loops (no device sync).
    generators: one per row; None draws from the sampler's shared generator.
    nucleus_rows: sampled rows with top-p (a full sort; their top-k is applied there too).
    top_k_rows: sampled rows with top-k and no top-p (a partial ``topk``, no sort).
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    greedy: torch.Tensor
    greedy_rows: tuple[bool, ...]
    generators: tuple[torch.Generator | None, ...]
    nucleus_rows: torch.Tensor | None
    top_k_rows: torch.Tensor | None
    max_top_k: int
    needs_min_p: bool

    @property
    def all_greedy(self) -> bool:
        return all(self.greedy_rows)

    @property
    def filters(self) -> bool:
        """Some sampled row uses top-k, top-p or min-p."""
        return self.nucleus_rows is not None or self.top_k_rows is not None or self.needs_min_p

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
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        nucleus = [i for i, p in enumerate(params) if not p.greedy and p.top_p < 1.0]
        only_k = [
            i
            for i, p in enumerate(params)
            if not p.greedy and p.top_p >= 1.0 and top_k[i] < vocab_size
        ]

        # Two copies to the device in all, the tensors below views of them: floats [3, N]
        # (greedy rows are never scaled; 1.0 keeps the batched division finite); ints
        # [2N + len(nucleus) + len(only_k)]: top_k, greedy flags, then the two row lists.
        floats = torch.tensor(
            [
                [1.0 if p.greedy else p.temperature for p in params],
                [p.top_p for p in params],
                [p.min_p for p in params],
            ],
            dtype=torch.float32,
        )
        floats = to_device(floats, device)
        n = len(params)
        greedy = [int(p.greedy) for p in params]
        ints = to_device(torch.tensor(top_k + greedy + nucleus + only_k, dtype=torch.int64), device)
        lists = ints[2 * n :].split([len(nucleus), len(only_k)])
        return cls(
            temperature=floats[0],
            top_k=ints[:n],
            top_p=floats[1],
            min_p=floats[2],
            greedy=ints[n : 2 * n] != 0,
            greedy_rows=tuple(p.greedy for p in params),
            generators=tuple(generators),
            nucleus_rows=lists[0] if nucleus else None,
            top_k_rows=lists[1] if only_k else None,
            max_top_k=max((top_k[i] for i in only_k), default=0),
            needs_min_p=any(p.min_p > 0.0 and not p.greedy for p in params),
        )


@dataclass
class SamplerOutput:
    """What :meth:`Sampler.forward` picked: token_ids [N] int64 on the logits' device, and
    the logprobs of the rows that asked for them (on that device; None for no row)."""

    token_ids: torch.Tensor
    found: RowLogprobs | None = None

    @property
    def logprobs(self) -> list[TokenLogprob | None]:
        """Per row its :class:`TokenLogprob` (host) when the row asked, else None."""
        n = self.token_ids.shape[0]
        return self.found.by_row(n) if self.found is not None else [None] * n


class Sampler:
    """``sampler(logits, params, generators) -> token ids [N]`` (int64, logits' device);
    :meth:`forward` adds the logits processors and logprobs around it."""

    def __init__(
        self,
        default_generator: torch.Generator | None = None,
        processors: LogitsProcessors | None = None,
    ) -> None:
        self._default_generator = default_generator
        self.processors = processors

    def forward(
        self,
        logits: torch.Tensor,
        history: Sequence[TokenHistory],
        generators: Sequence[torch.Generator | None] | None = None,
        pending: PendingTokens | None = None,
    ) -> SamplerOutput:
        """Sample one token per row of ``logits`` [N, V] (edited in place by the processors);
        row i belongs to ``history[i]``, one output token behind where ``pending`` says so
        (an overlapped step's). Queues device work only: nothing waits for the device."""
        params = [h.sampling_params for h in history]
        taken = RawLogprobs.take(logits, params)  # before the edits
        if self.processors is not None and self.processors.needed(params):
            self.processors(logits, history, pending)
        token_ids = self(logits, params, generators)  # [N]
        return SamplerOutput(token_ids, taken.read(token_ids) if taken is not None else None)

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
        if all(p.greedy for p in params):  # an argmax: no parameter goes to the device
            return logits.argmax(dim=-1)
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
        if not any(batch.greedy_rows):
            return sampled
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
            index = index_on(shared, probs.device)
            drawn = torch.empty((len(shared), probs.shape[-1]), device=probs.device)
            noise[index] = drawn.exponential_(generator=self._default_generator)
        # Exp(1) can round to 0; p / 0 must not become inf or nan.
        return noise.clamp_min_(torch.finfo(noise.dtype).tiny)


def sampling_probs(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """The distribution each sampled row draws from: [N, V] float32, rows sum to 1.

    Every filter is a per-row floor on the scaled logits; tokens tied with the last kept one
    are kept too (as HF's top-k does), so the result never depends on how a sort orders ties.
    Greedy rows come back unfiltered (the caller takes their argmax instead).
    """
    scaled = logits / batch.temperature.unsqueeze(1)  # [N, V]
    if not batch.filters:
        return torch.softmax(scaled, dim=-1)
    floor = torch.full_like(batch.temperature, float("-inf"))  # [N]
    if batch.top_k_rows is not None:
        rows = batch.top_k_rows
        floor[rows] = _top_k_floor(scaled[rows], batch.top_k[rows], batch.max_top_k)
    if batch.nucleus_rows is not None:
        rows = batch.nucleus_rows
        floor[rows] = _nucleus_floor(scaled[rows], batch.top_k[rows], batch.top_p[rows])
    if batch.needs_min_p:
        # p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p); top-k and top-p
        # renormalize but never drop the top token, so the ratio is the same after them.
        # log(0) = -inf: rows without min-p keep everything.
        min_p_floor = scaled.max(dim=-1).values + torch.log(batch.min_p)
        floor = torch.maximum(floor, min_p_floor)
    return torch.softmax(scaled.masked_fill(scaled < floor.unsqueeze(1), float("-inf")), dim=-1)


def _top_k_floor(scaled: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    # scaled: [M, V]; top_k: [M] -> the k-th largest logit per row: [M]
    largest = scaled.topk(max_top_k, dim=-1).values  # [M, max_top_k], descending
    return largest.gather(1, (top_k - 1).unsqueeze(1)).squeeze(1)


def _nucleus_floor(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    # scaled: [M, V] -> the smallest logit top-k then top-p keep, per row: [M]
    ordered = scaled.sort(dim=-1, descending=True).values  # [M, V]
    kth = ordered.gather(1, (top_k - 1).unsqueeze(1))  # [M, 1]
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    # top-p over what top-k kept: keep tokens while the mass before them is below top_p
    # (a prefix, since that mass only grows); the most likely token always stays.
    probs = torch.softmax(ordered, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    kept = (mass_before < top_p.unsqueeze(1)).sum(dim=-1).clamp_min(1)  # [M]
    cutoff = ordered.gather(1, (kept - 1).unsqueeze(1))  # [M, 1]
    return torch.maximum(cutoff, kth).squeeze(1)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """argmax per row: [N, V] -> [N]."""
    return logits.argmax(dim=-1)


def logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, num_top: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities under the model's raw distribution (before temperature/filters).

    Returns (chosen [N], top_ids [N, num_top], top_logprobs [N, num_top]).
    """
    # float32 whatever the logits' dtype: a graph head's model-dtype logits give the
    # values their float32 copy gives (the serial step's)
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # [N, V]
    chosen = log_probs.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)
    top = log_probs.topk(num_top, dim=-1) if num_top > 0 else None
    if top is None:
        empty = torch.empty((logits.shape[0], 0), device=logits.device)
        return chosen, empty.long(), empty
    return chosen, top.indices, top.values


def token_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, num_top: Sequence[int]
) -> list[TokenLogprob]:
    """:func:`logprobs` of rows with different top counts, as host ``TokenLogprob`` entries.

    logits: [M, V] raw; token_ids: [M]; num_top: M counts (one ``topk`` of the largest).
    """
    return RowLogprobs.compute(logits, token_ids, list(range(len(num_top))), num_top).entries()


@dataclass
class RawLogprobs:
    """The rows of a step whose requests ask for logprobs, with their raw logits (a copy
    taken before anything edits them in place, where something may); ``read`` turns them
    into those rows' logprobs once the step's tokens are sampled.

    rows: those rows; index: the same rows as a device tensor [W], None when they are
    every row in order; raw: their logits [W, V]; num_top: each one's count of
    alternatives.
    """

    rows: list[int]
    index: torch.Tensor | None
    raw: torch.Tensor
    num_top: list[int]

    @classmethod
    def take(
        cls, logits: torch.Tensor, params: Sequence[SamplingParams], *, copy: bool = True
    ) -> RawLogprobs | None:
        """From ``logits`` [N, V], row i's request asking with ``params[i]``; None when no
        row asks. ``copy=False``: nothing edits ``logits`` before ``read`` has been
        queued, so rows that are every row read them as they are (no index, no copy)."""
        rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        if not rows:
            return None
        num_top = [params[i].logprobs for i in rows]
        if len(rows) == logits.shape[0]:
            return cls(rows, None, logits.clone() if copy else logits, num_top)
        index = index_on(rows, logits.device)
        return cls(rows, index, logits[index], num_top)

    def read(self, token_ids: torch.Tensor) -> RowLogprobs:
        """Those rows' logprobs, from the step's sampled tokens [N] (no host sync)."""
        ids = token_ids if self.index is None else token_ids[self.index]
        return RowLogprobs.compute(self.raw, ids, self.rows, self.num_top)


@dataclass
class RowLogprobs:
    """The logprobs of some rows of a step, computed where the logits are and read on the
    host later: an overlapped step's travel home with its tokens (``decode_overlap``).

    rows: the step's rows they belong to; num_top: each one's count of alternatives;
    values: (token ids [W] int64, their logprobs [W] float32, top ids [W, K] int64, top
    logprobs [W, K] float32), K the largest count.
    """

    rows: list[int]
    num_top: list[int]
    values: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

    @classmethod
    def compute(
        cls, raw: torch.Tensor, token_ids: torch.Tensor, rows: list[int], num_top: Sequence[int]
    ) -> RowLogprobs:
        """From those rows' raw logits [W, V] and sampled tokens [W] (no host sync). The
        values are tensors of their own: ``token_ids`` may be a buffer the next step
        rewrites (a decode graph's head) before their copy home has run."""
        counts = [k or 0 for k in num_top]
        chosen, top_ids, top_lp = logprobs(raw, token_ids, max(counts, default=0))
        ids = token_ids.to(torch.int64, copy=True)
        return cls(rows, counts, (ids, chosen, top_ids, top_lp))

    def to_host(self) -> RowLogprobs:
        """The same in pinned host memory, copied behind the work queued on the current
        stream without waiting for it (read them after an event recorded next). The
        device tensors may be dropped at once: each is marked in use by the current
        stream (``record_stream``), so the caching allocator hands its memory to no
        other tensor before the copy has run."""
        if self.values[0].device.type != "cuda":
            return self
        stream = torch.cuda.current_stream(self.values[0].device)
        host = tuple(torch.empty_like(t, device="cpu", pin_memory=True) for t in self.values)
        for h, t in zip(host, self.values, strict=True):
            h.copy_(t, non_blocking=True)
            t.record_stream(stream)
        return RowLogprobs(self.rows, self.num_top, host)

    def entries(self) -> list[TokenLogprob]:
        """One ``TokenLogprob`` per row, in ``rows``' order (waits for the values)."""
        tokens, chosen, top_ids, top_lp = (t.tolist() for t in self.values)
        return [
            TokenLogprob(token, lp, tuple(zip(top_ids[i][:k], top_lp[i][:k], strict=True)))
            for i, (token, lp, k) in enumerate(zip(tokens, chosen, self.num_top, strict=True))
        ]

    def moved_to(self, rows: Sequence[int]) -> RowLogprobs:
        """The same for a step whose row ``rows[r]`` this one's row ``r`` is."""
        return RowLogprobs([rows[r] for r in self.rows], self.num_top, self.values)

    def by_row(self, n: int) -> list[TokenLogprob | None]:
        """The entries placed at their rows of a step of ``n`` rows, None elsewhere."""
        return logprobs_by_row([self], n)


def logprobs_by_row(parts: Sequence[RowLogprobs], n: int) -> list[TokenLogprob | None]:
    """The entries of ``parts`` (rows of one step of ``n`` rows, none in two parts) placed
    at their rows, None elsewhere (waits for the values)."""
    out: list[TokenLogprob | None] = [None] * n
    for part in parts:
        for row, entry in zip(part.rows, part.entries(), strict=True):
            out[row] = entry
    return out
