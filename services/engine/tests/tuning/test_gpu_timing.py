"""``gpu_timing`` on a CUDA GPU: a captured graph's pace, plain and under sustained load."""

from __future__ import annotations

import pytest
import torch

from jacana_engine.tuning.gpu_timing import replay_seconds, sustained_replay_seconds

pytestmark = pytest.mark.gpu  # skipped without a CUDA device (root conftest.py)


def test_sustained_pace_agrees_with_short_timings_of_the_same_graph():
    a = torch.randn(2048, 2048, device="cuda")
    out = torch.empty_like(a)
    torch.matmul(a, a, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.matmul(a, a, out=out)
    short = replay_seconds(graph, 20)
    sustained = sustained_replay_seconds(graph, 0.3)
    # the card may settle slower under load, never faster than a cool start by much
    assert 0.5 * short < sustained < 3 * short
    assert torch.allclose(out, a @ a, rtol=1e-3, atol=1e-2)
