"""Continuous batching: which sequences run in the next forward pass, and how many tokens.

State ownership (host-side Python only): the scheduler owns the ``waiting`` queue (FCFS,
sequences without KV blocks) and the ``running`` list (admission order, oldest first,
sequences that own KV blocks). It asks the :class:`BlockManager` for blocks and advances
``Sequence.num_computed_tokens`` once a step has run; it never touches tensors.

One step, under ``max_num_batched_tokens`` tokens and ``max_num_seqs`` sequences:
1. decodes of running sequences, oldest first, so streams keep flowing;
2. unfinished prefills of running sequences (the next chunk of a long prompt);
3. waiting sequences in arrival order, each with as much of its prompt as the budget
   leaves (a chunk when it does not all fit). Admission stops at the first sequence that
   does not fit, so nothing overtakes an older request.

When a running sequence needs a block and none is free, the most recently admitted
running sequence not yet scheduled this step is preempted: its blocks are freed and it
goes back to the front of ``waiting`` to be recomputed from its tokens later (its sampled
tokens and RNG state are kept, so the output does not change). A step that preempted
admits nothing new, so a victim is not readmitted just to be preempted again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from jacana_engine.kv_cache.block_manager import BlockManager
from jacana_engine.outputs import FinishReason
from jacana_engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class ScheduledSequence:
    """A sequence's share of one step: tokens ``[start, start + num_new_tokens)``.

    samples: the chunk ends at the sequence's last known token, so this step yields the
        logits of its next token.
    """

    seq: Sequence
    start: int
    num_new_tokens: int
    samples: bool


@dataclass
class SchedulerOutput:
    """The plan of one step, in batch order (decodes first, then prefill chunks)."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """FCFS admission, decode-first batching, recompute preemption."""

    def __init__(
        self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int
    ) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        # Every running sequence must be able to decode in the same step, so the batch
        # can hold at most as many sequences as the token budget has tokens.
        self.max_num_seqs = min(max_num_seqs, max_num_batched_tokens)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
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

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence behind every waiting one. Its id must be unused."""
        if seq.request_id in self._by_id:
            raise ValueError(f"request {seq.request_id!r} is already queued or running")
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
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

    def abort(self, request_id: str) -> Sequence | None:
        """Finish ``request_id`` with ABORT; returns it, or None if it is not unfinished."""
        seq = self._by_id.get(request_id)
        if seq is not None:
            self.finish(seq, FinishReason.ABORT)
        return seq

    # ---- one step -----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Plan the next step and reserve its KV slots. Empty when nothing can run."""
        out = SchedulerOutput()
        planned: set[Sequence] = set()
        budget = self.max_num_batched_tokens

        decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        prefills = [s for s in self.running if s.num_uncomputed_tokens > 1]
        for seq in decodes + prefills:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this step
                continue
            n = min(seq.num_uncomputed_tokens, budget)
            if self._reserve(seq, n, planned, out.preempted):
                self._plan(out, planned, seq, n)
                budget -= n

        while (
            not out.preempted
            and self.waiting
            and budget > 0
            and len(self.running) < self.max_num_seqs
        ):
            seq = self.waiting[0]
            n = min(seq.num_uncomputed_tokens, budget)
            if not self.block_manager.can_allocate(seq, n):
                break
            self.waiting.popleft()
            self.block_manager.allocate(seq, n)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._plan(out, planned, seq, n)
            budget -= n
        return out

    def update(self, scheduled: Iterable[ScheduledSequence]) -> None:
        """Record that a step's tokens now have their K/V in the cache."""
        for s in scheduled:
            if s.seq.status is SequenceStatus.RUNNING:
                s.seq.num_computed_tokens = s.start + s.num_new_tokens

    # ---- helpers ------------------------------------------------------------------------

    @staticmethod
    def _plan(out: SchedulerOutput, planned: set[Sequence], seq: Sequence, n: int) -> None:
        start = seq.num_computed_tokens
        out.scheduled.append(ScheduledSequence(seq, start, n, start + n == seq.num_tokens))
        planned.add(seq)

    def _reserve(
        self, seq: Sequence, n: int, planned: set[Sequence], preempted: list[Sequence]
    ) -> bool:
        """Allocate slots for ``n`` tokens of ``seq``, preempting younger sequences as
        needed. False if ``seq`` itself had to be preempted."""
        while not self.block_manager.can_allocate(seq, n):
            # Running is in admission order and everything older than ``seq`` that is
            # unplanned sits before it, so the victim is ``seq`` or younger.
            victim = next(s for s in reversed(self.running) if s not in planned)
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        self.block_manager.allocate(seq, n)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.deallocate(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions_total += 1
