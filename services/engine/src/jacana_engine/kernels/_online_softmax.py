"""The online-softmax step that the paged attention kernels (decode and prefill) share,
and the final division by the sum.

Both round as torch's flash SDPA does (FlashAttention-2, what transformers runs in bf16
on the GPU): scores scaled before the running max is taken, P rounded to the value dtype
before its product with V, and the output multiplied by the correctly rounded reciprocal
of the sum. On an H200 (``bench/flash_numerics_probe_gpu.py``) a tile computed this way
gives flash's bits wherever flash holds the same keys in one tile of its own: every
context up to 128 keys at head_dim 64, 64 at head_dim 128, with the kernels' tiles set
to those sizes."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_step(s, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    """Fold one KV tile into a running softmax-weighted sum; returns (m_i, l_i, acc).

    s: [ROWS, BLOCK_N] float32 scores in log2 units, -inf where a key is masked; every
    row's running max must end finite (a row's first tile holds a visible key). v:
    [BLOCK_N, BLOCK_D]. m_i, l_i: [ROWS] float32 running max and sum; acc: [ROWS, BLOCK_D]
    float32 unnormalized output."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(
        p.to(v.dtype), v, input_precision=PRECISION, out_dtype=tl.float32
    )
    return m_new, l_i, acc


@triton.jit
def normalized(acc, l_i):
    """acc [ROWS, BLOCK_D] / l_i [ROWS] as flash rounds it: acc times the correctly
    rounded 1 / l_i (one rounding each; ``acc / l_i`` in Triton is an approximate
    division). A row with l_i == 0 (no keys) gives zeros."""
    safe = tl.where(l_i > 0, l_i, 1.0)
    return acc * tl.math.div_rn(tl.full(l_i.shape, 1.0, tl.float32), safe)[:, None]
