"""``host_to_device``: small host-built tensors reach the device with their values, and on
CUDA without waiting for the kernels queued before them."""

from __future__ import annotations

import pytest
import torch

from jacana_engine.worker.host_to_device import index_on, to_device


def test_values_and_dtype_on_the_cpu():
    index = index_on([3, 0, 2], torch.device("cpu"))
    assert index.dtype == torch.int64 and index.tolist() == [3, 0, 2]
    floats = to_device(torch.tensor([0.5, 2.0]), torch.device("cpu"))
    assert floats.tolist() == [0.5, 2.0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_copy_queues_behind_running_kernels_instead_of_waiting():
    """With ~50 ms of GPU work queued, the call returns while that work still runs (a
    copy from pageable memory would wait for it), and the values arrive in order."""
    device = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(100_000_000)  # ~50 ms of spinning at ~2 GHz
    busy = torch.cuda.Event()
    busy.record()
    index = index_on(list(range(1000)), device)
    assert not busy.query(), "the host waited for the queued kernels"
    torch.cuda.synchronize()
    assert index.tolist() == list(range(1000))
