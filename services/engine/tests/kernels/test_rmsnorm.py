"""RMSNorm and fused residual-add + RMSNorm against the HF-ordered reference.

Tolerance: float32 within 4 ulp (float32 vs float64 statistics); bfloat16 within 2 ulp
(both sides round at the same points, but the float32 statistics and the approximate
rsqrt may flip the last bit of the normalized value, which the weight product can carry
to a second ulp: seen on 9 of 16.8M elements on an H200).
Outputs are poisoned with NaN; out-of-place calls must leave the inputs unmodified, and the
in-place form must give the same bits.

The statistics follow torch's CUDA ``mean`` order: checked exactly against the order's
emulation here (the emulation itself was checked pair by pair against torch on an H200),
and on the GPU against transformers' RMSNorm formula run by torch itself, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import triton
import triton.language as tl

from jacana_engine.kernels._row_sum_order import (
    halved_sum_from,
    row_sum_of_squares,
    torch_row_sum_order,
)
from jacana_engine.kernels.reference import (
    fused_add_rms_norm_reference,
    halving_sum,
    rms_norm_reference,
    torch_cuda_row_sum_reference,
    transformers_rms_norm,
)
from jacana_engine.kernels.rmsnorm import fused_add_rms_norm, rms_norm

ULPS = {torch.float32: 4, torch.bfloat16: 2}


def _dtypes(device) -> list[torch.dtype]:
    return [torch.float32, torch.bfloat16] if device.type == "cuda" else [torch.float32]


def _check(device, seed, checks, tokens, hidden, dtype) -> None:
    eps = 1e-6
    x = (torch.randn(tokens, hidden, device=device) * 3).to(dtype)
    residual = torch.randn(tokens, hidden, device=device).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden, device=device)).to(dtype)
    x_in, r_in = x.clone(), residual.clone()
    what = f"{dtype} hidden={hidden}"

    out = torch.full_like(x, float("nan"))
    rms_norm(x, weight, eps, out=out)
    ref = rms_norm_reference(x, weight, eps)
    checks.ulps(out, ref, ulps=ULPS[dtype], seed=seed, what=f"rms_norm {what}")

    normed = torch.full_like(x, float("nan"))
    new_residual = torch.full_like(x, float("nan"))
    fused_add_rms_norm(x, residual, weight, eps, out=normed, residual_out=new_residual)
    ref_normed, ref_residual = fused_add_rms_norm_reference(x, residual, weight, eps)
    assert torch.equal(new_residual, ref_residual), f"seed={seed}: residual sum differs"
    checks.ulps(normed, ref_normed, ulps=ULPS[dtype], seed=seed, what=f"fused {what}")
    assert torch.equal(x, x_in) and torch.equal(residual, r_in), f"seed={seed}: inputs modified"

    # in place, as a decoder layer chains it
    fused_add_rms_norm(x, residual, weight, eps, out=x, residual_out=residual)
    assert torch.equal(x, normed) and torch.equal(residual, ref_residual), f"seed={seed}"


@pytest.mark.parametrize("tokens,hidden", [(7, 96), (3, 1000)])
def test_rms_norm_small(device, seed, checks, tokens, hidden):
    for dtype in _dtypes(device):
        _check(device, seed, checks, tokens, hidden, dtype)


def test_rms_norm_strided_rows(device, seed, checks):
    """Rows of a wider buffer (row stride != hidden)."""
    base = torch.randn(5, 80, device=device)
    x = base[:, :64]
    weight = torch.randn(64, device=device)
    checks.ulps(rms_norm(x, weight, 1e-5), rms_norm_reference(x, weight, 1e-5), ulps=4, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [4096, 5120])
def test_rms_norm_gpu(gpu, device, seed, checks, hidden):
    _check(device, seed, checks, 4096, hidden, torch.bfloat16)


# (hidden, rows in the launch): vector and strided loads, 1 to 5 passes, every width
SUM_SHAPES = [(576, 1), (576, 3), (576, 8), (576, 16), (1000, 5), (2048, 2), (4096, 1),
              (128, 1), (128, 64), (96, 3)]  # fmt: skip


def test_torch_row_sum_order_widths():
    """Threads a row and load pattern as read off torch's CUDA mean on an H200, pair by
    pair: 576 values, 128 threads for 1 to 5 rows, 64 for 8, 32 from 16; 128 and 256
    values load 4 consecutive values a thread, 96 do not."""
    widths = {rows: torch_row_sum_order(576, rows).width for rows in (1, 2, 3, 4, 5, 8, 16, 64)}
    assert widths == {1: 128, 2: 128, 3: 128, 4: 128, 5: 128, 8: 64, 16: 32, 64: 32}
    read_off = {(128, 64): (32, True), (128, 1): (32, True), (96, 16): (32, False),
                (256, 16): (32, True)}  # fmt: skip
    for (hidden, rows), (width, vector) in read_off.items():
        order = torch_row_sum_order(hidden, rows)
        assert (order.width, order.vector) == (width, vector), (hidden, rows, order)
    for hidden, rows in SUM_SHAPES:
        order = torch_row_sum_order(hidden, rows)
        covered = order.passes * order.width * 4
        assert covered >= hidden > covered - order.width * 4, (hidden, rows, order)


@triton.jit
def _row_sums_kernel(x_ptr, out_ptr, n, stride, SUM_WIDTH: tl.constexpr,
                     SUM_VECTOR: tl.constexpr, SUM_PASSES: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    total = row_sum_of_squares(x_ptr + row * stride, n, SUM_WIDTH, SUM_VECTOR, SUM_PASSES)
    tl.store(out_ptr + row, total)


@pytest.mark.parametrize("hidden,rows", SUM_SHAPES)
def test_row_sum_of_squares_in_torch_order(device, seed, hidden, rows):
    """The kernels' sum of squares has the bits of the emulated torch order, which the
    plain float32 sum does not always have (so the order is what is tested)."""
    x = (torch.randn(rows, hidden, device=device) * 4).to(torch.bfloat16)
    order = torch_row_sum_order(hidden, rows)
    got = torch.full((rows,), float("nan"), device=device)
    _row_sums_kernel[(rows,)](x, got, hidden, x.stride(0), **order.constexprs())
    want = torch_cuda_row_sum_reference(x.float().pow(2), order.width, order.vector)
    assert torch.equal(got, want), f"seed={seed}: {(got != want).sum()} of {rows} rows differ"


@triton.jit
def _halved_sums_kernel(x_ptr, out_ptr, n, stride, LANES: tl.constexpr):
    row = tl.program_id(0)
    tl.store(out_ptr + row, halved_sum_from(x_ptr + row * stride, n, LANES))


@pytest.mark.parametrize("lanes", [16, 32, 128, 512])
def test_halved_sum_from_memory_halves_as_torch(device, seed, lanes):
    """A split norm's consumer adds the producer's thread sums read in slices of 32: the
    bits of torch's pairwise halving (upper half onto lower, level by level), the values
    past n read as zeros, and not those of a left-to-right sum on some rows (so the order
    is what is tested)."""
    sums = torch.randn(64, lanes, device=device) * torch.rand(64, lanes, device=device) * 50
    for n in (lanes, lanes - 3):
        got = torch.full((64,), float("nan"), device=device)
        _halved_sums_kernel[(64,)](sums, got, n, sums.stride(0), LANES=lanes)
        want = halving_sum(torch.nn.functional.pad(sums[:, :n], (0, lanes - n)))
        assert torch.equal(got, want), f"seed={seed} n={n}: {(got != want).sum()} rows differ"
    left_to_right = sums[:, 0]
    for column in range(1, n):
        left_to_right = left_to_right + sums[:, column]
    assert (want != left_to_right).any()


def test_row_sum_order_is_not_the_plain_sum(device):
    """The emulated order and a plain sum differ on some rows, or the test above proves
    nothing about the order."""
    torch.manual_seed(0)
    x = (torch.randn(256, 576, device=device) * 4).to(torch.bfloat16).float().pow(2)
    order = torch_row_sum_order(576, 256)
    assert (torch_cuda_row_sum_reference(x, order.width, order.vector) != x.sum(-1)).any()


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [576, 1024, 2048, 4096, 5120, 128])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 16, 64, 300])
def test_rms_norm_has_torchs_bits_gpu(gpu, device, seed, hidden, rows):
    """On the GPU our norms equal transformers' formula run by torch, bit for bit, for any
    launch shape (torch's order depends on the rows a launch holds)."""
    eps = 1e-5
    x = (torch.randn(rows, hidden, device=device) * 3).to(torch.bfloat16)
    residual = torch.randn(rows, hidden, device=device).to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(hidden, device=device)).to(torch.bfloat16)
    want = transformers_rms_norm(x, weight, eps)
    got = rms_norm(x, weight, eps)
    assert torch.equal(got, want), f"seed={seed}: {(got != want).sum()} elements differ"
    summed = x + residual  # transformers' residual add, in bf16
    normed, new_residual = fused_add_rms_norm(x, residual, weight, eps)
    assert torch.equal(new_residual, summed), f"seed={seed}"
    want = transformers_rms_norm(summed, weight, eps)
    assert torch.equal(normed, want), f"seed={seed}: {(normed != want).sum()} elements differ"
