"""CUDA graphs for decode steps: captured once at start-up, replayed for every decode batch.

State ownership: ``DecodeGraphs`` owns the static input buffers (device, plus pinned host
staging), one captured graph per padded batch size, and the graphs' shared memory pool.
The model and the KV cache tensors stay the model runner's; graphs read and write them
in place, so they must never be reallocated after capture.

A decode-only batch of ``B`` sequences runs as the graph of the smallest captured size
``>= B``. Padding rows write no KV (slot -1) and attend one token of whatever block their
stale table row names (a valid block id, since every table entry ever written is one);
their outputs are dropped. Batches with prefill chunks, or larger than the largest
captured size, run eagerly (``can_run`` says which).

What makes this safe: the attention backend must be ``graph_safe`` (no host reads of
device tensors, grids sized from host bounds), so the metadata used at capture fixes
``max_query_len = 1``, ``max_seq_len = max_model_len`` and the decode split count per
size; every step copies its inputs into the same buffers and replays.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from jacana_engine.attention_metadata import AttentionMetadata
from jacana_engine.scheduler import ScheduledSequence

log = logging.getLogger(__name__)

_SMALL_SIZES = (1, 2, 4, 8)


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


def padded_size(sizes: Sequence[int], batch: int) -> int | None:
    """The smallest of the ascending ``sizes`` that holds ``batch``; None if none does."""
    for size in sizes:
        if size >= batch:
            return size
    return None


# forward(input_ids [B], positions [B], meta) -> hidden [B, hidden]
ForwardFn = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


def is_plain_decode(scheduled: Sequence[ScheduledSequence]) -> bool:
    """Every chunk is one known token (no prefill, no drafts to verify)."""
    return all(s.num_new_tokens == 1 and not s.num_draft_tokens for s in scheduled)


class DecodeStaging:
    """Host staging of a decode step, filled straight from the scheduled sequences.

    Layout (what the graphs' device buffers mirror):
    - ``host64`` [3 * max_batch] int64: input_ids | positions | slot_mapping;
    - ``host32`` [max_batch * (1 + max_blocks)] int32: seq_lens | block_tables
      [max_batch, max_blocks].
    Padding rows (past the batch) hold token 0 at position 0, slot -1 (no KV write) and
    KV length 1; their table rows keep whatever they held (always valid block ids).

    Why not ``build_batch``: at 64 rows it spends ~0.5 ms per step building tensors the
    graphs then copy again. Here every step writes numpy views of the buffers, and a
    table row is only extended: row ``i`` remembers which sequence (and which
    ``block_table_epoch`` of it) it holds and how many entries are written, so a decode
    step usually writes no table entry at all (one when a block fills up).
    """

    def __init__(self, max_batch: int, max_blocks: int, block_size: int, pin: bool) -> None:
        n = self.max_batch = max_batch
        self.max_blocks = max_blocks
        self.block_size = block_size
        self.host64 = torch.zeros(3 * n, dtype=torch.int64, pin_memory=pin)
        self.host32 = torch.zeros(n + n * max_blocks, dtype=torch.int32, pin_memory=pin)
        self._i64 = self.host64.numpy()
        self._i32 = self.host32.numpy()
        self._tables = self._i32[n:].reshape(n, max_blocks)
        self._i64[2 * n :] = -1  # padding rows write no KV
        self._i32[:n] = 1  # padding rows attend one token
        # Row i holds the table of _row_seq[i] (a reference, not an id: ids are reused)
        # as of its _row_epoch[i], _row_written[i] entries of it.
        self._row_seq: list[object] = [None] * n
        self._row_epoch = [0] * n
        self._row_written = [0] * n
        self.batch = 0

    def fits(self, scheduled: Sequence[ScheduledSequence]) -> bool:
        return len(scheduled) <= self.max_batch and all(
            len(s.seq.block_table) <= self.max_blocks for s in scheduled
        )

    def fill(self, scheduled: Sequence[ScheduledSequence]) -> int:
        """Write one plain decode step (``is_plain_decode``); returns its batch size."""
        n, bs = self.max_batch, self.block_size
        ids, positions, slots, seq_lens = [], [], [], []
        for row, s in enumerate(scheduled):
            seq, pos = s.seq, s.start
            table = seq.block_table
            ids.append(seq.token_slice(pos, pos + 1)[0])
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
            seq_lens.append(pos + 1)
            epoch = seq.block_table_epoch
            same = self._row_seq[row] is seq and self._row_epoch[row] == epoch
            written = self._row_written[row] if same else 0
            if written < len(table):
                self._tables[row, written : len(table)] = table[written:]
                self._row_seq[row], self._row_epoch[row] = seq, epoch
                self._row_written[row] = len(table)
        batch = len(scheduled)
        i64, i32 = self._i64, self._i32
        i64[:batch] = ids
        i64[n : n + batch] = positions
        i64[2 * n : 2 * n + batch] = slots
        i32[:batch] = seq_lens
        if batch < self.batch:  # rows that were real last step are padding now
            i64[batch : self.batch] = 0
            i64[n + batch : n + self.batch] = 0
            i64[2 * n + batch : 2 * n + self.batch] = -1
            i32[batch : self.batch] = 1
        self.batch = batch
        return batch


class DecodeGraphs:
    """Captured decode steps for a fixed set of padded batch sizes.

    forward: runs the model on device tensors (KV caches bound by the caller).
    sizes: batch sizes to capture, ascending.
    max_blocks: block-table width of the static buffer (``ceil(max_model_len / block_size)``).
    max_model_len: bound on any sequence's KV length (sizes the decode kernel's splits).
    num_splits: split-K factor of the decode kernel for a padded size.
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
    ) -> None:
        self.sizes = sorted(sizes)
        self.max_batch = self.sizes[-1]
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.max_model_len = max_model_len
        self.num_splits = num_splits
        self.device = device
        self._forward = forward
        n = self.max_batch
        self.staging = DecodeStaging(n, max_blocks, block_size, pin=True)
        # Device mirrors of the staging buffers (layout: DecodeStaging).
        self._dev64 = self.staging.host64.to(device)
        self._dev32 = self.staging.host32.to(device)
        self._query_start = torch.arange(n + 1, dtype=torch.int32, device=device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._copied: torch.cuda.Event | None = None  # the last step's H2D copies
        self.capture_seconds = 0.0
        self.replays = 0

    # -- static views ------------------------------------------------------------------

    def _input_ids(self, bs: int) -> torch.Tensor:
        return self._dev64[:bs]

    def _positions(self, bs: int) -> torch.Tensor:
        return self._dev64[self.max_batch : self.max_batch + bs]

    def _meta(self, bs: int) -> AttentionMetadata:
        n = self.max_batch
        tables = self._dev32[n:].view(n, self.max_blocks)
        return AttentionMetadata(
            query_start_loc=self._query_start[: bs + 1],  # [bs + 1]
            seq_lens=self._dev32[:bs],  # [bs]
            block_tables=tables[:bs],  # [bs, max_blocks]
            slot_mapping=self._dev64[2 * n : 2 * n + bs],  # [bs]
            query_lens_cpu=[1] * bs,
            seq_lens_cpu=[self.max_model_len] * bs,
            block_size=self.block_size,
            max_query_len=1,
            max_seq_len=self.max_model_len,
            decode_num_splits=self.num_splits(bs),
        )

    # -- capture -----------------------------------------------------------------------

    @torch.inference_mode()
    def capture(self) -> float:
        """Warm up and capture every size, largest first (so smaller graphs reuse the
        pool's blocks). Returns the seconds it took."""
        start = time.perf_counter()
        pool = None
        for bs in reversed(self.sizes):
            ids, pos, meta = self._input_ids(bs), self._positions(bs), self._meta(bs)
            self._forward(ids, pos, meta)  # compiles kernels, builds lazy tables
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._forward(ids, pos, meta)
            pool = graph.pool()
            self._graphs[bs] = graph
            self._outputs[bs] = out
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - start
        log.info(
            "captured %d CUDA graphs (decode batch sizes %s) in %.2f s",
            len(self.sizes),
            self.sizes,
            self.capture_seconds,
        )
        return self.capture_seconds

    # -- replay ------------------------------------------------------------------------

    def padded_size(self, batch: int) -> int | None:
        return padded_size(self.sizes, batch)

    def can_run(self, scheduled: Sequence[ScheduledSequence]) -> bool:
        """A plain decode step (one known token per sequence) that a captured graph holds."""
        return bool(self._graphs) and is_plain_decode(scheduled) and self.staging.fits(scheduled)

    def run(self, scheduled: Sequence[ScheduledSequence]) -> torch.Tensor:
        """Stage one plain decode step and replay its graph: hidden states [B, hidden] on
        the device, valid until the next replay."""
        bs = self.padded_size(len(scheduled))
        if bs is None or bs not in self._graphs:
            raise ValueError(f"no captured graph holds a decode batch of {len(scheduled)}")
        if self._copied is not None:  # the staging buffers may still be in flight
            self._copied.synchronize()
        batch = self.staging.fill(scheduled)
        n = self.max_batch
        self._dev64.copy_(self.staging.host64, non_blocking=True)
        used = n + bs * self.max_blocks
        self._dev32[:used].copy_(self.staging.host32[:used], non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        self._graphs[bs].replay()
        self.replays += 1
        return self._outputs[bs][:batch]
