"""CUDA graphs for decode steps: captured once at start-up, replayed for every decode batch.

State ownership: ``DecodeGraphs`` owns the static input buffers (device, plus pinned host
staging), one captured graph per (padded batch size, query width), and the graphs'
shared memory pool. The model and the KV cache tensors stay the model runner's; graphs
read and write them in place, so they must never be reallocated after capture.

Query width ``q``: a plain decode step gives every sequence one query (``q = 1``); with
speculative decoding a verifying step gives sequence ``i`` its last known token plus
``k_i`` drafts, and runs in the graphs of the smallest captured width ``q`` (up to
``num_speculative_tokens + 1``, see ``query_widths``) that holds its widest chunk; a
short prompt tail fits the same way. Each sequence owns ``q`` query rows, its ``n_i``
real tokens in the last ``n_i`` of them (where the attention kernel's causal positions
``seq_len - q + j`` are theirs) and padding in front (no KV write, positions before its
own, outputs dropped).

A batch of ``B`` sequences runs as the graph of the smallest captured size ``>= B``.
Padding sequences write no KV (slot -1) and attend ``q`` tokens of whatever blocks their
stale table row names (valid block ids, since every table entry ever written is one);
their outputs are dropped. Batches with prefill chunks, wider chunks, or more sequences
than the largest size run eagerly (``query_width`` says which).

What makes this safe: the attention backend must be ``graph_safe`` (no host reads of
device tensors, grids sized from host bounds), so the metadata used at capture fixes
``max_query_len = q``, ``max_seq_len = max_model_len`` and the decode split count per
size; every step copies its inputs into the same buffers and replays.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import torch

from jacana_engine.core.scheduler import ScheduledSequence
from jacana_engine.tuning.gpu_timing import replay_seconds, sustained_replay_seconds
from jacana_engine.worker.attention_metadata import AttentionMetadata, kv_slots

if TYPE_CHECKING:
    from jacana_engine.kernels.argmax import TokenCopies  # Triton: CUDA builds only

log = logging.getLogger(__name__)

T = TypeVar("T")

_SMALL_SIZES = (1, 2, 4, 8)
# Rows of the pinned ring the head graphs write their tokens into, one a replay in turn:
# the host reads a step's row before this many later replays (overlapped decoding reads
# step n's right after launching step n + 1).
TOKEN_RING = 4


def capture_sizes(max_batch: int) -> list[int]:
    """Padded batch sizes to capture: 1, 2, 4, 8, then steps of 8 up to 64, of 16 up to
    128, of 32 beyond, always ending at ``max_batch`` itself (ascending)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = [s for s in _SMALL_SIZES if s < max_batch]
    size = 8
    while size < max_batch:
        size += 8 if size < 64 else 16 if size < 128 else 32
        if size < max_batch:
            sizes.append(size)
    sizes.append(max_batch)
    return sizes


def query_widths(num_speculative_tokens: int) -> list[int]:
    """Query widths to capture for up to ``num_speculative_tokens`` drafts per sequence:
    1 (plain decode), then ``k + 1`` for k = 1, 2, 4, 8, … below the most, and the most
    itself (so a step of short drafts does not pay for the widest graph)."""
    widths, k = {1}, 1
    while k < num_speculative_tokens:
        widths.add(k + 1)
        k *= 2
    if num_speculative_tokens > 0:
        widths.add(num_speculative_tokens + 1)
    return sorted(widths)


def padded_size(sizes: Sequence[int], batch: int) -> int | None:
    """The smallest of the ascending ``sizes`` that holds ``batch``; None if none does."""
    for size in sizes:
        if size >= batch:
            return size
    return None


