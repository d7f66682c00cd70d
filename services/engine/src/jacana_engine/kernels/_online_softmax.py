"""The online-softmax step that the paged attention kernels (decode and prefill) share,
and the final division by the sum.

Both round as the attention transformers runs in bf16 on an H200 does: SDPA there takes
cuDNN's fused attention (torch's first choice on Hopper; ``flash_numerics_probe_gpu.py
--sites`` replays transformers' traced calls and only cuDNN gives their bits). Scores are
scaled before the running max is taken, P is rounded to the value dtype before its
product with V, and the output is divided by the sum. With cuDNN's tiles (64 keys for one
query, 128 for a prompt) and a warp per 16 query rows holding all of a tile's keys, our
kernels then give cuDNN's bits at head_dim 64 on all but about 1 in 10^4..10^5 outputs
(``bench/results/gpu_targets.md``, nineteenth run)."""

from __future__ import annotations

import triton
import triton.language as tl


def follows_cudnn_tiles(head_dim: int) -> bool:
    """Whether both paged attention kernels take cuDNN's tile shapes (module docstring) at
    this head size: up to 64, where they were matched. Wider heads (Qwen3's 128) keep the
    tiles tuned for speed at the 8B's shapes."""
    return head_dim <= 64


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
    """acc [ROWS, BLOCK_D] / l_i [ROWS], as cuDNN divides (Triton's division; a correctly
    rounded reciprocal differed more often). A row with l_i == 0 (no keys) gives zeros."""
    return acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
