"""``research/compile_stability_gpu.py``'s reading of CUDA's lazy loads in a torch.profiler run
(which only a GPU records): made-up events whose nesting is known, read back by step and
operator."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from compile_stability_gpu import LOAD_EVENTS, STEP_LABEL, module_loads_by_operator


@dataclass
class Span:
    start: float
    end: float

    def elapsed_us(self) -> float:
        return self.end - self.start


@dataclass
class Event:
    """What the function reads of a ``FunctionEvent``."""

    name: str
    cpu_parent: Event | None
    time_range: Span
    input_shapes: list | None = None


class Profile:
    def __init__(self, events: list[Event]) -> None:
        self._events = events

    def events(self) -> list[Event]:
        return self._events


def test_loads_are_charged_to_their_step_and_innermost_operator():
    step = Event(f"{STEP_LABEL}7", None, Span(0, 1000))
    linear = Event("aten::linear", step, Span(10, 400), [[5, 8], [8, 8]])
    mm = Event("aten::mm", linear, Span(20, 390), [[5, 8], [8, 8]])
    sort = Event("aten::sort", step, Span(500, 900), [[3, 151936], [], []])
    launch = Event("cudaLaunchKernel", sort, Span(510, 890))
    loads = [
        Event(LOAD_EVENTS[0], mm, Span(30, 130)),  # 100 µs under the mm, inside the linear
        Event(LOAD_EVENTS[1], launch, Span(520, 880)),  # under a launch under the sort
        Event(LOAD_EVENTS[0], None, Span(1100, 1150)),  # not nested: the outer event's
        Event(LOAD_EVENTS[0], None, Span(5000, 5010)),  # outside every event
    ]
    outer = Event("cudaStreamSynchronize", None, Span(1050, 1200))
    got = module_loads_by_operator(Profile([step, linear, mm, sort, launch, outer, *loads]))
    assert got == pytest.approx(
        {
            "step 7: aten::mm [[5, 8], [8, 8]]": 100e-6,
            "step 7: aten::sort [[3, 151936], [], []]": 360e-6,
            "cudaStreamSynchronize []": 50e-6,
            "?": 10e-6,
        }
    )
