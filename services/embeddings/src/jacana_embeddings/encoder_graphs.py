"""The encoder's forward pass over fixed padded grids, captured as CUDA graphs.

Why: on a GPU a MiniLM-sized batch is ~100 small kernels. Launched from Python, each
launch needs the interpreter lock, which the service's tokenizer threads and event loop
want too, so under load the model thread spends several times longer launching than the
GPU computing. A replayed graph is one launch per batch.

How: a set of buckets, padded grids of B rows x S tokens (:func:`bucket_shapes`), each
with its own static tensors (:class:`~jacana_embeddings.varlen.PaddedLayout`); on CUDA
each bucket's pass is captured at start-up (:meth:`EncoderGraphs.prepare`), the largest
first, all in one memory pool. A batch runs in the smallest bucket that holds it: its
ids and lengths go up in one copy from a pinned staging buffer, the graph replays, and its
rows of the output are copied out. The staging buffer is filled under the bucket's lock;
the copy, replay and copy-out are queued under one lock shared by every bucket. That
second lock matters: in a shared pool one bucket's output may sit in memory that another
bucket's graph uses as scratch, so no other replay may be queued between a bucket's
replay and the copy of its output (stream order does the rest). A batch no bucket holds
returns None: the caller runs it eagerly.

Without capture (``capture=False``, or a CPU device) the same static-tensor path runs
eagerly: the CPU tests check its arithmetic against the packed path with it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from jacana_embeddings.varlen import PaddedLayout, flatten_ids, grid_positions

# ids [B*S] int64 and the bucket's layout -> vectors [B, D] float32
PaddedForward = Callable[[torch.Tensor, PaddedLayout], torch.Tensor]

_MIN_LEN = 16  # shortest bucket length
_MIN_ROWS = 8  # fewest bucket rows


def bucket_shapes(max_len: int, max_grid_tokens: int) -> list[tuple[int, int]]:
    """``(rows, length)`` of every bucket, largest grid first.

    Lengths: powers of two from 16 up to ``max_len`` (and ``max_len`` itself). Rows: 8,
    12, 16, 24, 32, ... (powers of two and 1.5x them, so a batch pads by at most half)
    while ``rows * length <= max_grid_tokens``.
    """
    lengths = []
    s = _MIN_LEN
    while s < max_len:
        lengths.append(s)
        s *= 2
    lengths.append(max_len)
    shapes = []
    for s in lengths:
        b = _MIN_ROWS
        while b * s <= max_grid_tokens:
            shapes.append((b, s))
            b = b * 3 // 2 if b & (b - 1) == 0 else b * 4 // 3  # 8, 12, 16, 24, 32, ...
    return sorted(shapes, key=lambda bs: (-bs[0] * bs[1], -bs[1]))


@dataclass
class _Bucket:
    rows: int
    length: int
    staging: torch.Tensor  # [rows*length + rows] int64 on the host (pinned on CUDA)
    inputs: torch.Tensor  # the same on the device: ids, then lengths
    layout: PaddedLayout
    lock: threading.Lock
    uploaded: torch.cuda.Event | None = None  # the staging buffer's last upload
    graph: torch.cuda.CUDAGraph | None = None
    out: torch.Tensor | None = None  # [rows, D] float32, the graph's output

    @property
    def ids(self) -> torch.Tensor:
        return self.inputs[: self.rows * self.length]


class EncoderGraphs:
    """``run(token id lists) -> vectors [N, D]``, or None when no bucket holds the batch.

    ``forward`` is the whole pass (encoder, pooling, heads) over a bucket's static
    tensors; it must call ``layout.refresh()`` first. Call :meth:`prepare` once before
    the first :meth:`run`; ``run`` may be called from several threads at once.
    """

    def __init__(
        self,
        forward: PaddedForward,
        pad_token_id: int,
        device: torch.device,
        max_len: int,
        max_grid_tokens: int,
        capture: bool = True,
    ) -> None:
        self.forward = forward
        self.pad_token_id = pad_token_id
        self.device = device
        self.capture = capture and device.type == "cuda"
        self.shapes = bucket_shapes(max_len, max_grid_tokens)
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._replay_lock = threading.Lock()  # upload, replay, copy-out: see the module doc
        self.replays = 0  # batches run through a bucket (graph or eager static path)

    def prepare(self) -> float:
        """Allocate every bucket and, on CUDA, capture its pass; returns the seconds."""
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle() if self.capture else None
        for rows, length in self.shapes:
            bucket = self._allocate(rows, length)
            if self.capture:
                self._capture(bucket, pool)
            self._buckets[rows, length] = bucket
        if self.capture:
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - started

    def bucket_for(self, lengths: Sequence[int]) -> tuple[int, int] | None:
        """The smallest bucket (fewest cells) holding ``lengths``, or None."""
        longest, count = max(lengths), len(lengths)
        fits = [(b, s) for b, s in self._buckets if s >= longest and b >= count]
        return min(fits, key=lambda bs: bs[0] * bs[1]) if fits else None

    @torch.inference_mode()
    def run(self, batch: Sequence[Sequence[int]]) -> np.ndarray | None:
        """Vectors for the non-empty, in-range token id lists of ``batch``, in order."""
        lengths = [len(ids) for ids in batch]
        key = self.bucket_for(lengths)
        if key is None:
            return None
        bucket = self._buckets[key]
        cells = bucket.rows * bucket.length
        flat = flatten_ids(batch)
        where = grid_positions(lengths, bucket.length)  # [T]: grid cell of each token
        with bucket.lock:
            if bucket.uploaded is not None:
                bucket.uploaded.synchronize()  # the previous upload has left the buffer
            host = bucket.staging.numpy()
            host[:cells] = self.pad_token_id
            host[where] = flat
            host[cells:] = 1  # filler rows: one token each
            host[cells : cells + len(lengths)] = lengths
            with self._replay_lock:
                bucket.inputs.copy_(bucket.staging, non_blocking=True)
                if bucket.uploaded is not None:
                    bucket.uploaded.record()
                if bucket.graph is not None:
                    bucket.graph.replay()
                    out = bucket.out
                else:
                    out = self.forward(bucket.ids, bucket.layout)
                vectors = out[: len(batch)].clone()  # queued before any other replay
                self.replays += 1
        return vectors.cpu().numpy()

    def _allocate(self, rows: int, length: int) -> _Bucket:
        size = rows * length + rows
        on_cuda = self.device.type == "cuda"
        staging = torch.empty(size, dtype=torch.int64, pin_memory=on_cuda)
        inputs = torch.ones(size, dtype=torch.int64, device=self.device)
        inputs[: rows * length] = self.pad_token_id
        layout = PaddedLayout(rows, length, inputs[rows * length :])
        return _Bucket(
            rows,
            length,
            staging,
            inputs,
            layout,
            threading.Lock(),
            uploaded=torch.cuda.Event() if on_cuda else None,
        )

    def _capture(self, bucket: _Bucket, pool) -> None:
        # One eager pass on a side stream first: it picks the kernels (cuBLAS and SDPA
        # choose per shape) and allocates their workspaces outside the capture.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.inference_mode():
            self.forward(bucket.ids, bucket.layout)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool), torch.inference_mode():
            bucket.out = self.forward(bucket.ids, bucket.layout)
        bucket.graph = graph
