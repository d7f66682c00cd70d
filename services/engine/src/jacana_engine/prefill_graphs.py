"""CUDA graphs for one sequence's prompt chunk: an eager prefill's host calls in one replay.

Why: an eager prefill step costs the host one Python call chain per kernel (~10 a layer).
On an H200's host that is 11-24 ms for the 28 layers of Qwen3-0.6B, whose GPU work for a
1024-token prompt is 3 ms, and on slow hosts more than the 8B's 22-24 ms
(``bench/prefill_host_gpu.py``): the first token waits for Python, not for the GPU. A
replayed graph launches the same kernels for the price of one call.

What is captured: the forward of one sequence over ``T`` token rows, for each ``T`` of
``prefill_buckets``. A chunk of ``n`` tokens (a prompt, a chunk of a long one after its
cached prefix, or a verifying step's tokens) runs in the smallest ``T >= n``: its tokens
in rows ``0..n-1``, padding after them (token 0 at position 0, slot -1: no KV write).
The attention's ``query_start_loc`` ([0, n]) leaves the padding rows uncovered, so the
prefill kernel skips them; their hidden states are garbage and dropped.

A chunk of exactly ``T`` tokens runs the kernels, grids and GEMM shapes of the eager
step, so it gives the same bits; a shorter one runs its GEMMs over ``T`` rows, which may
pick other cuBLAS kernels and round differently (the attention is the same either way).

State ownership as in ``cuda_graphs.DecodeGraphs``: this class owns its static buffers
(one pinned host staging buffer, its device mirror), the graphs and their memory pool;
the model and the KV caches stay the runner's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from jacana_engine.attention_metadata import AttentionMetadata, kv_slots
from jacana_engine.cuda_graphs import ForwardFn, int64_int32_views, warm_and_capture
from jacana_engine.scheduler import ScheduledSequence

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
    """Host staging of one chunk, one pinned byte buffer ``host`` (one copy a step):
    - ``host64`` [3 * max_tokens] int64: input_ids | positions | slot_mapping;
    - ``host32`` [3 + max_blocks] int32: query_start_loc (0, n) | seq_len | block table.
    """

    def __init__(self, max_tokens: int, max_blocks: int, block_size: int, pin: bool) -> None:
        self.max_tokens, self.max_blocks, self.block_size = max_tokens, max_blocks, block_size
        self._bytes64 = 3 * max_tokens * 8
        size = self._bytes64 + (3 + max_blocks) * 4
        self.host = torch.zeros(size, dtype=torch.uint8, pin_memory=pin)
        self.host64, self.host32 = self.views(self.host)
        self._i64, self._i32 = self.host64.numpy(), self.host32.numpy()

    def views(self, buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(int64 [3 * max_tokens], int32 [3 + max_blocks]) views of a uint8 buffer laid
        out as ``host`` (``host`` itself, or its device mirror)."""
        return int64_int32_views(buffer, self._bytes64)

    def fits(self, scheduled: Sequence[ScheduledSequence]) -> bool:
        """One chunk of 2 to ``max_tokens`` tokens (one token is a decode step's, which
        the decode graphs hold) whose table fits the buffer, its tokens all known."""
        if len(scheduled) != 1:
            return False
        s = scheduled[0]
        return (
            2 <= s.num_new_tokens <= self.max_tokens
            and not s.pending_token
            and len(s.seq.block_table) <= self.max_blocks
        )

    def fill(self, s: ScheduledSequence, tokens: int) -> None:
        """Write chunk ``s`` (``fits``) into the first ``tokens`` rows, padding after it."""
        t, n, bs = self.max_tokens, s.num_new_tokens, self.block_size
        start, end = s.start, s.start + s.num_new_tokens
        table = s.seq.block_table
        i64, i32 = self._i64, self._i32
        i64[:n] = s.known_token_ids()
        i64[n:tokens] = 0
        i64[t : t + n] = range(start, end)
        i64[t + n : t + tokens] = 0
        i64[2 * t : 2 * t + n] = kv_slots(table, start, end, bs)
        i64[2 * t + n : 2 * t + tokens] = -1
        i32[:3] = (0, n, end)
        i32[3 : 3 + len(table)] = table

    def fill_stand_in(self, tokens: int) -> None:
        """Write a chunk of ``tokens`` tokens that stores nothing (slot -1) and attends
        ``tokens`` positions, all in block 0 of the pool (which every pool has, however
        few blocks it holds): what a capture runs."""
        t = self.max_tokens
        self._i64[:tokens] = 0
        self._i64[t : t + tokens] = range(tokens)
        self._i64[2 * t : 2 * t + tokens] = -1
        self._i32[:3] = (0, tokens, tokens)
        self._i32[3:] = 0


