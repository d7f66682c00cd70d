"""Overlapped decoding: launch decode step n + 1 before reading step n's tokens back.

Without it every step is serial on the host: plan, launch, wait for the device, read the
sampled tokens, append them (stop rules, detokenizing), plan again; at batch 1 that host
work (~0.3 ms) adds to every ~1–5 ms device step. With it, while step n runs on the
device the engine plans step n + 1 and launches it with step n's sampled tokens as its
inputs, read by the device from step n's own output tensor; only then does it wait for
step n's tokens and process them, hidden behind step n + 1.

Which steps: a decode step of one token per sequence, without prompt logprobs or a
guide (``structured_output``: its grammar reads each token on the host), without
speculative decoding (its proposers read the tokens; ``overlappable``). Rows that ask for
logprobs run ahead too: theirs are computed on the device from the raw logits and travel
home with the tokens. So do rows whose logits are edited (penalties, bias, min_tokens):
the logits processors count each row's token still in flight on the device
(``logits_processors.PendingTokens``, from :meth:`LaunchedStep.pending_tokens`). The
follow-up step holds the same sequences, minus those whose pending token is their last
(``max_tokens``), and only while nothing waits for admission (new prompts go through
the normal, synchronous step) and the KV pool has a slot for each (no preemption while
a step is in flight).

What a sequence that stops at step n (EOS, a stop string) costs: its row in step n + 1
is computed and dropped. Its KV write there lands in its own unfilled tail block, which
is freed with the sequence and was never offered to the prefix cache (only blocks full
of known tokens are).

Where the tokens travel. A greedy step of the decode graphs with a head
(``cuda_graphs.py``) has its argmax write each token where the next step reads it (the
staged input ids: a follow-up of the same leading rows copies everything but them) and
into pinned host memory (read once the step's event has passed), so between two such
steps the device runs only the inputs' copy (and, for rows asking for logprobs, their
computation from the head's logits, copied home on a side stream). Any other step's
tokens come home by a copy on a side stream, and its follow-up's inputs are patched on
the device.

Ownership: the engine holds at most one :class:`LaunchedStep` (device tensors of the
tokens in flight and their pinned host copy, with the logprobs of the rows that ask);
sequences do not know about it, except that the chunk of a follow-up step is marked
``pending_token``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from jacana_engine.core.outputs import TokenLogprob
from jacana_engine.core.scheduler import ScheduledSequence, Scheduler
from jacana_engine.core.sequence import SequenceStatus
from jacana_engine.kv_cache.block_manager import BlockManager
from jacana_engine.sample.logits_processors import PendingTokens
from jacana_engine.sample.sampler import RowLogprobs, logprobs_by_row
from jacana_engine.worker.host_to_device import index_on


@dataclass
class LaunchedStep:
    """A decode step running on the device; ``token_ids()`` waits for it.

    scheduled: its chunks, one sampling token each, in row order.
    device_ids: [N] int64 on the device, the token sampled for each row.
    """

    scheduled: list[ScheduledSequence]
    device_ids: torch.Tensor
    _host: torch.Tensor  # [N] int64, pinned on CUDA: the copy in flight
    _ready: torch.cuda.Event | None
    # the graph's argmax also wrote the tokens into the next step's staged input ids
    wrote_next_inputs: bool = False
    # the rows that ask for logprobs: theirs, copied home with the tokens
    _logprobs: tuple[RowLogprobs, ...] = ()
    # recorded once the logprobs are home, where that is not ``_ready`` (a graph's step)
    _logprobs_ready: torch.cuda.Event | None = None

    @classmethod
    def start(
        cls,
        scheduled: list[ScheduledSequence],
        device_ids: torch.Tensor,
        logprobs: Seq[RowLogprobs] = (),
    ) -> LaunchedStep:
        """Queue the copy of ``device_ids`` (and ``logprobs``) to the host behind the
        step's kernels, on a stream of its own: the next step's input copies then follow
        the kernels at once instead of queueing behind it (two copies' fixed costs, ~7 µs
        at batch 1). ``device_ids`` must not be written again before ``copied`` (a tensor
        of the caching allocator stays held by the step until ``token_ids`` has waited)."""
        if device_ids.device.type != "cuda":
            return cls(scheduled, device_ids, device_ids, None, _logprobs=tuple(logprobs))
        host = torch.empty(device_ids.shape, dtype=device_ids.dtype, pin_memory=True)
        ready, logprobs = _copy_home(device_ids, logprobs, host)
        return cls(scheduled, device_ids, host, ready, _logprobs=logprobs)

    @classmethod
    def from_graph(
        cls,
        scheduled: list[ScheduledSequence],
        device_ids: torch.Tensor,
        host_ids: torch.Tensor,
        ready: torch.cuda.Event,
        logprobs: Seq[RowLogprobs] = (),
    ) -> LaunchedStep:
        """A step of the decode graphs' head (``DecodeGraphs.tokens_on_host``): its tokens
        are ``device_ids`` on the device, ``host_ids`` (pinned) once ``ready`` has passed,
        and the next step's staged input ids. ``logprobs`` (queued after the replay)
        travel home on the side stream, as ``start``'s do."""
        lp_ready = None
        if logprobs and device_ids.device.type == "cuda":
            lp_ready, logprobs = _copy_home(device_ids, logprobs)
        return cls(
            scheduled,
            device_ids,
            host_ids,
            ready,
            wrote_next_inputs=True,
            _logprobs=tuple(logprobs),
            _logprobs_ready=lp_ready,
        )

    @property
    def copied(self) -> torch.cuda.Event | None:
        """Recorded when the tokens' copy to the host is done (None off CUDA)."""
        return self._ready

    def token_ids(self) -> list[int]:
        """The sampled tokens in row order (blocks until the device has them)."""
        if self._ready is not None:
            self._ready.synchronize()
        return self._host.tolist()

    def logprobs(self) -> list[TokenLogprob | None]:
        """Per row its logprobs where its request asks for them, else None (blocks as
        ``token_ids``)."""
        ready = self._logprobs_ready or self._ready
        if ready is not None and self._logprobs:
            ready.synchronize()
        return logprobs_by_row(self._logprobs, len(self.scheduled))

    def _pending_rows(self, follow: Seq[ScheduledSequence]) -> tuple[list[int], list[int]]:
        """(the rows of ``follow`` pending a token, the row of this step sampling each)."""
        index = {id(s.seq): i for i, s in enumerate(self.scheduled)}
        rows = [r for r, s in enumerate(follow) if s.pending_token]
        return rows, [index[id(follow[r].seq)] for r in rows]

    def inputs_in_place(self, follow: Seq[ScheduledSequence]) -> bool:
        """Whether the step ``follow`` finds its inputs already staged on the device:
        this step's graph wrote them, and ``follow``'s rows are the leading rows of this
        step, each pending its token (``DecodeGraphs.run(tokens_in_place=True)``)."""
        if not self.wrote_next_inputs:
            return False
        rows, sources = self._pending_rows(follow)
        return rows == sources == list(range(len(follow)))

    def pending_tokens(self, follow: Seq[ScheduledSequence]) -> PendingTokens | None:
        """The tokens this step samples for the rows of ``follow`` pending one, in a
        tensor of their own on the device (-1 elsewhere; queued now, so later writes to
        this step's token buffer do not reach it), for the logits processors; None when
        no row is pending."""
        rows, sources = self._pending_rows(follow)
        if not rows:
            return None
        flags = tuple(s.pending_token for s in follow)
        ids = self.device_ids
        if rows == sources == list(range(len(follow))):  # every row, in place
            return PendingTokens(ids[: len(follow)].clone(), flags)
        tokens = torch.full((len(follow),), -1, dtype=ids.dtype, device=ids.device)
        tokens.index_copy_(0, *self._moved_tokens(rows, sources))
        return PendingTokens(tokens, flags)

    def patch_inputs(self, follow: Seq[ScheduledSequence]):
        """A ``token_patch`` for the step ``follow`` (rows in order, one token each):
        writes this step's sampled token into each pending row's input, on the device."""
        rows, sources = self._pending_rows(follow)
        ids = self.device_ids
        if rows == sources:  # same sequences in the same rows: one device copy
            n = len(rows)
            return lambda inputs: inputs[:n].copy_(ids[:n])
        rows_t, tokens = self._moved_tokens(rows, sources)
        return lambda inputs: inputs.index_copy_(0, rows_t, tokens)

    def _moved_tokens(
        self, rows: list[int], sources: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(``rows`` [P] on the device, this step's tokens of ``sources`` [P] gathered now):
        an ``index_copy_``'s index and values, for a follow-up whose rows moved."""
        ids = self.device_ids
        return index_on(rows, ids.device), ids.index_select(0, index_on(sources, ids.device))


def _copy_home(
    device_ids: torch.Tensor, logprobs: Seq[RowLogprobs], host_ids: torch.Tensor | None = None
) -> tuple[torch.cuda.Event, tuple[RowLogprobs, ...]]:
    """Queue the copies of ``logprobs`` (and of ``device_ids`` into ``host_ids``) to
    pinned host memory on the side stream, behind the work queued so far on the current
    stream: (the event recorded after them, the logprobs' host copies)."""
    copier = _copy_stream(device_ids.device)
    copier.wait_stream(torch.cuda.current_stream(device_ids.device))
    with torch.cuda.stream(copier):
        if host_ids is not None:
            host_ids.copy_(device_ids, non_blocking=True)
        copies = tuple(part.to_host() for part in logprobs)
        ready = torch.cuda.Event()
        ready.record(copier)
    return ready, copies


_copy_streams: dict[torch.device, torch.cuda.Stream] = {}


def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream that copies sampled tokens to the host, one per device."""
    if device not in _copy_streams:
        _copy_streams[device] = torch.cuda.Stream(device)
    return _copy_streams[device]


def overlappable(scheduled: Seq[ScheduledSequence]) -> bool:
    """Whether a planned step may run overlapped: one sampled token per sequence (its
    logprobs, if asked, read off the raw logits on the device; its logits edits counting
    the token in flight), no prompt logprobs, no guide, no drafts, no embeddings."""
    if not scheduled:
        return False
    for s in scheduled:
        sp = s.seq.sampling_params
        if (
            s.num_new_tokens != 1
            or not s.samples
            or s.num_draft_tokens
            or s.seq.is_embedding
            or sp.prompt_logprobs is not None
            or sp.guide is not None  # its grammar must read its last token on the host
        ):
            return False
    return True


def plan_followup(
    launched: LaunchedStep, scheduler: Scheduler, block_manager: BlockManager
) -> list[ScheduledSequence] | None:
    """The next decode step of ``launched``'s sequences, with a KV slot reserved for
    each pending token; None when it must not be planned ahead (see the module doc)."""
    if scheduler.waiting:
        return None
    follow = []
    for s in launched.scheduled:
        seq = s.seq
        if seq.status is not SequenceStatus.RUNNING:  # aborted since
            continue
        if seq.num_output_tokens + 1 >= seq.max_tokens:  # the pending token is its last
            continue
        follow.append(dataclasses.replace(s, start=seq.num_tokens, pending_token=True))
    if not follow:
        return None
    needed = sum(block_manager.num_new_blocks(s.seq, 1) for s in follow)
    if needed > block_manager.num_free_blocks:
        return None
    for s in follow:
        block_manager.allocate(s.seq, 1)
    return follow
