"""Programmatic dependent launch (PDL; Hopper and later) for the decode step's kernels.

A kernel launched with PDL may start while the kernel before it in the stream is still
running. It must therefore wait (``griddepcontrol.wait``: returns once the previous grid
has finished and its writes are visible) before it reads anything another kernel wrote
or writes anything another kernel reads. Each kernel taking ``PDL`` first lets its own
successor launch (``launch_dependents``), so the successor's launch latency, and a
skinny GEMV's first weight tile (weights are never written), overlap this kernel's work.

Ordering holds by induction along the stream: a kernel's wait returns only when its
predecessor has finished, and that one finished only after its own wait returned, so
everything earlier has finished too. A kernel launched without PDL (cuBLAS, torch ops)
waits for the whole previous kernel as usual.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """With PDL: let the next kernel launch now, then wait for the previous one. Call it
    before any load or store of data other kernels touch; a no-op without PDL."""
    let_next_kernel_launch(PDL)
    wait_only_for_previous_kernel(PDL)


@triton.jit
def let_next_kernel_launch(PDL: tl.constexpr):
    """With PDL: the first half of ``wait_for_previous_kernel``, for a kernel that reads
    what no kernel of its chain writes (host-staged step inputs, earlier steps' KV) in
    between; a no-op without PDL."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_only_for_previous_kernel(PDL: tl.constexpr):
    """With PDL: the second half of ``wait_for_previous_kernel``; a no-op without PDL."""
    if PDL:
        tl.extra.cuda.gdc_wait()


def pdl_launch(requested: bool, device: torch.device) -> dict:
    """Keyword arguments for a kernel taking ``PDL``: the constexpr, plus ``launch_pdl``
    when launched that way. Only CUDA launches with PDL (the interpreter has no grid
    dependencies)."""
    on = requested and device.type == "cuda"
    return {"PDL": on, "launch_pdl": True} if on else {"PDL": False}


def triton_has_dependent_launch() -> bool:
    """Whether this Triton has the device calls (``gdc_wait``, ``gdc_launch_dependents``)
    that dependent launches need (3.6, on the H200 we measure on, has them)."""
    cuda = getattr(tl.extra, "cuda", None)
    return all(hasattr(cuda, name) for name in ("gdc_wait", "gdc_launch_dependents"))
