"""``bench/step_timeline.py`` on a hand-made trace of two decode steps, whose busy and
idle time and gap causes are known."""

from __future__ import annotations

import json

import pytest
import step_timeline


def _host(name: str, ts: float, dur: float, corr: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}  # fmt: skip


def _gpu(name: str, ts: float, dur: float, corr: int, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}  # fmt: skip


def _two_steps() -> list[dict]:
    return [
        # an eager prefill before the decode steps, outside the window
        _host("cudaLaunchKernel", -100, 5, 9),
        _gpu("prefill", -90, 50, 9),
        # step 1: graph launched at 0 (returns at 5); its kernels overlap (PDL)
        _host("cudaGraphLaunch", 0, 5, 1),
        _gpu("gemv", 10, 100, 1),
        _gpu("norm", 90, 30, 1),  # overlaps gemv: busy 10..120
        # sampling outside the graph, queued early (launch returned at 20): a device gap
        _host("cudaLaunchKernel", 15, 5, 2),
        _gpu("argmax", 130, 10, 2),  # gap 120..130, not host-late
        # step 2: launched late, returning at 200: the GPU waits from 140 to 200
        _host("cudaGraphLaunch", 190, 10, 3),
        _gpu("gemv", 210, 100, 3),  # gap 140..210, 60 of it host-late
        _gpu("copy", 320, 5, 4, cat="gpu_memcpy"),  # no launcher in the trace
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 400},
    ]


def test_busy_idle_and_gaps_per_step():
    s = step_timeline.summarize(_two_steps())
    assert s["steps"] == 2
    # busy: 10..120 (110) + argmax 10 + gemv 100 + copy 5 = 225; window 10..325 = 315
    assert s["busy_us"] == pytest.approx(225 / 2)
    assert s["idle_us"] == pytest.approx((315 - 225) / 2)
    gaps = {(g["after"], g["before"]): g for g in s["gaps"]}
    assert gaps[("argmax", "gemv")]["us_per_step"] == pytest.approx(70 / 2)
    assert gaps[("argmax", "gemv")]["host_late_us_per_step"] == pytest.approx(60 / 2)
    assert gaps[("norm", "argmax")]["us_per_step"] == pytest.approx(10 / 2)
    assert gaps[("norm", "argmax")]["host_late_us_per_step"] == 0.0
    assert s["gaps"][0]["after"] == "argmax"  # the largest first
    outside = {r["name"]: r for r in s["outside_graphs"]}
    assert set(outside) == {"argmax", "copy"}
    assert outside["argmax"]["us_per_step"] == pytest.approx(5.0)


def test_reads_a_chrome_trace_file_and_renders(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [*_two_steps(), {"ph": "i", "name": "mark"}]}))
    events = step_timeline.load_events(path)
    assert len(events) == len(_two_steps())
    text = step_timeline.render(step_timeline.summarize(events))
    assert "2 steps: GPU busy 112.5 µs, idle 45.0 µs a step" in text
    assert "| argmax | gemv | 0.50 | 35.0 | 30.0 |" in text


def test_a_trace_without_gpu_activity():
    s = step_timeline.summarize([_host("cudaGraphLaunch", 0, 5, 1)])
    assert s == {"steps": 1, "busy_us": 0.0, "idle_us": 0.0, "gaps": [], "outside_graphs": []}


def test_a_prefill_alone_is_one_step_from_its_first_activity():
    """Without graph launches (a prefill and its first token, as ``prefill_host_gpu.py``
    profiles) the window opens at the first GPU activity and counts as one step."""
    events = [
        _host("cudaLaunchKernel", 0, 5, 1),
        _gpu("gather", 10, 5, 1),
        _host("cudaLaunchKernel", 5, 30, 2),  # returns at 35: the norm waits 20 on the host
        _gpu("norm", 35, 10, 2),
    ]
    s = step_timeline.summarize(events)
    assert s["steps"] == 1
    assert s["busy_us"] == pytest.approx(15.0)
    assert s["idle_us"] == pytest.approx(20.0)
    assert s["gaps"][0]["host_late_us_per_step"] == pytest.approx(20.0)
    assert {r["name"] for r in s["outside_graphs"]} == {"gather", "norm"}
