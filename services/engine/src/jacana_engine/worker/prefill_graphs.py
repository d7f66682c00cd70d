"""CUDA graphs for steps with prompt tokens: an eager step's host calls in one replay.

Why: an eager step costs the host one Python call chain per kernel (~10 a layer). On an
H200's host that is 11-24 ms for the 28 layers of Qwen3-0.6B, whose GPU work for a
1024-token prompt is 3 ms, and on slow hosts more than the 8B's 22-24 ms: the first
token waits for Python, not for the GPU. The same holds for a mixed step (a prompt chunk
beside running decodes): serving varied traffic (as ``research/compile_stability_gpu.py``
does), the 0.6B's mixed steps take 16-35 ms each eagerly, half a pass's time in a sixth
of its steps. A replayed graph launches the same kernels for the price of one call.

What is captured: the forward of up to ``max_seqs`` sequences over ``T`` token rows, for
each ``T`` of ``prefill_buckets``. A step of ``n`` tokens (prompts, chunks of long ones
after their cached prefix, decode rows beside them, verifying rows) runs in the smallest
``T >= n``: its chunks' tokens in rows ``0..n-1`` in order, padding after them (token 0
at position 0, slot -1: no KV write). Sequence slots past the step's have no queries
(``query_start_loc`` repeats ``n``) and no tiles in the attention's tile table
(``attention_tiles.prefill_tiles``, padded with entries that exit at once), so
the prefill kernel never reads their lengths or tables and never touches padding rows.
A bucket's tile table is built at the query rows per program a one-prompt step of ``T``
tokens takes, for every step it runs (the sums do not depend on it).

A one-sequence step of exactly ``T`` tokens runs the kernels and GEMM shapes of the
eager step and the same attention programs (the table's extra rows exit at once), so it
gives the same bits; any other runs its GEMMs over ``T`` rows,
which may pick other cuBLAS kernels and round differently (the attention is the same
either way).

State ownership as in ``cuda_graphs.DecodeGraphs``: this class owns its static buffers
(one pinned host staging buffer, its device mirror), the graphs and their memory pool;
the model and the KV caches stay the runner's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from jacana_engine.core.scheduler import ScheduledSequence
from jacana_engine.kernels.attention_tiles import prefill_tiles, tile_capacity
from jacana_engine.worker.attention_metadata import AttentionMetadata, kv_slots
from jacana_engine.worker.decode_graphs import ForwardFn, int64_int32_views, warm_and_capture

log = logging.getLogger(__name__)

_SMALL_BUCKETS = (32, 64, 128, 256, 512)
_BUCKET_STEP = 128  # beyond 512 tokens: a padded chunk wastes at most 128 rows of GEMM


def prefill_buckets(max_tokens: int) -> list[int]:
    """Token counts to capture: 32, 64, 128, 256, 512, then steps of 128, always ending at
    ``max_tokens`` itself (ascending)."""
    if max_tokens < 2:
        raise ValueError(f"prefill graphs need at least 2 tokens, got {max_tokens}")
    buckets = [b for b in _SMALL_BUCKETS if b < max_tokens]
    size = _SMALL_BUCKETS[-1]
    while size + _BUCKET_STEP < max_tokens:
        size += _BUCKET_STEP
        buckets.append(size)
    buckets.append(max_tokens)
    return buckets


class PrefillStaging:
    """Host staging of one step, one pinned byte buffer ``host`` (one copy a step, of its
    used prefix: ``step_bytes``), for ``T = max_tokens`` rows and ``S = max_seqs``
    sequence slots:
    - ``host64`` [3 * T] int64: input_ids | positions | slot_mapping;
    - ``host32`` int32: query_start_loc [S + 1] | seq_lens [S] | tile table
      [tile_rows, 2] | block tables [S, max_blocks] (last: a step copies its own rows).
    """

    def __init__(
        self,
        max_tokens: int,
        max_seqs: int,
        max_blocks: int,
        block_size: int,
        tile_rows: int,
        pin: bool,
    ) -> None:
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        self.max_blocks, self.block_size = max_blocks, block_size
        self._bytes64 = 3 * max_tokens * 8
        self._tiles_at = 2 * max_seqs + 1  # int32 offsets in host32
        self._tables_at = self._tiles_at + 2 * tile_rows
        size = self._bytes64 + (self._tables_at + max_seqs * max_blocks) * 4
        self.host = torch.zeros(size, dtype=torch.uint8, pin_memory=pin)
        self.host64, self.host32 = self.views(self.host)
        self._i64, self._i32 = self.host64.numpy(), self.host32.numpy()
        self.step_bytes = size  # what the last fill needs copied

    def views(self, buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(int64 [3 * max_tokens], int32 [rest]) views of a uint8 buffer laid out as
        ``host`` (``host`` itself, or its device mirror)."""
        return int64_int32_views(buffer, self._bytes64)

    def parts(self, buffer32: torch.Tensor, tile_rows: int) -> dict[str, torch.Tensor]:
        """The int32 part's tensors (of ``host32`` or its device mirror): query_start_loc
        [S + 1], seq_lens [S], tiles [tile_rows, 2], block_tables [S, max_blocks]."""
        s, t = self.max_seqs, self._tiles_at
        return {
            "query_start_loc": buffer32[: s + 1],
            "seq_lens": buffer32[s + 1 : t],
            "tiles": buffer32[t : t + 2 * tile_rows].view(tile_rows, 2),
            "block_tables": buffer32[self._tables_at :].view(s, self.max_blocks),
        }

    def fits(self, scheduled: Sequence[ScheduledSequence]) -> bool:
        """A step of 1 to ``max_seqs`` chunks and 2 to ``max_tokens`` tokens, one chunk at
        least longer than a token (decode-only steps keep the decode kernel), its tokens
        all known and its tables within the buffer."""
        if not 1 <= len(scheduled) <= self.max_seqs:
            return False
        tokens = sum(s.num_new_tokens for s in scheduled)
        return (
            2 <= tokens <= self.max_tokens
            and any(s.num_new_tokens > 1 for s in scheduled)
            and not any(s.pending_token for s in scheduled)
            and all(len(s.seq.block_table) <= self.max_blocks for s in scheduled)
        )

    def fill(
        self, scheduled: Sequence[ScheduledSequence], tokens: int, block_q: int, tile_rows: int
    ) -> list[int]:
        """Write the step (``fits``) into the first ``tokens`` rows, padding after them,
        and its tile table at ``block_q`` queries a tile into ``tile_rows`` rows; returns
        query_start_loc of its chunks ([len(scheduled) + 1])."""
        t, bs, s_max = self.max_tokens, self.block_size, self.max_seqs
        i64, i32 = self._i64, self._i32
        query_start, lens = [0], []
        for k, s in enumerate(scheduled):
            at, n = query_start[-1], s.num_new_tokens
            start, end = s.start, s.start + n
            table = s.seq.block_table
            i64[at : at + n] = s.known_token_ids()
            i64[t + at : t + at + n] = range(start, end)
            i64[2 * t + at : 2 * t + at + n] = kv_slots(table, start, end, bs)
            i32[s_max + 1 + k] = end  # seq_lens
            row = self._tables_at + k * self.max_blocks
            i32[row : row + len(table)] = table
            query_start.append(at + n)
            lens.append(n)
        n = query_start[-1]
        i64[n:tokens] = 0
        i64[t + n : t + tokens] = 0
        i64[2 * t + n : 2 * t + tokens] = -1
        i32[: len(query_start)] = query_start
        i32[len(query_start) : s_max + 1] = n  # empty sequence slots
        tiles = prefill_tiles(lens, block_q, tile_rows)  # [tile_rows, 2]
        i32[self._tiles_at : self._tiles_at + 2 * tile_rows] = tiles.reshape(-1)
        self.step_bytes = self._bytes64 + 4 * (self._tables_at + len(scheduled) * self.max_blocks)
        return query_start

    def fill_stand_in(self, tokens: int, block_q: int, tile_rows: int) -> None:
        """Write a one-sequence step of ``tokens`` tokens that stores nothing (slot -1)
        and attends ``tokens`` positions, all in block 0 of the pool (which every pool
        has, however few blocks it holds): what a capture runs."""
        t, s_max = self.max_tokens, self.max_seqs
        self._i64[:tokens] = 0
        self._i64[t : t + tokens] = range(tokens)
        self._i64[2 * t : 2 * t + tokens] = -1
        self._i32[:] = 0
        self._i32[1 : s_max + 1] = tokens  # query_start_loc: (0, tokens, tokens, ...)
        self._i32[s_max + 1] = tokens  # seq_lens[0]
        tiles = prefill_tiles([tokens], block_q, tile_rows)
        self._i32[self._tiles_at : self._tiles_at + 2 * tile_rows] = tiles.reshape(-1)
        self.step_bytes = self.host.numel()


