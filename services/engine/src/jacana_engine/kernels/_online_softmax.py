"""The online-softmax step that the paged attention kernels (decode and prefill) share."""

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
