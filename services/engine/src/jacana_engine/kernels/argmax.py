"""Greedy decoding's argmax over each row of the logits, in one launch.

``torch.argmax`` reduces a [1, 151936] row with a single block (8.5 µs on an H200, plus a
memset for its semaphores), while the lm_head GEMV before it takes ~280 µs. Here each
row is cut into spans of ``SPAN`` entries, one program a span, each storing its best
value and the first index of it; the program that arrives last for the row
(``kernels/_arrivals.py``) merges the spans' winners and writes the token.

Same answer as ``torch.argmax(x, dim=-1)`` on float inputs: ties go to the first index
(a span keeps its first maximum, the merge the first span holding the best); NaN ranks
as +inf (torch ranks it above +inf, so a row holding both may differ). Reading the
model-dtype logits needs no float32 copy first: the cast is exact, so the order is the
same.

With ``pdl`` the kernel may launch while the GEMV that writes the logits runs
(``kernels/_pdl.py``), and waits for it before reading.

With ``copies`` (``TokenCopies``) the merging program also writes the token where a
decode graph's next step and the host read it: into the next step's input ids on the
device, and into a row of a pinned host ring that the device writes through (no copy
launched after the graph, no second stream to wait for; ``cuda_graphs.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._arrivals import arrival_counters
from jacana_engine.kernels._common import (
    check_last_dim_contiguous,
    next_power_of_2,
    token_ids_out,
)
from jacana_engine.kernels._pdl import pdl_launch, wait_for_previous_kernel

COUNTERS = "argmax"  # the per-row arrival counters (kernels/_arrivals.py)
SPAN = 2048  # entries one program scans: a single load of 4 KiB in bfloat16
_NO_INDEX = tl.constexpr(2**31 - 1)  # above every index: what an index minimum starts from


@dataclass(frozen=True)
class TokenCopies:
    """Where ``argmax_rows`` also writes row i's token: ``next_ids[i]`` ([>= M] int64 on
    the device) and ``ring[slot, i]`` (``ring`` [R, >= M] int64, contiguous, in pinned
    host memory the device writes through; ``slot`` a [1] int64 device tensor read when
    the kernel runs, so a captured graph writes the row the step staged)."""

    next_ids: torch.Tensor
    ring: torch.Tensor
    slot: torch.Tensor


@triton.jit
def _first_max(values, index):
    """(max of ``values``, the smallest ``index`` holding it) over a 1-D block."""
    best = tl.max(values, axis=0)
    return best, tl.min(tl.where(values == best, index, _NO_INDEX), axis=0)


# ring_width is the batch's row count: not specialized on (== 1, % 16), so a batch size
# first seen while serving runs the binary start-up compiled instead of stalling its step
# on a compile (research/compile_stability_gpu.py).
@triton.jit(do_not_specialize=["ring_width"])
def _argmax_kernel(
    x_ptr,  # [M, V] logits, unit stride on V
    out_ptr,  # [M] int64 token ids
    best_ptr,  # [M, NUM_SPANS] float32 scratch: each span's best value
    index_ptr,  # [M, NUM_SPANS] int32 scratch: its first index
    counter_ptr,  # [M] int32 arrival counters, zero between launches
    next_ptr,  # with COPIES: [M] int64, the token again
    ring_ptr,  # with COPIES: [R, ring_width] int64 (pinned host), row *slot_ptr gets it
    slot_ptr,  # with COPIES: [1] int64
    stride_row,
    V,
    ring_width,
    NUM_SPANS: tl.constexpr,
    SPAN: tl.constexpr,
    MERGE: tl.constexpr,  # next power of 2 of NUM_SPANS
    PDL: tl.constexpr,
    COPIES: tl.constexpr,
):
    row = tl.program_id(0)
    span = tl.program_id(1)
    j = span * SPAN + tl.arange(0, SPAN)  # [SPAN]
    wait_for_previous_kernel(PDL)
    x = tl.load(x_ptr + row.to(tl.int64) * stride_row + j, mask=j < V, other=float("-inf"))
    x = x.to(tl.float32)
    x = tl.where(x != x, float("inf"), x)  # NaN ranks first
    # A span of only -inf keeps its first index (masked entries are -inf too, but come
    # after it), so a row of only -inf gets index 0, as from torch.
    best, first = _first_max(x, j)
    slot = row * NUM_SPANS + span
    tl.store(best_ptr + slot, best)
    tl.store(index_ptr + slot, first)
    # The barrier orders the stores before the (single-thread) release; the acquire
    # makes the other spans' winners visible to the last arrival.
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel")
    if arrived == NUM_SPANS - 1:
        s = tl.arange(0, MERGE)
        held = s < NUM_SPANS
        spans_best = tl.load(best_ptr + row * NUM_SPANS + s, mask=held, other=float("-inf"))
        spans_first = tl.load(index_ptr + row * NUM_SPANS + s, mask=held, other=_NO_INDEX)
        _, token = _first_max(spans_best, spans_first)
        token = token.to(tl.int64)
        tl.store(out_ptr + row, token)
        if COPIES:
            tl.store(next_ptr + row, token)
            tl.store(ring_ptr + tl.load(slot_ptr) * ring_width + row, token)
        tl.store(counter_ptr + row, 0)  # every span has arrived: ready for the next launch


def argmax_rows(
    x: torch.Tensor,  # [M, V] float16, bfloat16 or float32, unit stride on V
    *,
    out: torch.Tensor | None = None,  # [M] int64
    pdl: bool = False,
    copies: TokenCopies | None = None,
) -> torch.Tensor:  # [M] int64 on x's device
    """The first index of each row's maximum (``torch.argmax(x, dim=-1)``, module doc).
    ``pdl``: launch dependently (CUDA only; kernels/_pdl.py). ``copies``: where the
    tokens also go (``TokenCopies``). Launches on one device must be stream-ordered
    (they share the arrival counters)."""
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"x must be [M, V] with V > 0, got {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be float16, bfloat16 or float32, not {x.dtype}")
    check_last_dim_contiguous("x", x)
    rows, vocab = x.shape
    if vocab >= _NO_INDEX.value:
        raise ValueError(f"a row of {vocab} entries is too long")
    out = token_ids_out(out, rows, x.device)
    if rows == 0:
        return out
    if copies is not None:
        _check_copies(copies, rows)
        next_ids, ring, slot = copies.next_ids, copies.ring, copies.slot
    else:
        next_ids, ring, slot = out, out, out  # not read
    num_spans = triton.cdiv(vocab, SPAN)
    best = torch.empty(rows, num_spans, dtype=torch.float32, device=x.device)
    index = torch.empty(rows, num_spans, dtype=torch.int32, device=x.device)
    counters = arrival_counters(COUNTERS, x.device, rows)
    _argmax_kernel[(rows, num_spans)](
        x,
        out,
        best,
        index,
        counters,
        next_ids,
        ring,
        slot,
        x.stride(0),
        vocab,
        ring.shape[-1],
        NUM_SPANS=num_spans,
        SPAN=SPAN,
        MERGE=next_power_of_2(num_spans),
        COPIES=copies is not None,
        num_warps=4,
        **pdl_launch(pdl, x.device),
    )
    return out


def _check_copies(copies: TokenCopies, rows: int) -> None:
    for name, t in (("next_ids", copies.next_ids), ("ring", copies.ring), ("slot", copies.slot)):
        if t.dtype != torch.int64:
            raise ValueError(f"copies.{name} must be int64, not {t.dtype}")
    if copies.next_ids.dim() != 1 or copies.next_ids.shape[0] < rows:
        raise ValueError(f"copies.next_ids must be [>= {rows}]")
    if copies.ring.dim() != 2 or copies.ring.shape[1] < rows or not copies.ring.is_contiguous():
        raise ValueError(f"copies.ring must be a contiguous [R, >= {rows}]")
    if copies.slot.numel() != 1:
        raise ValueError("copies.slot must hold one index")
