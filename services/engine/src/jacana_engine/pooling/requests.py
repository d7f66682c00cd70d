"""Embedding requests inside the engine: how one is built, and how it ends.

An embedding request is a :class:`Sequence` with a :class:`PoolState` (``seq.pool``):
the scheduler plans its prompt like any prefill (chunked, batched with decodes and other
prefills) but never lets it sample; the model runner folds its final hidden states into
the pool state (:func:`jacana_engine.pooling.methods.pool_step`); once its last prompt token is
computed the engine finishes it with an :class:`EmbeddingOutput`. Host bookkeeping only;
the vectors cross to the host here, one copy per step for all requests that finished.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from jacana_engine.core.sequence import Sequence, SequenceStatus
from jacana_engine.pooling.methods import PoolingSpec, PoolState
from jacana_engine.sample.params import SamplingParams

MAX_EMBED_INPUTS = 2048  # inputs per Embed call (OpenAI's limit)


@dataclass
class EmbeddingOutput:
    """The one output of an embedding request.

    embedding: [hidden] float32 on the host, pooled (and normalized if the spec says).
    num_prompt_tokens: tokens embedded; num_cached_tokens: of those, served from the
        prefix cache (last-token pooling only).
    """

    request_id: str
    embedding: torch.Tensor
    num_prompt_tokens: int
    num_cached_tokens: int = 0
    finished: bool = True  # the stream protocol of AsyncEngine: one output, the last
    num_output_tokens: int = 0


def embedding_sequence(
    request_id: str, prompt: list[int], spec: PoolingSpec, *, priority: int = 0
) -> Sequence:
    """A prefill-only sequence that pools ``prompt``'s hidden states by ``spec``."""
    return Sequence(
        request_id,
        prompt,
        SamplingParams(),  # never read: the sequence does not sample
        max_tokens=1,
        priority=priority,
        speculative=False,
        pool=PoolState(spec),
    )


def finished_embeddings(scheduled: Iterable) -> list[Sequence]:
    """The embedding sequences of a step (``ScheduledSequence`` items, after the
    scheduler's update) whose whole prompt has now been computed."""
    return [
        s.seq
        for s in scheduled
        if s.seq.pool is not None
        and s.seq.status is SequenceStatus.RUNNING
        and s.seq.num_computed_tokens >= s.seq.num_prompt_tokens
    ]


def embedding_outputs(seqs: list[Sequence]) -> list[EmbeddingOutput]:
    """Finish the vectors of ``seqs`` (one device-to-host copy for all of them)."""
    if not seqs:
        return []
    vectors = torch.stack([seq.pool.vector(seq.num_prompt_tokens) for seq in seqs]).cpu()
    return [
        EmbeddingOutput(
            request_id=seq.request_id,
            embedding=vector,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
        )
        for seq, vector in zip(seqs, vectors, strict=True)
    ]
