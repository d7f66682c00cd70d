"""Where a decode step's wall time goes on the GPU: busy, idle, and who made it wait.

Reads a torch.profiler (Kineto) Chrome trace: its GPU activities (kernels, copies,
memsets) and the host calls that launched them (``args.correlation`` links the two; every
kernel of a replayed CUDA graph carries its ``cudaGraphLaunch``'s). Between the first and
the last GPU activity of the window it sums:

- busy time (activities may overlap under programmatic dependent launch, so busy is the
  union of their intervals) and idle time (the rest);
- each idle gap, named by the activities on either side, and called *host-late* when the
  host call that launched the activity after it returned only after the gap began: the
  GPU was waiting for the host. Otherwise the work was queued and the GPU waited on a
  dependency (an event, a copy, a launch's own latency);
- the GPU time of activities outside CUDA graphs, per name (input staging, sampling
  between graph replays).

The window opens at the first activity of a replayed graph (the prompt's eager prefill
before it is left out). Numbers are per step: divided by the number of graph launches,
which a decode step at batch 1 makes exactly once.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATEGORIES = {"cuda_runtime", "cuda_driver"}
GRAPH_LAUNCH = "cudaGraphLaunch"


def load_events(path: Path) -> list[dict[str, Any]]:
    """The complete (``ph == "X"``) events of a Chrome trace file."""
    doc = json.loads(Path(path).read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if e.get("ph") == "X"]


def _short(name: str, width: int = 48) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def summarize(events: list[dict[str, Any]], top: int = 8) -> dict[str, Any]:
    """Per-step busy/idle microseconds, the ``top`` idle gaps by total time, and the GPU
    time outside graphs; ``steps`` = graph launches seen (at least 1)."""
    host = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in HOST_CATEGORIES and "correlation" in e.get("args", {})
    }
    gpu = sorted(
        (e for e in events if e.get("cat") in GPU_CATEGORIES), key=lambda e: float(e["ts"])
    )
    steps = max(1, sum(1 for e in host.values() if e["name"].startswith(GRAPH_LAUNCH)))
    if not gpu:
        return {"steps": steps, "busy_us": 0.0, "idle_us": 0.0, "gaps": [], "outside_graphs": []}

    def launcher(e: dict[str, Any]) -> dict[str, Any] | None:
        return host.get(e.get("args", {}).get("correlation"))

    def in_graph(e: dict[str, Any]) -> bool:
        call = launcher(e)
        return call is not None and call["name"].startswith(GRAPH_LAUNCH)

    # the window opens at the first graph-replayed activity: an eager prefill before the
    # decode steps is not theirs
    first = next((i for i, e in enumerate(gpu) if in_graph(e)), 0)
    gpu = gpu[first:]
    gaps: dict[tuple[str, str], dict[str, float]] = defaultdict(
        lambda: {"count": 0, "total_us": 0.0, "host_late_us": 0.0}
    )
    outside: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "total_us": 0.0})
    busy = 0.0
    frontier = float(gpu[0]["ts"])  # end of the busy time so far
    before = gpu[0]["name"]  # the activity that reached the frontier
    for e in gpu:
        start, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))
        call = launcher(e)
        if not in_graph(e):
            row = outside[_short(e["name"])]
            row["count"] += 1
            row["total_us"] += end - start
        if start > frontier:
            gap = gaps[(_short(before), _short(e["name"]))]
            gap["count"] += 1
            gap["total_us"] += start - frontier
            if call is not None:
                returned = float(call["ts"]) + float(call.get("dur", 0.0))
                gap["host_late_us"] += max(0.0, min(start, returned) - frontier)
        if end > frontier:
            busy += end - max(start, frontier)
            frontier, before = end, e["name"]
    window = frontier - float(gpu[0]["ts"])
    ranked = sorted(gaps.items(), key=lambda kv: -kv[1]["total_us"])[:top]
    return {
        "steps": steps,
        "busy_us": busy / steps,
        "idle_us": (window - busy) / steps,
        "gaps": [
            {
                "after": after,
                "before": nxt,
                "per_step": g["count"] / steps,
                "us_per_step": g["total_us"] / steps,
                "host_late_us_per_step": g["host_late_us"] / steps,
            }
            for (after, nxt), g in ranked
        ],
        "outside_graphs": [
            {"name": name, "per_step": r["count"] / steps, "us_per_step": r["total_us"] / steps}
            for name, r in sorted(outside.items(), key=lambda kv: -kv[1]["total_us"])[:top]
        ],
    }


def render(summary: dict[str, Any]) -> str:
    """A Markdown rendering of :func:`summarize`'s result."""
    s = summary
    lines = [
        f"{s['steps']} steps: GPU busy {s['busy_us']:.1f} µs, idle {s['idle_us']:.1f} µs a step",
        "",
        "| idle after | before | gaps a step | µs a step | of which host-late |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {g['after']} | {g['before']} | {g['per_step']:.2f} | {g['us_per_step']:.1f} | "
        f"{g['host_late_us_per_step']:.1f} |"
        for g in s["gaps"]
    ]
    lines += ["", "| outside graphs | a step | µs a step |", "|---|---|---|"]
    lines += [
        f"| {r['name']} | {r['per_step']:.2f} | {r['us_per_step']:.1f} |"
        for r in s["outside_graphs"]
    ]
    return "\n".join(lines)