def int64_int32_views(buffer: torch.Tensor, bytes64: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A staging buffer's two parts: its first ``bytes64`` bytes as int64, the rest as
    int32 (uint8 ``buffer``, on the host or its device mirror)."""
    return buffer[:bytes64].view(torch.int64), buffer[bytes64:].view(torch.int32)


def warm_and_capture(
    step: Callable[[], T], device: torch.device, pool
) -> tuple[torch.cuda.CUDAGraph, T]:
    """Run ``step`` once (compiles kernels, builds lazy tables), then capture it into a
    new graph on the memory ``pool`` (None: a new pool); returns the graph and what the
    captured ``step`` returned (its static outputs)."""
    step()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = step()
    return graph, out


# forward(input_ids [T], positions [T], meta) -> hidden [T, hidden]
ForwardFn = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]
# head(hidden [B, hidden], copies) -> (logits [B, vocab] in the model dtype, greedy tokens
# [B] int64), the tokens written to ``copies`` too (kernels/argmax.py)
HeadFn = Callable[[torch.Tensor, "TokenCopies"], tuple[torch.Tensor, torch.Tensor]]


class DecodeStaging:
    """Host staging of a decode or verify step, filled straight from the sequences.

    Layout (what the graphs' device buffer mirrors), for ``N = max_batch * max_query``
    token rows, one pinned byte buffer ``host`` (so a step is one host-to-device copy,
    ``step_bytes`` long) holding, end to end:
    - ``host64`` [4 * N + 1] int64: input_ids | positions | slot_mapping | real_rows (the
      rows of real tokens, in chunk order: what the caller keeps of the output) | the
      token ring row the step's head writes (``DecodeGraphs``);
    - ``host32`` [max_batch * (1 + max_blocks)] int32: seq_lens | block_tables
      [max_batch, max_blocks].
    Each step writes the ``padded * q`` token rows and ``padded`` sequences its graph
    reads: padding queries hold token 0 at their would-be positions with slot -1 (no KV
    write); padding sequences hold ``q`` queries at positions ``0..q-1`` over a KV length
    of ``q``. Table rows of padding sequences keep what they held.

    Why not ``build_batch``: at 64 rows it spends ~0.5 ms per step building tensors the
    graphs then copy again. Here every step writes numpy views of the buffers, and a
    table row is only extended: row ``i`` remembers which sequence (and which
    ``block_table_epoch`` of it) it holds and how many entries are written, so a decode
    step usually writes no table entry at all (one when a block fills up).
    """

    def __init__(
        self, max_batch: int, max_blocks: int, block_size: int, pin: bool, max_query: int = 1
    ) -> None:
        self.max_batch, self.max_query = max_batch, max_query
        self.max_blocks = max_blocks
        self.block_size = block_size
        self.rows = max_batch * max_query  # N
        self.ring_slot_at = 4 * self.rows  # host64's entry of the token ring row
        self._bytes64 = (4 * self.rows + 1) * 8
        size = self._bytes64 + max_batch * (1 + max_blocks) * 4
        self.host = torch.zeros(size, dtype=torch.uint8, pin_memory=pin)
        self.host64, self.host32 = self.views(self.host)
        self._i64 = self.host64.numpy()
        self._i32 = self.host32.numpy()
        self._tables = self._i32[max_batch:].reshape(max_batch, max_blocks)
        # Row i holds the table of _row_seq[i] (a reference, not an id: ids are reused)
        # as of its _row_epoch[i], _row_written[i] entries of it.
        self._row_seq: list[object] = [None] * max_batch
        self._row_epoch = [0] * max_batch
        self._row_written = [0] * max_batch

    def views(self, buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(int64 [4 * N + 1], int32 [max_batch * (1 + max_blocks)]) views of a uint8 buffer
        laid out as ``host`` (``host`` itself, or its device mirror)."""
        return int64_int32_views(buffer, self._bytes64)

    def stage_ring_slot(self, slot: int) -> None:
        """The token ring row that the next step's head writes."""
        self._i64[self.ring_slot_at] = slot

    def step_bytes(self, padded: int) -> int:
        """The leading bytes of ``host`` a step of ``padded`` sequences reads: all of
        ``host64``, then the sequence lengths and the first ``padded`` table rows."""
        return self._bytes64 + (self.max_batch + padded * self.max_blocks) * 4

    def fits(self, scheduled: Sequence[ScheduledSequence], q: int) -> bool:
        """The step fits the buffers at query width ``q`` (and every chunk's KV length
        covers its ``q`` query positions)."""
        return (
            len(scheduled) <= self.max_batch
            and q <= self.max_query
            and all(
                len(s.seq.block_table) <= self.max_blocks
                and s.num_new_tokens <= q <= s.start + s.num_new_tokens
                for s in scheduled
            )
        )

    def fill(self, scheduled: Sequence[ScheduledSequence], q: int, padded: int) -> int:
        """Write one step (``fits``) at query width ``q`` for a graph
        of ``padded`` sequences; returns how many real token rows it has."""
        n, bs = self.rows, self.block_size
        ids, positions, slots, real = [], [], [], []
        seq_lens = []
        for row, s in enumerate(scheduled):
            seq, start = s.seq, s.start
            end = start + s.num_new_tokens
            pad = q - s.num_new_tokens
            table = seq.block_table
            ids += [0] * pad
            ids += s.known_token_ids()
            positions += range(end - q, end)
            slots += [-1] * pad
            slots += kv_slots(table, start, end, bs)
            real += range(row * q + pad, row * q + q)
            seq_lens.append(end)
            epoch = seq.block_table_epoch
            same = self._row_seq[row] is seq and self._row_epoch[row] == epoch
            written = self._row_written[row] if same else 0
            if written < len(table):
                self._tables[row, written : len(table)] = table[written:]
                self._row_seq[row], self._row_epoch[row] = seq, epoch
                self._row_written[row] = len(table)
        batch, used = len(scheduled), len(ids)
        total = padded * q
        i64, i32 = self._i64, self._i32
        i64[:used] = ids
        i64[n : n + used] = positions
        i64[2 * n : 2 * n + used] = slots
        i64[3 * n : 3 * n + len(real)] = real
        i32[:batch] = seq_lens
        # Padding sequences: token 0 at positions 0..q-1, no KV write, KV length q.
        i64[used:total] = 0
        i64[n + used : n + total] = list(range(q)) * (padded - batch)
        i64[2 * n + used : 2 * n + total] = -1
        i32[batch:padded] = q
        return len(real)

    def fill_context(self, padded: int, seq_len: int) -> None:
        """Write a plain decode step of ``padded`` stand-in sequences, each one query over
        a KV length of ``seq_len`` in blocks 0, 1, ... of the pool, writing no KV (slot
        -1): for timing a graph with the attention of a real context. The table rows
        forget which sequence they held, so a later ``fill`` writes them afresh."""
        self.fill([], 1, padded)
        blocks = -(-seq_len // self.block_size)
        self._i32[:padded] = seq_len
        self._tables[:padded, :blocks] = range(blocks)
        self._row_seq[:padded] = [None] * padded


class DecodeGraphs:
    """Captured decode (and verify) steps for a fixed set of padded batch sizes.

    forward: runs the model on device tensors (KV caches bound by the caller).
    sizes: batch sizes to capture, ascending.
    query_widths: widths ``q`` to capture at every size (1 = plain decode; with
        speculation also ``num_speculative_tokens + 1``).
    max_blocks: block-table width of the static buffer (``ceil(max_model_len / block_size)``).
    max_model_len: bound on any sequence's KV length (sizes the decode kernel's splits).
    num_splits: split-K factor of the decode kernel for a padded size.
    head: when given, the plain-decode graphs (``q = 1``) also run it on the hidden
        states they compute: the lm_head and the greedy argmax then replay inside the
        graph, chained to the final norm (``head_outputs``), instead of as launches of
        their own after it. The argmax also writes each row's token into the staged input
        ids (where the next step of the same rows reads it: ``run(tokens_in_place=True)``)
        and into a row of a pinned host ring (``tokens_on_host``): between two such steps
        the device then runs only the inputs' copy, and nothing waits on another stream.
    """

    def __init__(
        self,
        forward: ForwardFn,
        *,
        sizes: Sequence[int],
        block_size: int,
        max_blocks: int,
        max_model_len: int,
        num_splits: Callable[[int], int],
        device: torch.device,
        query_widths: Sequence[int] = (1,),
        head: HeadFn | None = None,
    ) -> None:
        self.sizes = sorted(sizes)
        self.query_widths = sorted(set(query_widths))
        self.max_batch = self.sizes[-1]
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.max_model_len = max_model_len
        self.num_splits = num_splits
        self.device = device
        self._forward = forward
        self._head = head
        n = self.max_batch
        self.staging = DecodeStaging(
            n, max_blocks, block_size, pin=True, max_query=self.query_widths[-1]
        )
        # Device mirror of the staging buffer (layout: DecodeStaging), and its two views.
        self._dev = self.staging.host.to(device)
        self._dev64, self._dev32 = self.staging.views(self._dev)
        # query_start_loc per width: [n + 1] = 0, q, 2q, ...
        self._query_start = {
            q: torch.arange(0, n * q + 1, q, dtype=torch.int32, device=device)
            for q in self.query_widths
        }
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._outputs: dict[tuple[int, int], torch.Tensor] = {}
        self._heads: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # padded size -> head's
        self._last: tuple[int, int] | None = None  # (padded size, width) of the last run
        self._copied: torch.cuda.Event | None = None  # the last step's H2D copies
        # [TOKEN_RING, max_batch] int64, pinned: the head's tokens, a row a replay in turn
        self._ring = torch.zeros(TOKEN_RING, n, dtype=torch.int64, pin_memory=True)
        self._ring_slot = 0  # the row the last run's head wrote
        self._metas: dict[tuple[int, int], AttentionMetadata] = {}
        self.capture_seconds = 0.0
        self.replays = 0
        self.verify_replays = 0
        self.tokens_in_place_runs = 0  # runs whose input ids the last head wrote

    # -- static views ------------------------------------------------------------------

    def _token_view(self, part: int, tokens: int) -> torch.Tensor:
        start = part * self.staging.rows
        return self._dev64[start : start + tokens]

    def _meta(self, bs: int, q: int) -> AttentionMetadata:
        n = self.max_batch
        tables = self._dev32[n:].view(n, self.max_blocks)
        return AttentionMetadata(
            query_start_loc=self._query_start[q][: bs + 1],  # [bs + 1]
            seq_lens=self._dev32[:bs],  # [bs]
            block_tables=tables[:bs],  # [bs, max_blocks]
            slot_mapping=self._token_view(2, bs * q),  # [bs * q]
            query_lens_cpu=[q] * bs,
            seq_lens_cpu=[self.max_model_len] * bs,
            block_size=self.block_size,
            max_query_len=q,
            max_seq_len=self.max_model_len,
            decode_num_splits=self.num_splits(bs) if q == 1 else None,
        )

    # -- capture -----------------------------------------------------------------------

    @torch.inference_mode()
    def capture(self) -> float:
        """Warm up and capture every (size, width), largest first (so smaller graphs reuse
        the pool's blocks). Returns the seconds it took."""
        start = time.perf_counter()
        pool = None
        for q in reversed(self.query_widths):
            for bs in reversed(self.sizes):
                # Inputs as padding (every sequence attends q tokens, writes nothing).
                self.staging.fill([], q, bs)
                self._dev.copy_(self.staging.host)
                ids, pos = self._token_view(0, bs * q), self._token_view(1, bs * q)
                meta = self._meta(bs, q)
                head = self._head if q == 1 else None
                graph, (out, head_out) = warm_and_capture(
                    lambda: self._step(ids, pos, meta, head, bs),  # noqa: B023 (called at once)
                    self.device,
                    pool,
                )
                pool = graph.pool()
                self._graphs[(bs, q)] = graph
                self._outputs[(bs, q)] = out
                # the tile table the warm-up left on a verify step's metadata is read by
                # every replay: it lives as long as the graph
                self._metas[(bs, q)] = meta
                if head_out is not None:
                    self._heads[bs] = head_out
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - start
        log.info(
            "captured %d CUDA graphs (batch sizes %s, query widths %s) in %.2f s",
            len(self._graphs),
            self.sizes,
            self.query_widths,
            self.capture_seconds,
        )
        return self.capture_seconds

    def _step(self, ids, pos, meta, head, bs):
        """What a graph captures: the forward, then ``head`` on its output when given."""
        out = self._forward(ids, pos, meta)
        return out, (head(out, self._token_copies(bs)) if head is not None else None)

    def _token_copies(self, bs: int) -> TokenCopies:
        """Where a head graph of ``bs`` sequences also writes its tokens: the staged input
        ids of its rows, and the ring row the step stages."""
        from jacana_engine.kernels.argmax import TokenCopies

        at = self.staging.ring_slot_at
        return TokenCopies(
            next_ids=self._token_view(0, bs), ring=self._ring, slot=self._dev64[at : at + 1]
        )

    # -- replay ------------------------------------------------------------------------

    def replay_seconds(
        self,
        bs: int,
        seq_len: int,
        replays: int = 20,
        reps: int = 1,
        sustain_s: float = 0.0,
    ) -> float:
        """GPU seconds of one replay of the captured plain-decode graph of padded size
        ``bs``, its inputs staged as ``bs`` sequences of ``seq_len`` KV tokens that write
        nothing (``DecodeStaging.fill_context``), as it runs in a step of that context
        length (its outputs are not meant to be read; a graph with a head runs it too):
        after 3 warm-up replays, the median of ``reps`` runs of ``replays`` (CUDA
        events); with ``sustain_s``, instead its pace at the end of that many seconds of
        replays back to back (``gpu_timing.sustained_replay_seconds``)."""
        if (bs, 1) not in self._graphs:
            raise ValueError(f"no plain-decode graph of padded size {bs} was captured")
        if not 1 <= seq_len <= self.max_model_len:
            raise ValueError(f"seq_len {seq_len} outside 1..{self.max_model_len}")
        if self._copied is not None:
            self._copied.synchronize()
        self.staging.fill_context(bs, seq_len)
        self._dev.copy_(self.staging.host)
        graph = self._graphs[(bs, 1)]
        for _ in range(3):
            graph.replay()
        if sustain_s > 0:
            return sustained_replay_seconds(graph, sustain_s)
        return statistics.median(replay_seconds(graph, replays) for _ in range(reps))

    def output(self, bs: int, q: int = 1) -> torch.Tensor:
        """The hidden states [bs * q, hidden] that the captured graph of padded size
        ``bs`` and query width ``q`` writes at each replay."""
        return self._outputs[(bs, q)]

    def head_outputs(self, rows: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """What the head wrote in the last ``run``, for its first ``rows`` sequences:
        (logits [rows, vocab] in the model dtype, greedy tokens [rows] int64), on the
        device and valid until the next replay; None when that run was not a plain
        decode step or the graphs have no head."""
        if self._last is None or self._last[1] != 1 or self._last[0] not in self._heads:
            return None
        logits, tokens = self._heads[self._last[0]]
        return logits[:rows], tokens[:rows]

    def tokens_on_host(self, rows: int) -> tuple[torch.Tensor, torch.cuda.Event]:
        """The last ``run``'s greedy tokens as its head writes them to the host: (a view
        [rows] int64 of pinned memory, the event after which it holds them), recorded
        now on the current stream. Read it before ``TOKEN_RING`` more runs. Only after a
        plain-decode run of graphs with a head (``head_outputs`` is not None)."""
        if self.head_outputs(rows) is None:
            raise RuntimeError("the last run wrote no tokens: not a plain decode step with a head")
        ready = torch.cuda.Event()
        ready.record()
        return self._ring[self._ring_slot, :rows], ready

    def padded_size(self, batch: int) -> int | None:
        return padded_size(self.sizes, batch)

    def query_width(self, scheduled: Sequence[ScheduledSequence]) -> int | None:
        """The width of the captured graphs that run this step, or None (run it eagerly):
        1 for one token per sequence, else the smallest captured width that holds every
        chunk (a known token plus drafts, or a short tail of a prompt)."""
        if not self._graphs or not scheduled:
            return None
        widest = max(s.num_new_tokens for s in scheduled)
        q = next((w for w in self.query_widths if w >= widest), None)
        if q is None or not self.staging.fits(scheduled, q):
            return None
        return q

    def run(
        self,
        scheduled: Sequence[ScheduledSequence],
        q: int,
        token_patch: Callable[[torch.Tensor], None] | None = None,
        tokens_in_place: bool = False,
    ) -> torch.Tensor:
        """Stage one step at width ``q`` (``query_width``) and replay its graph: the
        hidden states of the real tokens, chunks end to end as ``build_batch`` lays them
        out ([T, hidden] on the device, valid until the next replay).

        token_patch: called with the staged input ids on the device ([padded * q]) after
        they are copied and before the replay (device work only): fills in tokens the
        host does not know yet (``decode_overlap.py``).
        tokens_in_place: the input ids are already on the device, row for row: the last
        run was a plain decode step with a head over the same leading sequences (its
        argmax wrote them), and this one is too (q = 1); the copy leaves them out."""
        bs = self.padded_size(len(scheduled))
        if bs is None or (bs, q) not in self._graphs:
            raise ValueError(f"no captured graph holds {len(scheduled)} sequences at width {q}")
        if self._copied is not None:  # the staging buffers may still be in flight
            self._copied.synchronize()
        if tokens_in_place and (q != 1 or token_patch is not None):
            raise ValueError("tokens in place only for plain decode steps, without a patch")
        real = self.staging.fill(scheduled, q, bs)
        rows = self.staging.rows
        self._ring_slot = self.replays % TOKEN_RING
        self.staging.stage_ring_slot(self._ring_slot)
        used = self.staging.step_bytes(bs)  # one copy: a copy's fixed cost is ~5 µs
        first = rows * 8 if tokens_in_place else 0  # input ids are host64's first N
        self.tokens_in_place_runs += tokens_in_place
        self._dev[first:used].copy_(self.staging.host[first:used], non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        if token_patch is not None:
            token_patch(self._token_view(0, bs * q))
        self._graphs[(bs, q)].replay()
        self._last = (bs, q)
        self.replays += 1
        out = self._outputs[(bs, q)]
        if q == 1:
            return out[: len(scheduled)]
        self.verify_replays += 1
        return out.index_select(0, self._dev64[3 * rows : 3 * rows + real])
