"""Tokenization in worker processes, for hosts where the service's own process is busy.

Why: in one process the tokenizer's calls and the model's batch thread share one
interpreter lock, and a GPU batch needs it for each of its ~100 kernel launches; on an
H200 host the two stages, each fast alone (tens of thousands of texts/s), held each
other to about half of that. Workers keep their own lock and thread pool, so only the
texts and their ids cross over (pickled; the ids as one int32 array per input).

Who owns what: :func:`start_tokenizer_workers` returns the pool (the caller shuts it
down); each worker process owns one :class:`TextTokenizer`, loaded once from the same
``tokenizer.json`` as the service's own, with its cores split evenly among the workers.
Workers are started with ``spawn`` (the parent may have CUDA up).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, wait

import numpy as np

from jacana_embeddings.errors import InvalidRequestError
from jacana_embeddings.tokenizer import TextTokenizer

_worker_tokenizer: TextTokenizer | None = None


def _start_worker(tokenizer: TextTokenizer, threads: int) -> None:
    global _worker_tokenizer
    # Set before the first parallel encode builds the tokenizer's thread pool (the
    # tokenizer itself arrived pickled as its file, and was loaded afresh here).
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    _worker_tokenizer = tokenizer


def encode_in_worker(
    requests: Sequence[tuple[Sequence[str], bool]],
) -> list[list[tuple[np.ndarray, bool]] | InvalidRequestError]:
    """``TextTokenizer.encode_requests`` in a worker (the callable the pool runs), each
    input's ids as an int32 array: one buffer to pickle and unpickle instead of a Python
    int per token, and the batcher joins arrays without touching each id."""
    if _worker_tokenizer is None:
        raise RuntimeError("encode_in_worker runs in a tokenizer worker process only")
    return [
        result
        if isinstance(result, InvalidRequestError)
        else [(np.asarray(ids, dtype=np.int32), truncated) for ids, truncated in result]
        for result in _worker_tokenizer.encode_requests(requests)
    ]


def start_tokenizer_workers(
    tokenizer: TextTokenizer, processes: int, wait_started: bool = True
) -> ProcessPoolExecutor:
    """A pool of ``processes`` workers, each tokenizing like ``tokenizer``; with
    ``wait_started`` it returns once all have started, else they start as calls come."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    threads = max(1, (os.cpu_count() or 1) // processes)
    pool = ProcessPoolExecutor(
        processes,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(tokenizer, threads),
    )
    if wait_started:  # now, rather than on the first requests (a spawn costs ~1 s)
        wait([pool.submit(encode_in_worker, [(["warm up"], False)]) for _ in range(processes)])
    return pool
