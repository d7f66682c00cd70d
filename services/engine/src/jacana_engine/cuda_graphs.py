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
        # int64 staging: [input_ids | positions | slot_mapping], each [n]
        self._host64 = torch.zeros(3 * n, dtype=torch.int64, pin_memory=True)
        self._dev64 = torch.zeros(3 * n, dtype=torch.int64, device=device)
        # int32 staging: [seq_lens [n] | block_tables [n, max_blocks]]
        self._host32 = torch.zeros(n + n * max_blocks, dtype=torch.int32, pin_memory=True)
        self._dev32 = torch.zeros(n + n * max_blocks, dtype=torch.int32, device=device)
        self._host64[2 * n :].fill_(-1)  # padding rows write no KV
        self._host32[:n].fill_(1)  # padding rows attend one token
        self._dev64.copy_(self._host64)
        self._dev32.copy_(self._host32)
        self._query_start = torch.arange(n + 1, dtype=torch.int32, device=device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._last_batch = 0
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

    def can_run(self, meta: AttentionMetadata, num_tokens: int) -> bool:
        """A decode-only batch (one token per sequence) no larger than the largest graph."""
        return (
            bool(self._graphs)
            and num_tokens == meta.num_seqs
            and num_tokens <= self.max_batch
            and meta.block_tables.shape[1] <= self.max_blocks
        )

    def run(
        self,
        input_ids: torch.Tensor,  # [B] int64, host
        positions: torch.Tensor,  # [B] int64, host
        meta: AttentionMetadata,  # host copy; decode-only
    ) -> torch.Tensor:  # [B, hidden] on the device, valid until the next replay
        """Copy one decode step into the static buffers and replay its graph."""
        batch = input_ids.shape[0]
        bs = self.padded_size(batch)
        if bs is None or bs not in self._graphs:
            raise ValueError(f"no captured graph holds a decode batch of {batch}")
        n = self.max_batch
        h64, h32 = self._host64, self._host32
        if self._copied is not None:  # the staging buffers may still be in flight
            self._copied.synchronize()
        h64[:batch] = input_ids
        h64[n : n + batch] = positions
        h64[2 * n : 2 * n + batch] = meta.slot_mapping
        h32[:batch] = meta.seq_lens
        width = meta.block_tables.shape[1]
        h32[n:].view(n, self.max_blocks)[:batch, :width] = meta.block_tables
        if batch < self._last_batch:  # rows that were real last step are padding now
            h64[batch : self._last_batch] = 0
            h64[n + batch : n + self._last_batch] = 0
            h64[2 * n + batch : 2 * n + self._last_batch] = -1
            h32[batch : self._last_batch] = 1
        self._last_batch = batch
        self._dev64.copy_(h64, non_blocking=True)
        used = n + bs * self.max_blocks
        self._dev32[:used].copy_(h32[:used], non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        self._graphs[bs].replay()
        self.replays += 1
        return self._outputs[bs][:batch]
