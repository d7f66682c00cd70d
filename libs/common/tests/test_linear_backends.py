"""Dense-layer backends: oneDNN's fused linear agrees with torch; selection and fallback."""

from __future__ import annotations

import pytest
import torch

from jacana_common.linear_backends import (
    ACTIVATIONS,
    OneDnnLinear,
    TorchLinear,
    select_linear_backend,
)

CPU = torch.device("cpu")
ONEDNN_MISSING = OneDnnLinear.usable(torch.float32)


@pytest.mark.skipif(ONEDNN_MISSING is not None, reason=f"oneDNN: {ONEDNN_MISSING}")
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_matches_torch(activation, bias):
    g = torch.Generator().manual_seed(sorted(ACTIVATIONS).index(activation))
    x = torch.randn(37, 96, generator=g)  # [N, in]
    w = torch.randn(160, 96, generator=g) / 10  # [out, in]
    b = torch.randn(160, generator=g) if bias else None
    with torch.inference_mode():
        got = OneDnnLinear().linear(x, w, b, activation)
        want = TorchLinear().linear(x, w, b, activation)
    assert got.shape == (37, 160)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_explicit_choices():
    assert select_linear_backend("torch", CPU, torch.float32).name == "torch"
    with pytest.raises(ValueError, match="unknown linear backend"):
        select_linear_backend("blas", CPU, torch.float32)


def test_auto_prefers_onednn_on_cpu_and_torch_on_cuda():
    expected = "onednn" if ONEDNN_MISSING is None else "torch"
    assert select_linear_backend("auto", CPU, torch.float32).name == expected
    cuda = torch.device("cuda")  # only the device type is looked at
    assert select_linear_backend("auto", cuda, torch.bfloat16).name == "torch"
    with pytest.raises(ValueError, match="CPU only"):
        select_linear_backend("onednn", cuda, torch.bfloat16)


def test_without_onednn_auto_falls_back_and_onednn_fails_clearly(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert OneDnnLinear.usable(torch.float32) == "this torch build has no oneDNN"
    assert select_linear_backend("auto", CPU, torch.float32).name == "torch"
    with pytest.raises(ValueError, match="no oneDNN"):
        select_linear_backend("onednn", CPU, torch.float32)
