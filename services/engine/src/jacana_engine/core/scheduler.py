"""Continuous batching: which sequences run in the next forward pass, and how many tokens.

State ownership (host-side Python only): the scheduler owns the ``waiting`` queue
(sequences without KV blocks, best first) and the ``running`` list (sequences that own KV
blocks, in admission order), plus each sequence's scheduling key. It asks the
:class:`BlockManager` for blocks (and cached prefixes) and advances
``Sequence.num_computed_tokens`` once a step has run; it never touches tensors.

Order. Every sequence gets a key when it is added; smaller keys are served first. With
aging (``priority_aging_s`` > 0) the key is ``arrival + priority * priority_aging_s``: a
request's effective priority is ``priority - waited / priority_aging_s``, and since every
request ages at the same rate that order never changes, so the key is fixed at arrival.
Equal priorities give first-come-first-served; a lower priority value (served first, as
in vLLM) is worth ``priority_aging_s`` seconds of head start, so a flood of favoured
requests delays another one by a bounded time and cannot starve it. With
``priority_aging_s == 0`` the key is ``(priority, arrival)``: strict priorities.

One step, under ``max_num_batched_tokens`` tokens and ``max_num_seqs`` sequences:
1. decodes of running sequences, best key first, so streams keep flowing;
2. unfinished prefills of running sequences (the next chunk of a long prompt);
3. waiting sequences in key order, each starting from its longest cached prefix and
   taking as much of the rest as the budget leaves (a chunk when it does not all fit).
   Admission stops at the first sequence that does not fit, so nothing overtakes it.

Embedding requests (``seq.pool`` set) are planned like any prompt but never sample:
their last chunk ends them (the engine finishes them after the step). Those whose pooling
reads every position (mean, cls) are admitted without a prefix-cache match, as are
requests that want prompt logprobs.

Preemption (by recompute). When a running sequence needs a block and none is free, the
running sequence with the worst key is preempted, even one already planned for this
step (its tokens leave the plan and their budget comes back): its blocks are freed (full
ones stay in the prefix cache and may be matched again at readmission) and it goes back
to ``waiting`` to be recomputed from its tokens; its sampled tokens and RNG state are
kept, so its output does not change. A step whose running sequences had to preempt admits
nothing new. Admission also preempts: when the best waiting sequence does not fit (blocks
or ``max_num_seqs``) and some running sequence has a worse key, that one makes room.
Sequences preempted in a step are not readmitted in the same step.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from jacana_engine.core.outputs import FinishReason
from jacana_engine.core.sequence import Sequence, SequenceStatus
from jacana_engine.kv_cache.block_manager import NO_MATCH, BlockManager, PrefixMatch

SortKey = tuple[float, ...]


@dataclass(frozen=True)
class ScheduledSequence:
    """A sequence's share of one step: tokens ``[start, start + num_new_tokens)``.

    samples: the chunk ends at the sequence's last known token, so this step yields the
        logits of its next token.
    num_draft_tokens: the chunk's last ``num_draft_tokens`` tokens are drafts
        (``seq.spec_token_ids``) after its last known token; such a chunk does not sample,
        it is verified (``spec/speculator.py``).
    pending_token: a one-token decode chunk whose token (position ``start``) is still being
        sampled by the step before, on the device; not yet in ``seq`` (see
        ``decode_overlap.py``). Its input row holds 0 until the device fills it in.
    """

    seq: Sequence
    start: int
    num_new_tokens: int
    samples: bool
    num_draft_tokens: int = 0
    pending_token: bool = False

    def known_token_ids(self) -> list[int]:
        """The chunk's input tokens as the host knows them (0 for a pending one)."""
        if self.pending_token:
            return [0]
        end = self.start + self.num_new_tokens - self.num_draft_tokens
        drafts = self.seq.spec_token_ids[: self.num_draft_tokens]  # a list or a tuple
        return [*self.seq.token_slice(self.start, end), *drafts]


