"""Per-program timestamps of the decode step's kernels, for finding where a step's time goes.

A profiler sees a kernel launched with programmatic dependent launch as one span that
starts long before its work (its programs wait for the kernel before), so it cannot say
how long a dependency takes. Here each program of a traced launch stores the GPU's global
timer (``%globaltimer``, nanoseconds, one clock for every SM) at fixed points of its life,
and the SM it ran on:

- ``START``: the program began (it became resident);
- ``WAITED``: its wait for the previous kernel returned (``_pdl``; at once without PDL);
- ``WORKED``: its main work is done, before its last stores;
- ``END``: its last store was issued.

Tracing is off unless a :func:`recording` is open (``bench/program_timeline_gpu.py``
opens one around a CUDA-graph capture): launchers ask :func:`trace_slot` for a launch's
rows of the recording's buffer and pass ``TRACE=False`` (and a placeholder pointer)
otherwise, so the kernels compile without the stamps and nothing changes for serving.
Only CUDA launches are traced (the interpreter has no global timer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

# a program's row: the four timestamps, then its SM (int64 each)
COLUMNS = ("start", "waited", "worked", "end", "sm")
FIELDS = len(COLUMNS)
# the columns as the kernels name them (a jit function's globals must be constexprs)
START, WAITED, WORKED, END, _SM = (tl.constexpr(i) for i in range(FIELDS))
_FIELDS = tl.constexpr(FIELDS)


@dataclass
class TraceLaunch:
    """One traced launch: its name and its rows ``[first, first + programs)`` of the
    recording's buffer."""

    name: str
    first: int
    programs: int


@dataclass
class Recording:
    """The buffer traced launches store into ([capacity, FIELDS] int64) and the launches,
    in the order they were made."""

    buffer: torch.Tensor
    launches: list[TraceLaunch] = field(default_factory=list)
    used: int = 0

    def clear(self) -> None:
        """Zero every stamp (rows a replay does not reach stay zero: unused)."""
        self.buffer.zero_()

    def take(self, name: str, programs: int) -> torch.Tensor:
        """The next ``programs`` rows of the buffer, recorded as launch ``name``. Raises
        ``RuntimeError`` when the buffer cannot hold them."""
        if self.used + programs > self.buffer.shape[0]:
            raise RuntimeError(f"trace buffer of {self.buffer.shape[0]} programs is full")
        self.launches.append(TraceLaunch(name, self.used, programs))
        rows = self.buffer[self.used : self.used + programs]
        self.used += programs
        return rows


_active: Recording | None = None


@contextlib.contextmanager
def recording(device: torch.device, capacity: int = 1 << 20) -> Iterator[Recording]:
    """Trace every CUDA launch of a traced kernel made inside the block (graph captures
    included: a captured launch keeps its rows, and each replay overwrites them)."""
    global _active
    if _active is not None:
        raise RuntimeError("a trace recording is already open")
    _active = Recording(torch.zeros(capacity, FIELDS, dtype=torch.int64, device=device))
    try:
        yield _active
    finally:
        _active = None


def trace_slot(name: str, programs: int, placeholder: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(rows to store stamps into, ``TRACE``) for a launch of ``programs`` programs on
    ``placeholder``'s device: the next rows of the open recording, or ``placeholder``
    itself and False when none is open (or off CUDA). Raises ``RuntimeError`` when the
    recording's buffer is full."""
    if _active is None or placeholder.device.type != "cuda":
        return placeholder, False
    return _active.take(name, programs), True


@triton.jit
def _global_timer():
    """The GPU's global timer in nanoseconds (int64), read once by every thread."""
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l,r", [tl.program_id(0)], dtype=tl.int64,
        is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _program_row():
    """This program's row of a launch's trace rows: its linear index in the grid."""
    p0, p1 = tl.num_programs(0), tl.num_programs(1)
    pid = tl.program_id(0) + tl.program_id(1) * p0 + tl.program_id(2) * p0 * p1
    return pid.to(tl.int64)


@triton.jit
def stamp(trace_ptr, EVENT: tl.constexpr, TRACE: tl.constexpr):
    """Store the global timer as this program's ``EVENT`` (with ``START``, its SM too); a
    no-op without ``TRACE``."""
    if TRACE:
        row = trace_ptr + _program_row() * _FIELDS
        tl.store(row + EVENT, _global_timer())
        if EVENT == START:
            sm = tl.inline_asm_elementwise(
                "mov.u32 $0, %smid;", "=r,r", [tl.program_id(0)], dtype=tl.int32,
                is_pure=False, pack=1,
            )  # fmt: skip
            tl.store(row + _SM, sm.to(tl.int64))
