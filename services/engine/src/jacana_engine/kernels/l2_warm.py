"""Asking L2 for weight bytes ahead of the kernel that reads them.

A batch-1 decode step is a chain of launches that each wait for the one before. The
GEMVs stream their weights from HBM; the launches between them (decode attention, the
norms) read almost nothing, and while they run HBM idles. A kernel in such a gap can
ask L2 for the first bytes that the next GEMV will read from HBM (``L2Warm``), right
after its own wait, so they stream during the gap instead of after it. A hint only:
``cp.async.bulk.prefetch.L2`` holds no registers and changes no result.

``prefetch_rows_to_l2`` is the instruction over a tile of weight rows (also what the
skinny GEMM's own opt-in prefetch issues before its wait); ``warm_plan`` turns an
``L2Warm`` into the launch constants of a kernel that warms its share of the rows.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._common import next_power_of_2

L2_MAX_PIECES = 16  # bulk prefetches per weight row at most, spread over the threads
L2_MIN_PIECE = 256  # bytes: a row's share below this is not worth an instruction


@triton.jit
def prefetch_rows_to_l2(
    w_ptr, cols, N, stride_wn, FIRST: tl.constexpr, NBYTES: tl.constexpr, PIECES: tl.constexpr
):
    """Ask L2 for ``NBYTES`` of each weight row ``cols`` from column ``FIRST`` on: a hint
    (``cp.async.bulk.prefetch.L2``, no registers held), in [BLOCK_N, PIECES] pieces of
    NBYTES // PIECES bytes (16-byte aligned: the launcher checks, see ``row_pieces``).
    Rows past N prefetch row N - 1 again."""
    rows = tl.minimum(cols, N - 1).to(tl.int64)
    piece = NBYTES // PIECES
    elem = w_ptr.dtype.element_ty.primitive_bitwidth // 8
    starts = (rows[:, None] * stride_wn + FIRST) * elem + tl.arange(0, PIECES)[None, :] * piece
    ptrs = w_ptr.to(tl.pointer_type(tl.int8)) + starts  # [BLOCK_N, PIECES]
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
        "=r,l,r",
        [ptrs, tl.full(ptrs.shape, piece, tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def row_pieces(weight: torch.Tensor, first: int, share: int) -> tuple[int, int]:
    """(bytes a row, bulk prefetches a row) for asking L2 for up to ``share`` bytes of each
    row of ``weight`` [N, K] from column ``first`` on: clamped to what a row holds there,
    in the most pieces (up to ``L2_MAX_PIECES``) of at least ``L2_MIN_PIECE`` bytes,
    rounded down to a multiple of 16 bytes a piece. (0, 1): nothing, where the share is
    below one piece or rows or pieces would not be 16-byte aligned (the instruction needs
    it)."""
    k = weight.shape[1]
    elem = weight.element_size()
    share = min(share, max(0, k - first) * elem)
    if share < L2_MIN_PIECE:
        return 0, 1
    pieces = min(L2_MAX_PIECES, 1 << (share // L2_MIN_PIECE).bit_length() - 1)
    row_bytes = share // (16 * pieces) * 16 * pieces
    aligned = weight.data_ptr() % 16 == 0 and (weight.stride(0) * elem) % 16 == 0
    return (row_bytes, pieces) if aligned and (first * elem) % 16 == 0 else (0, 1)


class L2Warm(NamedTuple):
    """The next kernel's weight bytes to warm: ``row_bytes`` of every row of ``weight``
    [N, K] (row-major) from column ``first_column`` on (what it reads from HBM first)."""

    weight: torch.Tensor
    first_column: int
    row_bytes: int


NO_WARM = dict(WARM=False)


def warm_plan(warm: L2Warm | None, programs: int) -> tuple[torch.Tensor | None, dict]:
    """(the weight or None, the launch constants) of a kernel of ``programs`` programs
    that warms ``warm``'s rows in launch order, ``WARM_RPP`` rows a program (constants:
    WARM, WARM_ROWS, WARM_STRIDE, WARM_FIRST, WARM_BYTES, WARM_PIECES, WARM_RPP). Nothing
    to warm (None, a share below one piece, misaligned): (None, ``NO_WARM``)."""
    if warm is None:
        return None, NO_WARM
    weight = warm.weight
    if weight.dim() != 2 or weight.stride(1) != 1:
        raise ValueError("an L2Warm weight is a row-major matrix")
    row_bytes, pieces = row_pieces(weight, warm.first_column, warm.row_bytes)
    if row_bytes == 0:
        return None, NO_WARM
    rows = weight.shape[0]
    constants = dict(
        WARM=True,
        WARM_ROWS=rows,
        WARM_STRIDE=weight.stride(0),
        WARM_FIRST=warm.first_column,
        WARM_BYTES=row_bytes,
        WARM_PIECES=pieces,
        WARM_RPP=next_power_of_2(triton.cdiv(rows, max(1, programs))),
    )
    return weight, constants