class PrefillGraphs:
    """Captured one-sequence forwards of ``buckets`` tokens (ascending).

    forward: runs the model on device tensors (KV caches bound by the caller).
    max_blocks: block-table width (``ceil(max_model_len / block_size)``).
    max_model_len: bound on any sequence's KV length (the metadata's ``max_seq_len``).
    """

    def __init__(
        self,
        forward: ForwardFn,
        *,
        buckets: Sequence[int],
        block_size: int,
        max_blocks: int,
        max_model_len: int,
        device: torch.device,
    ) -> None:
        self.buckets = sorted(buckets)
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.device = device
        self._forward = forward
        self.staging = PrefillStaging(self.buckets[-1], max_blocks, block_size, pin=True)
        self._dev = self.staging.host.to(device)
        self._dev64, self._dev32 = self.staging.views(self._dev)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._copied: torch.cuda.Event | None = None
        self.capture_seconds = 0.0
        self.replays = 0

    def _inputs(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        t, blocks = self.staging.max_tokens, self.staging.max_blocks
        meta = AttentionMetadata(
            query_start_loc=self._dev32[:2],  # [2]: 0, n
            seq_lens=self._dev32[2:3],  # [1]
            block_tables=self._dev32[3 : 3 + blocks].view(1, blocks),  # [1, max_blocks]
            slot_mapping=self._dev64[2 * t : 2 * t + tokens],  # [T]
            query_lens_cpu=[tokens],
            seq_lens_cpu=[self.max_model_len],
            block_size=self.block_size,
            max_query_len=tokens,
            max_seq_len=self.max_model_len,
        )
        return self._dev64[:tokens], self._dev64[t : t + tokens], meta

    @torch.inference_mode()
    def capture(self) -> float:
        """Warm up and capture every bucket, largest first (so smaller graphs reuse the
        pool's blocks). Returns the seconds it took."""
        started = time.perf_counter()
        pool = None
        for tokens in reversed(self.buckets):
            self.staging.fill_stand_in(tokens)
            self._dev.copy_(self.staging.host)
            ids, positions, meta = self._inputs(tokens)
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
            "captured %d prefill CUDA graphs (%d to %d tokens) in %.2f s",
            len(self._graphs),
            self.buckets[0],
            self.buckets[-1],
            self.capture_seconds,
        )
        return self.capture_seconds

    def bucket(self, tokens: int) -> int | None:
        """The smallest captured token count that holds ``tokens``; None if none does."""
        return next((b for b in self.buckets if b >= tokens), None)

    def fits(self, scheduled: Sequence[ScheduledSequence]) -> bool:
        """Whether ``run`` takes this step (``PrefillStaging.fits``)."""
        return bool(self._graphs) and self.staging.fits(scheduled)

    def run(self, s: ScheduledSequence) -> torch.Tensor:  # [n, hidden]
        """Stage chunk ``s`` and replay the graph of its bucket: the hidden states of its
        ``n`` tokens, on the device and valid until the next replay."""
        tokens = self.bucket(s.num_new_tokens)
        if tokens is None or tokens not in self._graphs:
            raise ValueError(f"no prefill graph holds {s.num_new_tokens} tokens")
        if self._copied is not None:  # the staging buffer may still be in flight
            self._copied.synchronize()
        self.staging.fill(s, tokens)
        self._dev.copy_(self.staging.host, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        self._graphs[tokens].replay()
        self.replays += 1
        return self._outputs[tokens][: s.num_new_tokens]
