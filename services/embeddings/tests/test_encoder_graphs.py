"""Padded-grid buckets of the encoder (the CUDA-graph path) against the packed path.

On the CPU nothing is captured: the buckets' static tensors run eagerly, which is the
arithmetic a replay repeats, so these tests check the bucketing, the padding, the
filler rows and the static-buffer bookkeeping (the encoder over a padded grid itself:
``test_encoders.py``). Capture and replay on a GPU are covered
by the gpu-marked test at the end.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from jacana_embeddings.config import EmbedderConfig
from jacana_embeddings.embedder import Embedder
from jacana_embeddings.encoder_graphs import bucket_shapes
from jacana_embeddings.settings import DEFAULT_MODEL_ID
from jacana_embeddings.varlen import grid_positions


def test_bucket_shapes_cover_lengths_and_rows_within_the_budget():
    shapes = bucket_shapes(max_len=200, max_grid_tokens=4096)
    assert {s for _, s in shapes} == {16, 32, 64, 128, 200}
    assert all(b * s <= 4096 for b, s in shapes)
    assert [b for b, s in shapes if s == 16] == sorted(
        [8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256], reverse=True
    )
    cells = [b * s for b, s in shapes]
    assert cells == sorted(cells, reverse=True)  # captured largest first


def test_grid_positions_places_each_token_in_its_row():
    assert grid_positions([2, 3, 1], 4).tolist() == [0, 1, 4, 5, 6, 8]


@pytest.fixture(scope="module")
def graphed(model_dir) -> Embedder:
    return Embedder(
        EmbedderConfig(model_dir=model_dir, model_id=DEFAULT_MODEL_ID, graph_tokens=2048)
    )


def _batch(lengths, seed=0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[101, *rng.integers(1000, 29000, n - 2).tolist(), 102] for n in lengths]


@pytest.mark.parametrize(
    "lengths",
    [[5], [3, 17, 40, 9, 12], [128] * 9, [7] * 30, [100, 3]],
    ids=["one", "mixed", "full-length", "many-short", "long-and-short"],
)
def test_bucketed_vectors_equal_the_packed_ones(graphed, embedder, lengths):
    batch = _batch(lengths)
    before = graphed.graphs.replays
    got = graphed.embed(batch)
    assert graphed.graphs.replays == before + 1  # it ran in a bucket
    np.testing.assert_allclose(got, embedder.embed(batch), atol=2e-5, rtol=1e-4)


def test_a_batch_no_bucket_holds_runs_packed(graphed, embedder):
    batch = _batch([20] * 200)  # 200 rows x 32 cells > 2048
    before = graphed.graphs.replays
    got = graphed.embed(batch)
    assert graphed.graphs.replays == before
    np.testing.assert_allclose(got, embedder.embed(batch), atol=2e-5, rtol=1e-4)


def test_concurrent_batches_in_one_bucket_keep_their_own_vectors(graphed, embedder):
    batches = [_batch([11, 6, 14], seed=i) for i in range(8)]
    expected = [embedder.embed(b) for b in batches]
    results: dict[int, np.ndarray] = {}

    def worker(indices):
        for i in indices:
            results[i] = graphed.embed(batches[i])

    threads = [threading.Thread(target=worker, args=(range(k, 8, 2),)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, want in enumerate(expected):
        np.testing.assert_allclose(results[i], want, atol=2e-5, rtol=1e-4)


@pytest.mark.gpu
def test_captured_graphs_replay_new_batches_on_cuda(model_dir):
    device = torch.device("cuda")
    kwargs = dict(model_dir=model_dir, model_id=DEFAULT_MODEL_ID, device="cuda", dtype="float16")
    graphed = Embedder(EmbedderConfig(**kwargs, graph_tokens=8192))
    eager = Embedder(EmbedderConfig(**kwargs))
    assert graphed.graphs.capture and device.type == "cuda"
    for seed, lengths in enumerate([[128] * 40, [128] * 33, [3, 50, 17], [64] * 100]):
        batch = _batch(lengths, seed)
        got, want = graphed.embed(batch), eager.embed(batch)
        assert _cosines(got, want).min() > 0.9999, lengths[:3]
    assert graphed.graphs.replays == 4


@pytest.mark.gpu
def test_threads_replaying_different_buckets_keep_their_own_vectors_on_cuda(model_dir):
    # One memory pool: a bucket's output may be another bucket's scratch, so a replay
    # queued between another bucket's replay and its copy-out would overwrite it.
    kwargs = dict(model_dir=model_dir, model_id=DEFAULT_MODEL_ID, device="cuda", dtype="float16")
    graphed = Embedder(EmbedderConfig(**kwargs, graph_tokens=16384))
    eager = Embedder(EmbedderConfig(**kwargs))
    shapes = [[128] * 40, [128] * 100, [64] * 7, [30] * 200, [16] * 9, [100] * 60]
    batches = [_batch(lengths, seed) for seed, lengths in enumerate(shapes)]
    expected = [eager.embed(b) for b in batches]
    worst: list[float] = []

    def worker(offset: int) -> None:
        for step in range(60):
            i = (step + offset) % len(batches)
            worst.append(float(_cosines(graphed.embed(batches[i]), expected[i]).min()))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(worst) == 180 and min(worst) > 0.9999, min(worst)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
