"""Where one long prompt's time to first token goes on a GPU: the GPU's work, its idle
gaps, and the host's Python.

A prompt of ``--prompt`` tokens (default 1024) and one new token, in-process, as
``offline_gpu.py``'s ``ttft1024`` workload. For each model:

- TTFT over ``--reps`` runs (wall clock, no profiler);
- one profiled run's GPU timeline (``step_timeline.summarize`` from the first GPU
  activity: busy, idle, the largest idle gaps and how much of each the host made);
- one run under cProfile: the host functions that took the most time of their own. A
  prefill whose GPU idles while the host is still in Python is bound by the host.

Usage: python bench/prefill_host_gpu.py --model qwen3-0.6b --model qwen3-8b --no-hf
[--decode-gemm torch] [--out DIR]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import step_timeline as timeline
from common import environment, fmt_spread, random_prompts, spread
from offline_gpu import (
    StepParts,
    _sync,
    bench_each_model,
    build_engine,
    engine_parser,
    host_profile,
    run_closed_loop,
)


def profiled_timeline(engine, prompt: list[int]) -> dict[str, Any]:
    """``step_timeline.summarize`` of one profiled one-token run of ``prompt``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_closed_loop(engine, [prompt], 1, 1)
        _sync()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = timeline.load_events(trace)
    summary = timeline.summarize(events, top=10)
    summary["gpu_activities"] = sum(1 for e in events if e.get("cat") in timeline.GPU_CATEGORIES)
    return summary


def bench_model(model: str, args) -> dict[str, Any]:
    engine, info = build_engine(model, args)
    vocab = engine.vocab_size
    for seed in range(3):  # warm-up: compilation, allocator growth
        run_closed_loop(engine, random_prompts(1, args.prompt, vocab, seed=seed), 1, 1)
    ttft, parts = [], StepParts()
    for rep in range(args.reps):
        prompts = random_prompts(1, args.prompt, vocab, seed=100 + rep)
        with parts.measure(engine):
            ttft.append(run_closed_loop(engine, prompts, 1, 1)["ttft_ms"])
    summary = profiled_timeline(engine, random_prompts(1, args.prompt, vocab, seed=7)[0])
    wall, host = host_profile(engine, random_prompts(1, args.prompt, vocab, seed=8), 1)
    del engine
    return {
        "info": info,
        "ttft_ms": spread(ttft),
        "step_ms": parts.per_step_ms(),
        "timeline": summary,
        "cprofile_wall_ms": 1e3 * wall,
        "cprofile": host,
    }


def render(doc: dict[str, Any]) -> str:
    lines = [f"# One {doc['prompt']}-token prompt's TTFT: GPU timeline and host profile", ""]
    for model, m in doc["models"].items():
        t, s = m["timeline"], m["step_ms"]
        lines += [
            f"## {model}",
            "",
            f"TTFT {fmt_spread(m['ttft_ms'])} ms ({doc['reps']} reps); step parts ms: "
            f"schedule {s['schedule']:.3f}, execute {s['execute']:.3f}, "
            f"outputs {s['outputs']:.3f}. Profiled run: {t['gpu_activities']} GPU "
            f"activities, GPU busy {t['busy_us'] / 1e3:.2f} ms, idle "
            f"{t['idle_us'] / 1e3:.2f} ms between the first and the last. Under cProfile "
            f"the run took {m['cprofile_wall_ms']:.1f} ms.",
            "",
            timeline.render(t),
            "",
            "```",
            m["cprofile"].strip(),
            "```",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = engine_parser(__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--name", default="prefill_host_gpu")
    args = parser.parse_args()
    doc: dict[str, Any] = {
        "environment": environment(),
        "reps": args.reps,
        "prompt": args.prompt,
        "decode_gemm": args.decode_gemm,
        "models": {},
    }
    bench_each_model(doc, args, bench_model, render)


if __name__ == "__main__":
    main()