class PrefillGraphs:
    """Captured forwards of up to ``max_seqs`` sequences over ``buckets`` tokens
    (ascending).

    forward: runs the model on device tensors (KV caches bound by the caller).
    max_blocks: block-table width (``ceil(max_model_len / block_size)``).
    max_model_len: bound on any sequence's KV length (the metadata's ``max_seq_len``).
    block_m: the prefill attention's query rows per program for a bucket's token count
        (``kernels.prefill_attention.prefill_block_m`` of one prompt that long);
        ``group``: query heads per KV head (a tile holds ``block_m // group`` queries).
    """

    def __init__(
        self,
        forward: ForwardFn,
        *,
        buckets: Sequence[int],
        max_seqs: int,
        block_size: int,
        max_blocks: int,
        max_model_len: int,
        block_m: Callable[[int], int],
        group: int,
        device: torch.device,
    ) -> None:
        self.buckets = sorted(buckets)
        self.max_seqs = max_seqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.device = device
        self._forward = forward
        # per bucket: (block_m, queries a tile, tile-table rows)
        self._tiling: dict[int, tuple[int, int, int]] = {}
        for tokens in self.buckets:
            m = block_m(tokens)
            self._tiling[tokens] = (m, m // group, tile_capacity(tokens, max_seqs, m // group))
        rows = max(r for _, _, r in self._tiling.values())
        self.staging = PrefillStaging(
            self.buckets[-1], max_seqs, max_blocks, block_size, rows, pin=device.type == "cuda"
        )
        self._dev = self.staging.host.to(device)
        self._dev64, self._dev32 = self.staging.views(self._dev)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._copied: torch.cuda.Event | None = None
        self.capture_seconds = 0.0
        self.replays = 0
        self.mixed_replays = 0  # replays of steps of several sequences

    def inputs(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """What bucket ``tokens``' graph reads, as views of the device buffer: input ids
        [T], positions [T] and the metadata (``S`` sequence slots)."""
        t, seqs = self.staging.max_tokens, self.max_seqs
        block_m, _, rows = self._tiling[tokens]
        parts = self.staging.parts(self._dev32, rows)
        meta = AttentionMetadata(
            query_start_loc=parts["query_start_loc"],  # [S + 1]
            seq_lens=parts["seq_lens"],  # [S]
            block_tables=parts["block_tables"],  # [S, max_blocks]
            slot_mapping=self._dev64[2 * t : 2 * t + tokens],  # [T]
            query_lens_cpu=[tokens] * seqs,
            seq_lens_cpu=[self.max_model_len] * seqs,
            block_size=self.block_size,
            max_query_len=tokens,
            max_seq_len=self.max_model_len,
            prefill_tiles=parts["tiles"],  # [rows, 2]
            prefill_block_m=block_m,
        )
        return self._dev64[:tokens], self._dev64[t : t + tokens], meta

    @torch.inference_mode()
    def capture(self) -> float:
        """Warm up and capture every bucket, largest first (so smaller graphs reuse the
        pool's blocks). Returns the seconds it took."""
        started = time.perf_counter()
        pool = None
        for tokens in reversed(self.buckets):
            _, block_q, rows = self._tiling[tokens]
            self.staging.fill_stand_in(tokens, block_q, rows)
            self._dev.copy_(self.staging.host)
            ids, positions, meta = self.inputs(tokens)
            graph, out = warm_and_capture(
                lambda: self._forward(ids, positions, meta),  # noqa: B023 (called at once)
                self.device,
                pool,
            )
            pool = graph.pool()
            self._graphs[tokens], self._outputs[tokens] = graph, out
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - started
        log.info(
            "captured %d prefill CUDA graphs (%d to %d tokens, up to %d sequences) in %.2f s",
            len(self._graphs),
            self.buckets[0],
            self.buckets[-1],
            self.max_seqs,
            self.capture_seconds,
        )
        return self.capture_seconds

    def bucket(self, tokens: int) -> int | None:
        """The smallest captured token count that holds ``tokens``; None if none does."""
        return next((b for b in self.buckets if b >= tokens), None)

    def fits(self, scheduled: Sequence[ScheduledSequence]) -> bool:
        """Whether ``run`` takes this step (``PrefillStaging.fits``)."""
        return bool(self._graphs) and self.staging.fits(scheduled)

    def stage(self, scheduled: Sequence[ScheduledSequence]) -> tuple[int, list[int]]:
        """Write the step into the device buffer: returns its bucket (the graph to replay,
        whose ``inputs`` now hold the step) and where each chunk's rows start
        (query_start_loc, [B + 1])."""
        n = sum(s.num_new_tokens for s in scheduled)
        tokens = self.bucket(n)
        if tokens is None:
            raise ValueError(f"no prefill graph holds {n} tokens")
        if self._copied is not None:  # the staging buffer may still be in flight
            self._copied.synchronize()
        _, block_q, rows = self._tiling[tokens]
        query_start = self.staging.fill(scheduled, tokens, block_q, rows)
        size = self.staging.step_bytes
        self._dev[:size].copy_(self.staging.host[:size], non_blocking=True)
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()
        return tokens, query_start

    def run(
        self, scheduled: Sequence[ScheduledSequence]
    ) -> tuple[torch.Tensor, list[int]]:  # ([n, hidden], query_start_loc [B + 1])
        """Stage the step and replay the graph of its bucket: the hidden states of its
        ``n`` tokens, on the device and valid until the next replay, and where each
        chunk's rows start."""
        tokens, query_start = self.stage(scheduled)
        if tokens not in self._graphs:
            raise ValueError(f"the prefill graph of {tokens} tokens was not captured")
        self._graphs[tokens].replay()
        self.replays += 1
        self.mixed_replays += len(scheduled) > 1
        return self._outputs[tokens][: query_start[-1]], query_start