@dataclass
class SchedulerOutput:
    """The plan of one step, in batch order (decodes first, then prefill chunks).

    preempted: sequences that lost their blocks this step (now waiting).
    """

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class _Step:
    """Working state of one ``schedule()`` call."""

    out: SchedulerOutput
    budget: int
    planned: dict[Sequence, ScheduledSequence] = field(default_factory=dict)


class Scheduler:
    """Priority (FCFS by default) admission with aging, decode-first batching, chunked
    prefill, prefix-cache-aware admission and recompute preemption.

    clock: monotonic seconds, for arrival times (tests pass a fake one).
    """

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        *,
        priority_aging_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if not priority_aging_s >= 0:
            raise ValueError(f"priority_aging_s must be >= 0, got {priority_aging_s}")
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        # Every running sequence must be able to decode in the same step, so the batch
        # can hold at most as many sequences as the token budget has tokens.
        self.max_num_seqs = min(max_num_seqs, max_num_batched_tokens)
        self.priority_aging_s = priority_aging_s
        self._clock = clock
        self._arrivals = itertools.count()
        self.waiting: list[Sequence] = []  # sorted by key, best first
        self.running: list[Sequence] = []  # admission order
        self._keys: dict[Sequence, SortKey] = {}
        self._by_id: dict[str, Sequence] = {}
        self.num_preemptions_total = 0

    # ---- queues -------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def get(self, request_id: str) -> Sequence | None:
        """The unfinished sequence with this id, if any."""
        return self._by_id.get(request_id)

    def key(self, seq: Sequence) -> SortKey:
        """``seq``'s scheduling key (smaller is served first); see the module docstring."""
        return self._keys[seq]

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence by its priority and arrival. Its id must be unused."""
        if seq.request_id in self._by_id:
            raise ValueError(f"request {seq.request_id!r} is already queued or running")
        now = self._clock()
        order = next(self._arrivals)
        if self.priority_aging_s > 0:
            self._keys[seq] = (now + seq.priority * self.priority_aging_s, order)
        else:
            self._keys[seq] = (seq.priority, now, order)
        seq.status = SequenceStatus.WAITING
        self._enqueue(seq)
        self._by_id[seq.request_id] = seq

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Retire a sequence: free its blocks and drop it from whichever queue holds it."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            return
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        del self._by_id[seq.request_id]
        del self._keys[seq]

    def abort(self, request_id: str) -> Sequence | None:
        """Finish ``request_id`` with ABORT; returns it, or None if it is not unfinished."""
        seq = self._by_id.get(request_id)
        if seq is not None:
            self.finish(seq, FinishReason.ABORT)
        return seq

    # ---- one step -----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Plan the next step and reserve its KV slots. Empty when nothing can run."""
        step = _Step(SchedulerOutput(), self.max_num_batched_tokens)
        key = self._keys.__getitem__
        decodes = sorted((s for s in self.running if s.num_uncomputed_tokens == 1), key=key)
        prefills = sorted((s for s in self.running if s.num_uncomputed_tokens > 1), key=key)
        for seq in decodes + prefills:
            if step.budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this step
                continue
            drafts = _num_drafts(seq, step.budget)
            n = min(seq.num_uncomputed_tokens + drafts, step.budget)
            if self._reserve(seq, n, step):
                self._plan(step, seq, n, drafts)
        if not step.out.preempted:
            self._admit(step)
        return step.out

    def update(self, scheduled: Iterable[ScheduledSequence]) -> None:
        """Record that a step's tokens now have their K/V in the cache, and offer the
        blocks they filled to the prefix cache."""
        for s in scheduled:
            if s.seq.status is SequenceStatus.RUNNING:
                # Drafts do not count until verified (the speculator advances past them).
                s.seq.num_computed_tokens = s.start + s.num_new_tokens - s.num_draft_tokens
                self.block_manager.commit(s.seq)

    # ---- helpers ------------------------------------------------------------------------

    def _admit(self, step: _Step) -> None:
        """Move waiting sequences into the step, best key first, while they fit."""
        bm = self.block_manager
        while self.waiting and step.budget > 0:
            seq = self.waiting[0]
            if seq in step.out.preempted:
                break
            match = NO_MATCH if _needs_every_position(seq) else bm.match_prefix(seq)
            n = min(seq.num_tokens - match.num_tokens, step.budget)
            if len(self.running) < self.max_num_seqs and bm.can_allocate(seq, n, match):
                self._start(seq, n, match, step)
                continue
            victim = self._worst_running()
            if victim is None or self._keys[victim] <= self._keys[seq]:
                break
            if not self._room_after_preempting_worse(seq, n, match):
                break  # preempting could not make it fit: keep the others' work
            self._preempt(victim, step)

    def _room_after_preempting_worse(self, seq: Sequence, n: int, match: PrefixMatch) -> bool:
        """Whether preempting every running sequence with a worse key than ``seq`` would
        let it start (counting only blocks that those sequences alone hold)."""
        worse = [r for r in self.running if self._keys[r] > self._keys[seq]]
        if len(self.running) - len(worse) >= self.max_num_seqs:
            return False
        bm = self.block_manager
        freed = {b for r in worse for b in r.block_table if bm.blocks[b].ref_count == 1}
        freed -= set(match.block_ids)  # those are counted as in use by ``seq`` already
        return bm.can_allocate(seq, n, match, extra_free=len(freed))

    def _start(self, seq: Sequence, n: int, match: PrefixMatch, step: _Step) -> None:
        self.waiting.pop(0)
        self.block_manager.allocate(seq, n, match)
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = match.num_tokens
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self._plan(step, seq, n)

    def _plan(self, step: _Step, seq: Sequence, n: int, num_drafts: int = 0) -> None:
        start = seq.num_computed_tokens
        # An embedding request ends with its prompt: it is pooled, never sampled.
        samples = num_drafts == 0 and start + n == seq.num_tokens and not seq.is_embedding
        scheduled = ScheduledSequence(seq, start, n, samples, num_drafts)
        step.out.scheduled.append(scheduled)
        step.planned[seq] = scheduled
        step.budget -= n

    def _reserve(self, seq: Sequence, n: int, step: _Step) -> bool:
        """Allocate slots for ``n`` tokens of ``seq``, preempting the worst running
        sequences as needed. False if ``seq`` itself had to be preempted."""
        while not self.block_manager.can_allocate(seq, n):
            victim = self._worst_running()
            if victim is None:  # unreachable: seq itself is running
                return False
            self._preempt(victim, step)
            if victim is seq:
                return False
        self.block_manager.allocate(seq, n)
        return True

    def _worst_running(self) -> Sequence | None:
        return max(self.running, key=self._keys.__getitem__, default=None)

    def _preempt(self, seq: Sequence, step: _Step) -> None:
        planned = step.planned.pop(seq, None)
        if planned is not None:  # give its share of this step back
            step.out.scheduled.remove(planned)
            step.budget += planned.num_new_tokens
        self.running.remove(seq)
        self.block_manager.deallocate(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self._enqueue(seq)
        step.out.preempted.append(seq)
        self.num_preemptions_total += 1

    def _enqueue(self, seq: Sequence) -> None:
        bisect.insort(self.waiting, seq, key=self._keys.__getitem__)


def _num_drafts(seq: Sequence, budget: int) -> int:
    """Drafts to verify with a decode: all of them when the budget leaves room."""
    if seq.num_uncomputed_tokens != 1:
        return 0
    return max(0, min(len(seq.spec_token_ids), budget - 1))


def _needs_every_position(seq: Sequence) -> bool:
    """Prompt logprobs need the logits of every prompt position, and mean / first-token
    pooling the hidden states of every position, so no prefix may be skipped."""
    if seq.pool is not None and seq.pool.spec.pooling.needs_every_position:
        return True
    return getattr(seq.sampling_params, "prompt_logprobs", None) is not None
