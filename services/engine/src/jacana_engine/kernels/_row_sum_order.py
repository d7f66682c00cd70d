"""A row's sum of squares added in the order torch's CUDA ``mean(-1)`` adds it.

transformers' RMSNorm takes ``x.float().pow(2).mean(-1)``: torch's generic reduction
kernel (``aten/src/ATen/native/cuda/Reduce.cuh``) with float32 sums. Float addition is not
associative, so a norm that sums in another order gets another mean now and then, and
through ``rsqrt`` and the bf16 rounding after it an output one ulp away. Following the
order makes our norms give transformers' bits (checked on an H200 against torch itself,
``tests/kernels/test_rmsnorm.py``; the order was read off the card pair by pair: a row
of ones with +M at i and -M at j sums to n less the ones added in before i and j meet).

The order, for a launch of ``rows`` rows of ``n`` contiguous float32 values:
- W threads add one row (``RowSumOrder.width``, from the row count and n as torch's
  ``set_block_dimension`` picks them: more rows, fewer threads a row).
- From 128 values a row (``vector``; read off the card: rows of 128 are, of 96 are not),
  thread t loads the 4 values at 4 (t + W p) + i, i = 0..3, into 4 running sums, pass p
  after pass; otherwise (``strided``) value t + W (4 p + i) goes to sum i. The 4 sums are
  added left to right.
- The W thread sums are halved: t takes t + W/2's sum, then t + W/4's, ... down to one.
- The mean is that sum times fl(1/n), then plus eps in its own rounding.

A Qwen3 q/k norm normalizes each head: rows of ``head_dim`` values. At 16 to 128 values
(powers of 2) the order does not depend on the row count, and a kernel holding the head as
its two rotary halves x1, x2 [heads, head_dim / 2] can follow it without reading the row
back (``head_sum_of_squares``): up to 64 values, thread t holds x1[t] and x2[t] (strided,
W >= head_dim / 2), so the halving starts from x1² + x2²; at 128, thread t holds the 4
consecutive values 4t..4t+3 (vector, W = 32), so it starts from x1's and x2's quads,
each added left to right.
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


# ``head_norm_order``: how a q/k norm adds a head's squares
HEAD_SUM_TRITON = 0  # Triton's reduction (tl.sum)
HEAD_SUM_PAIRS = 1  # torch's, from x1² + x2²
HEAD_SUM_QUADS = 2  # torch's, from x1's quads + x2's quads


def head_norm_order(head_dim: int, rotary_dim: int) -> int:
    """How a q/k norm over heads of ``head_dim`` values, rotated over ``rotary_dim`` of
    them, follows torch's order (module docstring): ``HEAD_SUM_PAIRS`` or
    ``HEAD_SUM_QUADS`` where the head is exactly its two rotary halves and torch's order
    comes to the same for any row count; otherwise ``HEAD_SUM_TRITON``."""
    if rotary_dim != head_dim or head_dim not in (16, 32, 64, 128):
        return HEAD_SUM_TRITON
    forms = {_head_sum_form(head_dim, 1 << e) for e in range(10)}  # 1 to 512 rows
    return forms.pop() if len(forms) == 1 else HEAD_SUM_TRITON


def _head_sum_form(head_dim: int, rows: int) -> int:
    order = torch_row_sum_order(head_dim, rows)
    if order.passes != 1:
        return HEAD_SUM_TRITON
    if order.vector:
        # thread t's 4 consecutive values lie in one half, thread t + W/2's in the other
        return HEAD_SUM_QUADS if order.width * 4 == head_dim else HEAD_SUM_TRITON
    # thread t holds values t (and t + W where W is half the head); the first halving
    # adds thread t + W/2's, so every lane starts from x1[t]² + x2[t]²
    return HEAD_SUM_PAIRS if order.width * 2 >= head_dim else HEAD_SUM_TRITON


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
def left_to_right(x):
    """x [R, 4] -> [R]: each row's four values added left to right, ((c0 + c1) + c2) + c3."""
    c0, c1, c2, c3 = four_columns(x)
    return ((c0 + c1) + c2) + c3


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
        idx = thread_column(t, p, i, SUM_WIDTH, SUM_VECTOR)
        v = tl.load(row_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
        acc += unfused(v * v)  # zeros past n add exactly
    return halved_sum(left_to_right(acc), SUM_WIDTH)  # [W]: each thread's 4 running sums


@triton.jit
def thread_column(t, p, i, WIDTH: tl.constexpr, VECTOR: tl.constexpr):
    """The column of a row that thread ``t`` of torch's reduction (``WIDTH`` threads a
    row) adds into its running sum ``i`` (0-3) in pass ``p`` (any broadcastable ints)."""
    if VECTOR:  # noqa: SIM108 (a compile-time branch)
        column = (p * WIDTH + t) * 4 + i
    else:
        column = t + (4 * p + i) * WIDTH
    return column


@triton.jit
def halved_sum(total, LANES: tl.constexpr):
    """total [LANES], one sum a thread -> the row's sum (a scalar), as ``halved`` adds."""
    return tl.sum(halved(tl.reshape(total, (1, LANES)), LANES), axis=0)


@triton.jit
def halved_sum_from(row_ptr, n, LANES: tl.constexpr):
    """The first ``n`` (<= LANES, a power of 2) float32 values at ``row_ptr``, one sum a
    thread, summed as ``halved_sum`` adds them, zeros past n. Halving adds the upper half
    to the lower half elementwise; read from memory in slices of 32, the levels above 32
    are sums of whole slices (no data crosses threads) and only the last five are
    shuffles, where halving a [LANES] tile moves it between threads at every level (on an
    H200 the 8B layer chain ran ~0.4 ms a step slower with a norm whose every program
    halved such a tile)."""
    if LANES <= 32:  # a warp's lanes: a slice
        lanes = tl.arange(0, LANES)
        total = halved_sum(tl.load(row_ptr + lanes, mask=lanes < n, other=0.0), LANES)
    else:
        total = halved_sum(_halved_slices(row_ptr, tl.arange(0, 32), n, 0, LANES // 32, 1), 32)
    return total


@triton.jit
def _halved_slices(
    row_ptr, lanes, n, START: tl.constexpr, COUNT: tl.constexpr, STRIDE: tl.constexpr
):
    """[32]: slices START, START + STRIDE, ... (COUNT of them, 32 values each) halved
    into one: slice j takes slice j + COUNT/2, then j + COUNT/4, ..., which is the
    pairwise sum of the even-position slices' result and the odd-position ones'."""
    if COUNT == 1:
        column = START * 32 + lanes
        total = tl.load(row_ptr + column, mask=column < n, other=0.0)
    else:
        even = _halved_slices(row_ptr, lanes, n, START, COUNT // 2, STRIDE * 2)
        odd = _halved_slices(row_ptr, lanes, n, START + STRIDE, COUNT // 2, STRIDE * 2)
        total = even + odd
    return total


@triton.jit
def halved(total, LANES: tl.constexpr):
    """total [R, LANES] (LANES a power of 2) -> [R]: lane t takes lane t + LANES/2's sum,
    then t + LANES/4's, ... down to one, each step one addition."""
    for _ in tl.static_range(LANES.bit_length() - 1):
        total = tl.sum(tl.reshape(total, (total.shape[0], 2, total.shape[1] // 2)), axis=1)
    return tl.sum(total, axis=1)  # [R, 1] -> [R]


@triton.jit
def head_sum_of_squares(x1, x2, HALF: tl.constexpr, ORDER: tl.constexpr):
    """Each head's sum of squares [H] in float32 from its rotary halves x1, x2
    [H, HALF] (HALF a power of 2, the head nothing else), in ``ORDER``
    (``head_norm_order``: ``HEAD_SUM_PAIRS`` or ``HEAD_SUM_QUADS``), each square rounded
    before it is added."""
    sq1 = unfused(x1 * x1)
    sq2 = unfused(x2 * x2)
    if ORDER == 2:  # HEAD_SUM_QUADS: thread t's 4 consecutive values, left to right
        QUADS: tl.constexpr = HALF // 4
        ROWS: tl.constexpr = x1.shape[0]
        sq1 = tl.reshape(left_to_right(tl.reshape(sq1, (ROWS * QUADS, 4))), (ROWS, QUADS))
        sq2 = tl.reshape(left_to_right(tl.reshape(sq2, (ROWS * QUADS, 4))), (ROWS, QUADS))
        total = halved(sq1 + sq2, QUADS)
    else:  # one return: compiled, a return inside a compile-time branch does not end it
        total = halved(sq1 + sq2, HALF)
    return total
