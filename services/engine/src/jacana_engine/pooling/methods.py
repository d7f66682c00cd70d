"""Pooling the final hidden states of an embedding request into one vector.

An embedding request is a prompt that only runs prefill: its chunks go through the same
forward passes as everyone else's, and after each step :func:`pool_step` folds the rows
of the chunk that the pooling method reads into the request's :class:`PoolState`. The
hidden states are the model's output after its final norm (no ``lm_head``).

State ownership: each embedding :class:`~jacana_engine.core.sequence.Sequence` carries one
``PoolState`` (``seq.pool``); the model runner's step calls :func:`pool_step`, the only
writer, on the engine thread. The running sum / picked row lives on the model's device in
float32 until :meth:`PoolState.vector` finishes it.

Pooling methods sit behind one interface and a registry (``last``, ``mean``, ``cls``).
A method that reads every position (mean, cls) must compute every position, so such a
request is never served from the prefix cache (``needs_every_position``); last-token
pooling reads only the final position, which a prefix-cache hit never covers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


class Pooling(ABC):
    """How one method reads the hidden states of a prompt ``[0, num_tokens)``."""

    name: str
    needs_every_position: bool

    @abstractmethod
    def positions(self, start: int, end: int, num_tokens: int) -> tuple[int, int]:
        """The span ``[lo, hi)`` of a chunk ``[start, end)`` this method reads (lo >= hi:
        nothing)."""

    @abstractmethod
    def fold(self, acc: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
        """Fold ``rows`` [n, hidden] (float32) into the accumulator [hidden]."""

    def finish(self, acc: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """The pooled vector [hidden] from the accumulator after the whole prompt."""
        return acc


class LastTokenPooling(Pooling):
    """The final position's hidden state (decoder embedding models, e.g. Qwen3-Embedding:
    causal attention lets only the last token see the whole input)."""

    name = "last"
    needs_every_position = False

    def positions(self, start: int, end: int, num_tokens: int) -> tuple[int, int]:
        return (num_tokens - 1, num_tokens) if end == num_tokens else (0, 0)

    def fold(self, acc: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
        return rows[-1].clone()


class MeanPooling(Pooling):
    """The average over every position; the sum runs across chunks."""

    name = "mean"
    needs_every_position = True

    def positions(self, start: int, end: int, num_tokens: int) -> tuple[int, int]:
        return start, end

    def fold(self, acc: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
        total = rows.sum(dim=0)
        return total if acc is None else acc + total

    def finish(self, acc: torch.Tensor, num_tokens: int) -> torch.Tensor:
        return acc / num_tokens


class FirstTokenPooling(Pooling):
    """The first position's hidden state (``cls``; for a decoder it has seen nothing but
    itself, so this is mainly for models trained that way, e.g. GGUF ``pooling_type`` 2)."""

    name = "cls"
    needs_every_position = True  # position 0 is always inside a cached prefix

    def positions(self, start: int, end: int, num_tokens: int) -> tuple[int, int]:
        return (0, 1) if start == 0 else (0, 0)

    def fold(self, acc: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
        return rows[0].clone()


POOLINGS: dict[str, Pooling] = {
    p.name: p for p in (LastTokenPooling(), MeanPooling(), FirstTokenPooling())
}


def get_pooling(name: str) -> Pooling:
    try:
        return POOLINGS[name]
    except KeyError:
        raise ValueError(f"unknown pooling {name!r}; known: {', '.join(POOLINGS)}") from None


@dataclass(frozen=True)
class PoolingSpec:
    """What an embedding engine does with the final hidden states.

    method: a registered pooling name (``last``, ``mean``, ``cls``).
    normalize: L2-normalize the pooled vector.
    """

    method: str
    normalize: bool = True

    @property
    def pooling(self) -> Pooling:
        return get_pooling(self.method)


@dataclass(eq=False)
class PoolState:
    """One embedding request's pooling progress.

    pooled_upto: prompt positions below this were folded already; a chunk recomputed
        after a preemption is not folded twice.
    acc: the accumulator [hidden] float32 on the model's device, None before any row.
    """

    spec: PoolingSpec
    pooled_upto: int = 0
    acc: torch.Tensor | None = field(default=None, repr=False)

    def vector(self, num_tokens: int) -> torch.Tensor:
        """The finished embedding [hidden] float32 (normalized when the spec says so)."""
        if self.acc is None:
            raise RuntimeError("no hidden state was pooled for this request")
        out = self.spec.pooling.finish(self.acc, num_tokens)
        return F.normalize(out, dim=-1) if self.spec.normalize else out


def pool_step(hidden: torch.Tensor, scheduled: Seq) -> None:
    """Fold this step's rows into each embedding request's :class:`PoolState`.

    hidden: [T, hidden] final hidden states of the step, chunks end to end in
        ``scheduled`` order (``ScheduledSequence`` items; others are skipped for free).
    """
    offset = 0  # row of the current chunk's first token in ``hidden``
    for s in scheduled:
        state: PoolState | None = s.seq.pool
        if state is not None:
            start, end = s.start, s.start + s.num_new_tokens
            method = state.spec.pooling
            lo, hi = method.positions(start, end, s.seq.num_prompt_tokens)
            lo = max(lo, start, state.pooled_upto)
            if lo < hi:
                rows = hidden[offset + lo - start : offset + hi - start].float()  # [n, hidden]
                state.acc = method.fold(state.acc, rows)
                state.pooled_upto = hi
        offset += s.num_new_tokens
