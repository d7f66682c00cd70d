"""The engine's side of speculative decoding: draft before a step, verify inside it,
commit after it.

Ownership (engine thread, host-side except the logits it reads):
- ``Sequence.spec_token_ids``: the drafts of the coming step, written by :meth:`propose`
  and read by the scheduler (which may trim them to its token budget through
  ``ScheduledSequence.num_draft_tokens``) and ``build_batch``;
- ``Sequence.spec_tracker``: the request's :class:`AcceptanceTracker` (dynamic k);
- the proposer and the per-proposer counters.

A step with drafts: the scheduler plans ``[last token, d_1 .. d_k]`` as one chunk of k + 1
tokens (like a prefill chunk, its K/V written at positions L-1 .. L+k-1). The runner
calls :meth:`verify` on the hidden states of those k + 1 positions; the engine then
appends the accepted tokens with :meth:`commit`. The scheduler has already set
``num_computed_tokens`` to L (the drafts do not count); ``commit`` moves it past the
accepted drafts only, so rejected drafts' K/V slots are simply overwritten by the next
step (rollback without copying). Whole blocks reserved past the accepted length go back
to the pool (``trim``), so between steps a sequence holds
``ceil(num_computed_tokens / block_size)`` blocks, as without speculation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq

import torch

from jacana_engine.core.outputs import RequestOutput, merge_outputs
from jacana_engine.core.scheduler import ScheduledSequence
from jacana_engine.core.sequence import Sequence, SequenceStatus
from jacana_engine.sample import device_sampling
from jacana_engine.sample.sampler import SamplingBatch, sampling_probs
from jacana_engine.spec.acceptance import AcceptanceTracker, ProposerStats
from jacana_engine.spec.config import SpeculativeConfig
from jacana_engine.spec.gate import Phase, SpeculationGate
from jacana_engine.spec.proposer import DraftRequest, Proposer
from jacana_engine.spec.registry import create_proposer
from jacana_engine.spec.verify import greedy_accept, rejection_sample

AppendToken = Callable[[Sequence, int], RequestOutput]
TrimBlocks = Callable[[Sequence, int], object]  # BlockManager.trim


def can_speculate(seq: Sequence) -> bool:
    """Whether drafts may be verified for ``seq`` at all: it did not opt out, and its
    sampling uses no logit processors or logprobs (those read the output so far, which
    drafts would change mid-step)."""
    return seq.speculative and device_sampling.supported([seq.sampling_params])


def draft_budget(seq: Sequence, k: int) -> int:
    """At most ``k`` drafts, and never more than the request may still produce: a
    verification yields up to k + 1 tokens, so k <= tokens left - 1."""
    return max(0, min(k, seq.max_tokens - seq.num_output_tokens - 1))


class Speculator:
    """Drafts with one proposer and verifies against the target's logits."""

    def __init__(self, config: SpeculativeConfig, proposer: Proposer | None = None) -> None:
        self.config = config
        self.proposer = proposer if proposer is not None else create_proposer(config)
        self._stats = ProposerStats()
        self._tracked: dict[str, Sequence] = {}
        self.gate = SpeculationGate() if config.dynamic_k else None

    def drafting_paused(self) -> bool:
        """Whether the gate keeps the coming steps from drafting (shut, or measuring plain
        steps): such steps may run overlapped (``decode_overlap.py``), fed to the gate
        through :meth:`observe` like any other."""
        return self.gate is not None and self.gate.phase in (Phase.SHUT, Phase.PLAIN)

    # ---- before the step ----------------------------------------------------------------

    def propose(self, running: Iterable[Sequence]) -> None:
        """Set ``spec_token_ids`` of every running sequence (empty when it does not draft)."""
        self.forget_finished()
        running = list(running)
        if self.gate is not None and not self.gate.drafts_allowed(
            seq.request_id for seq in running
        ):
            for seq in running:
                seq.spec_token_ids = []
            return
        wanted: list[tuple[Sequence, DraftRequest]] = []
        for seq in running:
            seq.spec_token_ids = []
            if seq.num_uncomputed_tokens != 1 or not can_speculate(seq):
                continue
            if seq.spec_tracker is None:
                seq.spec_tracker = AcceptanceTracker(
                    self.config.num_speculative_tokens, dynamic=self.config.dynamic_k
                )
                self._tracked[seq.request_id] = seq
            k = draft_budget(seq, seq.spec_tracker.next_k())
            if k > 0:
                tokens = seq.prompt_token_ids + seq.output_token_ids
                wanted.append((seq, DraftRequest(seq.request_id, tokens, seq.num_prompt_tokens, k)))
        if not wanted:
            return
        drafts = self.proposer.propose([r for _, r in wanted])
        for (seq, req), draft in zip(wanted, drafts, strict=True):
            seq.spec_token_ids = [int(t) for t in draft[: req.max_draft]]

    def forget_finished(self) -> None:
        """Tell the proposer that the tracked requests which left the batch are done (it
        frees their state, e.g. the draft model's KV blocks). Runs before each proposal;
        call it directly when no further step will (the last request finished)."""
        done = [s for s in self._tracked.values() if s.status is not SequenceStatus.RUNNING]
        for seq in done:
            if seq.status is SequenceStatus.WAITING:  # preempted: keeps its tracker
                continue
            del self._tracked[seq.request_id]
            seq.spec_token_ids = []
            self.proposer.finish(
                seq.request_id, seq.prompt_token_ids + seq.output_token_ids, seq.num_prompt_tokens
            )

    # ---- inside the step (model runner) ---------------------------------------------------

    def verify(
        self,
        hidden: torch.Tensor,
        scheduled: Seq[ScheduledSequence],
        query_start: Seq[int],
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
    ) -> list[list[int]]:
        """Tokens gained by each verifying chunk (``num_draft_tokens > 0``), in batch order.

        hidden: [T, hidden] of the whole step; query_start: [B + 1] chunk offsets.
        """
        chunks = [(i, s) for i, s in enumerate(scheduled) if s.num_draft_tokens > 0]
        if not chunks:
            return []
        rows: list[int] = []
        for i, s in chunks:  # the last known token's row, then one row per draft
            rows.extend(range(query_start[i], query_start[i] + s.num_draft_tokens + 1))
        index = torch.tensor(rows, dtype=torch.int64).to(hidden.device)
        logits = compute_logits(hidden[index])  # [R, vocab] float32
        argmax = logits.argmax(dim=-1).tolist()  # [R]
        out: list[list[int]] = []
        offset = 0
        for _, s in chunks:
            k = s.num_draft_tokens
            draft = s.seq.spec_token_ids[:k]
            params = s.seq.sampling_params
            if params.greedy:
                out.append(greedy_accept(argmax[offset : offset + k + 1], draft))
            else:
                out.append(self._sample(logits[offset : offset + k + 1], s.seq, draft))
            offset += k + 1
        return out

    @staticmethod
    def _sample(logits: torch.Tensor, seq: Sequence, draft: list[int]) -> list[int]:
        # logits: [k + 1, vocab] -> the very distribution the sampler would draw from
        n = logits.shape[0]
        batch = SamplingBatch.build(
            [seq.sampling_params] * n, [seq.generator] * n, logits.shape[-1], logits.device
        )
        probs = sampling_probs(logits.float(), batch)  # [k + 1, vocab]
        return rejection_sample(probs, draft, None, seq.generator)

    # ---- after the step (engine) ------------------------------------------------------------

    def observe(
        self, seconds: float, scheduled: Seq[ScheduledSequence], verified: Seq[list[int]]
    ) -> None:
        """Feed the gate one step's wall time (propose to commit). Only decode steps count:
        a prefill chunk's cost says nothing about what drafting costs."""
        if self.gate is None or not scheduled:
            return
        if any(s.num_new_tokens - s.num_draft_tokens != 1 for s in scheduled):
            return
        gained = sum(len(v) for v in verified) + sum(1 for s in scheduled if s.samples)
        self.gate.record(seconds, gained / len(scheduled), drafted=bool(verified))

    def commit(
        self,
        scheduled: Seq[ScheduledSequence],
        verified: Seq[list[int]],
        append: AppendToken,
        trim: TrimBlocks | None = None,
    ) -> list[RequestOutput]:
        """Append each verifying sequence's tokens (stopping where it finishes), move its
        computed length past the accepted drafts and ``trim`` its KV blocks to that
        length; one merged output per request."""
        chunks = [s for s in scheduled if s.num_draft_tokens > 0]
        outputs: list[RequestOutput] = []
        for s, tokens in zip(chunks, verified, strict=True):
            seq = s.seq
            accepted = len(tokens) - 1
            self._stats = self._stats.add(s.num_draft_tokens, accepted)
            if seq.spec_tracker is not None:
                seq.spec_tracker.record(s.num_draft_tokens, accepted)
            seq.spec_token_ids = []
            if seq.status is not SequenceStatus.RUNNING:  # finished or preempted meanwhile
                continue
            deltas = []
            for tok in tokens:
                deltas.append(append(seq, tok))
                if deltas[-1].finished:
                    break
            if not seq.is_finished:
                seq.num_computed_tokens += accepted
                if trim is not None:
                    trim(seq, seq.num_computed_tokens)
            outputs.append(merge_outputs(deltas))
        return outputs

    def stats(self) -> dict[str, ProposerStats]:
        return {self.proposer.name or self.config.proposer: self._stats}
