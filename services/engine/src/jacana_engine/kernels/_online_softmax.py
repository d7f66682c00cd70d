"""The online-softmax step that the paged attention kernels (decode and prefill) share,
and the final division by the sum.

Both round as the attention transformers runs in bf16 on an H200 does: SDPA there takes
cuDNN's fused attention (torch's first choice on Hopper; replayed, transformers' traced
attention calls get their bits from cuDNN and from no other SDPA backend). Scores are
scaled before the running max is taken, P is rounded to the value dtype before its
product with V, and the output is divided by the sum. With cuDNN's tiles (64 keys for one
query, 128 for a prompt), a warp per 16 query rows holding all of a tile's keys, and
(``FRAGMENT_SUM``) the row sum added in the order of a Hopper MMA accumulator's threads,
our kernels give cuDNN's bits at head_dim 64 on all but about 1 in 10^5..10^6 outputs
on an H200."""

from __future__ import annotations

import triton
import triton.language as tl

from jacana_engine.kernels._row_sum_order import four_columns, unfused


def follows_cudnn_tiles(head_dim: int) -> bool:
    """Whether both paged attention kernels take cuDNN's tile shapes and row-sum order
    (module docstring) at this head size: up to 64, where they were matched. Wider heads
    (Qwen3's 128) keep the tiles tuned for speed at the 8B's shapes."""
    return head_dim <= 64


@triton.jit
def fragment_row_sums(p, part):
    """part [ROWS, 4] plus the tile p [ROWS, BLOCK_N] (BLOCK_N a multiple of 8), added as
    the threads of a Hopper MMA accumulator hold it: lane q of a row's quad holds columns
    8 i + 2 q + j and folds them in for i = 0, 1, ..., j = 0, 1 in turn. cuDNN (and
    FlashAttention) keep such per-thread partial sums across tiles and add the quad's four
    once, at the end (``quad_total``). The tile is rearranged so that each lane's columns
    lie in folding order along one axis, k = 2 i + j, which ``_fold_in_order`` walks."""
    ROWS: tl.constexpr = p.shape[0]
    BLOCK_N: tl.constexpr = p.shape[1]
    lanes = tl.permute(tl.reshape(p, [ROWS, BLOCK_N // 8, 4, 2]), (0, 2, 1, 3))  # [R, q, i, j]
    # part arrives rescaled (part * alpha): kept out of a fused multiply-add with the
    # first column, as cuDNN rounds the rescale on its own
    part = unfused(part)
    return _fold_in_order(part, tl.reshape(lanes, [ROWS, 4, BLOCK_N // 4]), BLOCK_N // 4)


@triton.jit
def _fold_in_order(part, x, K: tl.constexpr):
    """part [ROWS, 4] plus x[:, :, 0], then x[:, :, 1], ... x[:, :, K - 1] (x [ROWS, 4, K],
    K a power of 2), one addition at a time: the first half of x, then the second, each
    split off exactly (no arithmetic)."""
    if K == 1:
        return part + tl.reshape(x, [x.shape[0], 4])
    else:
        halves = tl.permute(tl.reshape(x, [x.shape[0], 4, 2, K // 2]), (0, 1, 3, 2))
        first, second = tl.split(halves)  # each [ROWS, 4, K / 2]
        return _fold_in_order(_fold_in_order(part, first, K // 2), second, K // 2)


@triton.jit
def quad_total(part):
    """A quad's four partial sums [ROWS, 4] to the row's sum [ROWS] as cuDNN's shuffles
    add them: (a0 + a1) + (a2 + a3)."""
    a0, a1, a2, a3 = four_columns(part)
    return (a0 + a1) + (a2 + a3)


@triton.jit
def initial_row_sum(ROWS: tl.constexpr, FRAGMENT_SUM: tl.constexpr):
    """The running sum before any tile: [ROWS, 4] per-thread partials with FRAGMENT_SUM,
    else [ROWS]."""
    if FRAGMENT_SUM:
        l_i = tl.zeros([ROWS, 4], dtype=tl.float32)
    else:
        l_i = tl.zeros([ROWS], dtype=tl.float32)
    return l_i


@triton.jit
def row_sum(l_i, FRAGMENT_SUM: tl.constexpr):
    """The running sum as one value a row [ROWS]."""
    return quad_total(l_i) if FRAGMENT_SUM else l_i


@triton.jit
def online_softmax_step(s, v, m_i, l_i, acc, PRECISION: tl.constexpr, FRAGMENT_SUM: tl.constexpr):
    """Fold one KV tile into a running softmax-weighted sum; returns (m_i, l_i, acc).

    s: [ROWS, BLOCK_N] float32 scores in log2 units, -inf where a key is masked; every
    row's running max must end finite (a row's first tile holds a visible key). v:
    [BLOCK_N, BLOCK_D]. m_i: [ROWS] float32 running max; l_i: the running sum as
    ``initial_row_sum`` shapes it (``row_sum`` reads it); acc: [ROWS, BLOCK_D] float32
    unnormalized output."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    if FRAGMENT_SUM:
        l_i = fragment_row_sums(p, l_i * alpha[:, None])
    else:
        l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(
        p.to(v.dtype), v, input_precision=PRECISION, out_dtype=tl.float32
    )
    return m_new, l_i, acc


@triton.jit
def normalized(acc, l_i):
    """acc [ROWS, BLOCK_D] / l_i [ROWS], as cuDNN divides (Triton's division; a correctly
    rounded reciprocal differed more often). A row with l_i == 0 (no keys) gives zeros."""
    return acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
