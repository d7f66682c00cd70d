"""A row's sum of squares added in the order torch's CUDA ``mean(-1)`` adds it.

transformers' RMSNorm takes ``x.float().pow(2).mean(-1)``: torch's generic reduction
kernel (``aten/src/ATen/native/cuda/Reduce.cuh``) with float32 sums. Float addition is not
associative, so a norm that sums in another order gets another mean now and then, and
through ``rsqrt`` and the bf16 rounding after it an output one ulp away. Following the
order makes our norms give transformers' bits (checked on an H200 against torch itself,
``tests/kernels/test_rmsnorm.py``; the order was read off the card pair by pair with
``bench/reduction_order_probe_gpu.py --reveal``).

The order, for a launch of ``rows`` rows of ``n`` contiguous float32 values:
- W threads add one row (``RowSumOrder.width``, from the row count and n as torch's
  ``set_block_dimension`` picks them: more rows, fewer threads a row).
- From 128 values a row (``vector``; read off the card: rows of 128 are, of 96 are not),
  thread t loads the 4 values at 4 (t + W p) + i, i = 0..3, into 4 running sums, pass p
  after pass; otherwise (``strided``) value t + W (4 p + i) goes to sum i. The 4 sums are
  added left to right.
- The W thread sums are halved: t takes t + W/2's sum, then t + W/4's, ... down to one.
- The mean is that sum times fl(1/n), then plus eps in its own rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

_MAX_THREADS = 512  # torch's reduction block for float32
_WARP = 32
_VECTOR = 4  # values a thread loads at once, and running sums a thread keeps


def _last_power_of_2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


@dataclass(frozen=True)
class RowSumOrder:
    """How torch adds one row of a launch (module docstring); ``passes`` is the loop
    count that covers the row."""

    width: int
    vector: bool
    passes: int

    def constexprs(self) -> dict:
        """The launch arguments of ``row_sum_of_squares``."""
        return dict(SUM_WIDTH=self.width, SUM_VECTOR=self.vector, SUM_PASSES=self.passes)


def torch_row_sum_order(n: int, rows: int) -> RowSumOrder:
    """The order torch's CUDA reduction adds each of ``rows`` rows of ``n`` float32
    values in, reduced in one launch. Exact where torch keeps a row in one block row
    (its ``values_per_thread`` below 16 times the rows a block holds: every hidden size
    up to 8192 at any row count); beyond that torch also splits a row across warps,
    which this order does not follow."""
    vector = n >= 128 and n % _VECTOR == 0
    dim0 = n // _VECTOR if vector else n
    dim0_pow2 = _last_power_of_2(dim0) if dim0 < _MAX_THREADS else _MAX_THREADS
    dim1_pow2 = _last_power_of_2(rows) if rows < _MAX_THREADS else _MAX_THREADS
    width = min(dim0_pow2, _WARP)
    height = min(dim1_pow2, _MAX_THREADS // width)
    width = min(dim0_pow2, _MAX_THREADS // height)
    per_pass = width * _VECTOR
    return RowSumOrder(width, vector, -(-n // per_pass))


@triton.jit
def unfused(v):
    """``v`` as it is, but opaque to floating-point contraction: the add that takes it
    cannot be fused with the multiply that made it (``enable_fp_fusion`` on), so both
    round as torch's separate kernels round."""
    return tl.where(v == v, v, float("nan"))


@triton.jit
def four_columns(x):
    """x [R, 4] -> its columns (c0, c1, c2, c3), each [R], picked out exactly (no
    arithmetic), for sums that add them in a fixed order."""
    even, odd = tl.split(tl.reshape(x, (x.shape[0], 2, 2)))  # columns {0, 2} and {1, 3}
    c0, c2 = tl.split(even)
    c1, c3 = tl.split(odd)
    return c0, c1, c2, c3


@triton.jit
def row_sum_of_squares(
    row_ptr,
    n,
    SUM_WIDTH: tl.constexpr,
    SUM_VECTOR: tl.constexpr,
    SUM_PASSES: tl.constexpr,
):
    """sum(x²) in float32 of the ``n`` values at ``row_ptr``, in ``torch_row_sum_order``'s
    order, each square rounded before it is added. ``SUM_PASSES`` need only cover the row
    (``ceil(n / (4 SUM_WIDTH))`` or more). The row is read from memory in that order, so
    a caller that has just written it must order its stores first
    (``tl.debug_barrier()``)."""
    t = tl.arange(0, SUM_WIDTH)[:, None]  # [W, 1] thread
    i = tl.arange(0, 4)[None, :]  # [1, 4] running sum
    acc = tl.zeros([SUM_WIDTH, 4], tl.float32)
    for p in tl.static_range(SUM_PASSES):
        if SUM_VECTOR:  # noqa: SIM108 (a compile-time branch)
            idx = (p * SUM_WIDTH + t) * 4 + i
        else:
            idx = t + (4 * p + i) * SUM_WIDTH
        v = tl.load(row_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
        acc += unfused(v * v)  # zeros past n add exactly
    # the 4 running sums, added left to right
    s0, s1, s2, s3 = four_columns(acc)
    total = ((s0 + s1) + s2) + s3  # [W]
    # halving: thread t takes thread t + half's sum, half = W/2, W/4, ..., 1
    for _ in tl.static_range(SUM_WIDTH.bit_length() - 1):
        total = tl.sum(tl.reshape(total, (2, total.shape[0] // 2)), axis=0)  # one add each
    return tl.sum(total, axis=0)  # [1] -> scalar
