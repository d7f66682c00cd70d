"""Per-request state inside the engine.

Who owns what (all host-side; only ``generator`` may live on the device):
- the engine creates a :class:`Sequence` per request and appends sampled tokens to it;
- the scheduler moves it between queues (``status``) and advances ``num_computed_tokens``;
- the block manager is the only writer of ``block_table``;
- the detokenizer handle is per request and fed by the engine.

One counter drives everything: ``num_computed_tokens`` is how many of ``token_ids`` have
their K/V in the cache. The tokens in ``[num_computed_tokens, num_tokens)`` still need a
forward pass, whatever they are: a prompt (prefill, maybe in chunks), the last sampled
token (decode), or prompt + outputs again after a preemption (recompute). A prefix-cache
hit at admission starts ``num_computed_tokens`` past the shared blocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from jacana_engine.core.outputs import FinishReason, TokenLogprob
from jacana_engine.sample.params import SamplingParams


class SequenceStatus(Enum):
    WAITING = "waiting"  # queued, no KV blocks (new or preempted)
    RUNNING = "running"  # admitted: owns KV blocks, scheduled every step it fits
    FINISHED = "finished"  # done or aborted; blocks released


@dataclass(eq=False)
class Sequence:
    """One request's tokens, progress and resources.

    request_id: caller's id, unique among unfinished requests.
    prompt_token_ids: the prompt, never modified.
    sampling_params: how to sample and stop.
    max_tokens: resolved output limit (``sampling_params.max_tokens`` or what the context
        leaves), always >= 1.
    generator: per-request RNG so a seeded request samples the same tokens whatever else
        is batched with it; None for greedy requests.
    detokenizer: incremental detokenizer of this request, None without a tokenizer.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int
    generator: torch.Generator | None = None
    detokenizer: Any = None
    arrival_time: float = field(default_factory=time.monotonic)

    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    # Bumped by the block manager whenever entries leave block_table (free, trim), so a
    # cached copy of the table (cuda_graphs.DecodeStaging) knows it can only be extended.
    block_table_epoch: int = 0
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    matched_stop: str | int | None = None
    # Logprobs of the prompt's tokens, appended by the model runner while the prompt is
    # computed (only with ``sampling_params.prompt_logprobs``); entry 0 has no logprob.
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)

    # Scheduling and prefix caching (see scheduler.py and kv_cache/block_manager.py).
    priority: int = 0  # lower is served first; waiting time ages it (scheduler)
    cache_salt: str | None = None  # requests share cached KV blocks only with equal salts
    block_hashes: list[int] = field(default_factory=list)  # content hash memo of full blocks
    num_committed_blocks: int = 0  # leading blocks of block_table already offered to the cache
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission

    # Speculative decoding (see spec/speculator.py, which owns these).
    speculative: bool = True  # False: this request never drafts (per-request opt-out)
    spec_token_ids: list[int] = field(default_factory=list)  # drafts for the coming step
    spec_tracker: Any = None  # its AcceptanceTracker (dynamic k), once it has drafted

    # Structured output (see structured_output.py): the request's place in its grammar
    # (a GuideState), when its sampling params carry a guide.
    guide: Any = None

    # Embedding requests (see pooling.py): prefill only, never sampled; the model runner
    # folds their hidden states into this PoolState, the engine finishes them after the
    # prompt's last chunk.
    pool: Any = None

    @property
    def is_embedding(self) -> bool:
        return self.pool is not None

    # ---- token views --------------------------------------------------------------------

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to run through the model before the next token can be sampled."""
        return self.num_tokens - self.num_computed_tokens

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens ``[start, end)`` of prompt + output."""
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt : end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n_prompt]

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
