"""The video service's overhead on this CPU: the tiny default's render through the API
against the bare diffusers pipeline.

Jacana: a real stack (``tests/video_stack.py``: a redis-server, the multimodal service,
one Celery render worker, the gateway), driven with the official ``openai`` SDK:
``videos.create_and_poll`` for the default model (``wan-tiny-random``, 128x128, 2 s at
8 fps: 17 frames rendered, 16 kept, 4 steps, guidance 5.0), timed from the create call to
the completed video -- queueing, the job record in Redis, the render, the MP4, thumbnail
and spritesheet written to the storage directory, and the polls. The SDK polls at each of
``--poll-ms`` in turn (its own argument, which overrides the gateway's
``openai-poll-after-ms``): a short interval costs CPU that the render shares on a small
machine, a long one leaves a finished video waiting for the next poll. Celery's own
"succeeded in" figure splits each render into the worker's task and what lies outside it.

The peer, in this process: diffusers' ``WanPipeline`` loaded from the same tiny model
directory, called with the same arguments, its frames turned to uint8 and encoded into the
same three files (the worker's own encoders, into memory). Both render on one torch thread
in float32 (the stack's worker runs with ``OMP_NUM_THREADS=1``). Each rep renders once per
path (the bare pipeline, the API at each poll interval) in rotating order with the same
seed, after two warm-up renders each (the worker loads its model on its first job). The
result is the overhead, ``API median / bare median - 1``, with the range of the per-rep
ratios; the target is at most 10%.

Writes ``bench/results/video_cpu/<hardware>.{json,md}`` (hardware: ``cpu-<N>core``).

Usage: python bench/video_cpu.py [--reps 9] [--poll-ms 10 50 200] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import (
    RESULTS_DIR,
    cpu_machine,
    cpu_machine_line,
    fmt_spread,
    hardware,
    package_versions,
    spread,
    write_results,
)

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red fox runs across a snowy field"
TARGET = 0.10
# The SDK's poll intervals tried: a short one costs CPU the render shares on a small
# machine, a long one leaves the finished video waiting for the next poll.
POLL_MS = [10, 50, 200]
# Celery's line for a finished render: how long the task ran inside the worker
_TASK_DONE = re.compile(
    r"Task jacana\.video\.render\[[^\]]+\] succeeded in ([0-9.]+)s: 'completed'"
)


def bare_peer(model_dir: Path, card):
    """``render(seed) -> seconds``: the pipeline call, uint8 frames and the three files."""
    import torch
    from diffusers import WanPipeline

    from jacana_multimodal.media.encode import encode_mp4, encode_spritesheet, encode_thumbnail
    from jacana_multimodal.pipelines.wan import frames_to_render, to_uint8

    pipeline = WanPipeline.from_pretrained(model_dir)
    pipeline.set_progress_bar_config(disable=True)
    width, height = (int(n) for n in card.default_size.split("x"))
    kept = int(card.default_seconds) * card.default_fps

    def render(seed: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            frames = pipeline(
                prompt=PROMPT,
                negative_prompt=None,
                height=height,
                width=width,
                num_frames=frames_to_render(kept),
                num_inference_steps=card.default_steps,
                guidance_scale=card.default_guidance_scale,
                generator=torch.Generator().manual_seed(seed),
                output_type="np",
            ).frames[0]
        frames = to_uint8(frames[:kept])
        encode_mp4(frames, card.default_fps, io.BytesIO())
        encode_thumbnail(frames)
        encode_spritesheet(frames)
        return time.perf_counter() - start

    return render


def api_peer(base_url: str, card, poll_ms: int):
    """``render(seed) -> seconds``: create to completed through the gateway."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)

    def render(seed: int) -> float:
        start = time.perf_counter()
        video = client.videos.create_and_poll(
            prompt=PROMPT,
            model=card.id,
            seconds=card.default_seconds,
            size=card.default_size,
            poll_interval_ms=poll_ms,
            extra_body={"seed": seed},
        )
        elapsed = time.perf_counter() - start
        if video.status != "completed":
            raise SystemExit(f"render {video.id} ended {video.status}: {video.error}")
        return elapsed

    return render


def measure(args: argparse.Namespace) -> dict:
    import torch

    from jacana_multimodal.pipelines.registry import DEFAULT_MODEL_ID, card_for, default_specs
    from jacana_multimodal.pipelines.tiny_wan import ensure_tiny_wan
    from video_stack import start_video_stack

    torch.set_num_threads(1)
    load_avg_start = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="jacana-video-bench-"))
    card = card_for(default_specs()[0])
    model_dir = ensure_tiny_wan(root / "cache")  # the worker finds it built
    print(f"[bench] starting the stack under {root}", flush=True)
    stack = start_video_stack(root)
    sent: list[str] = []  # the API peer of each render sent, in order
    try:
        peers = {"bare": bare_peer(model_dir, card)}
        for ms in args.poll_ms:
            peers[f"api {ms} ms"] = api_peer(stack.base_url, card, ms)

        def run(name: str, seed: int) -> float:
            if name != "bare":
                sent.append(name)
            return peers[name](seed)

        print("[bench] warm-up", flush=True)
        for seed in range(args.warmup):
            for name in peers:
                run(name, 10_000 + seed)
        times: dict[str, list[float]] = {name: [] for name in peers}
        for rep in range(args.reps):
            names = list(peers)
            order = names[rep % len(names) :] + names[: rep % len(names)]  # rotate
            for name in order:
                times[name].append(run(name, rep))
            print(
                f"[bench] rep {rep + 1}/{args.reps}: "
                + ", ".join(f"{n} {times[n][-1] * 1000:.0f} ms" for n in peers),
                flush=True,
            )
        # the worker's own time for each render, in the order they were sent
        tasks = [float(x) for x in _TASK_DONE.findall(stack.workers[0].log_text())]
    finally:
        stack.stop()
    task_s: dict[str, list[float]] = {}
    if len(tasks) == len(sent):  # else a render was re-delivered: no pairing to trust
        for name, seconds in zip(sent, tasks, strict=True):
            task_s.setdefault(name, []).append(seconds)
        task_s = {name: values[args.warmup :] for name, values in task_s.items()}
    bare = times["bare"]
    results = {"bare": {"render_s": spread(bare)}}
    for ms in args.poll_ms:
        name = f"api {ms} ms"
        api = times[name]
        row = {
            "poll_interval_ms": ms,
            "render_s": spread(api),
            "overhead": statistics.median(api) / statistics.median(bare) - 1,
            "per_rep_overhead": spread([a / b - 1 for a, b in zip(api, bare, strict=True)]),
        }
        if name in task_s:
            # inside the worker: the task (render, encoding, files, job record); outside
            # it: the create call, the queue, the hand-over to the pool process, the polls
            row["worker_task_s"] = spread(task_s[name])
            row["outside_task_s"] = spread([a - t for a, t in zip(api, task_s[name], strict=True)])
            row["task_overhead"] = statistics.median(task_s[name]) / statistics.median(bare) - 1
        row["meets_target"] = row["overhead"] <= TARGET
        results[name] = row
    return {
        "benchmark": "video_cpu",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": cpu_machine(load_avg_start),
        "versions": package_versions("diffusers", "openai", "celery", "redis"),
        "model": {
            "id": DEFAULT_MODEL_ID,
            "architecture": card.architecture,
            "weights": "random weights, the embedded tiny model",
            "dtype": "float32",
            "size": card.default_size,
            "seconds": card.default_seconds,
            "fps": card.default_fps,
            "steps": card.default_steps,
            "guidance_scale": card.default_guidance_scale,
        },
        "settings": {"reps": args.reps, "warmup": args.warmup, "poll_interval_ms": args.poll_ms},
        "results": results,
        "target": TARGET,
    }


def _ms(s: dict) -> dict:
    return {k: s[k] * 1000 for k in ("median", "min", "max")}


def render(result: dict) -> str:
    m, s, model = result["machine"], result["settings"], result["model"]
    results = result["results"]
    lines = [
        "# Video service overhead on CPU: the API against the bare pipeline",
        "",
        f"{model['id']} ({model['weights']}; {model['dtype']}), {model['size']}, "
        f"{model['seconds']} s at {model['fps']} fps, {model['steps']} steps, guidance "
        f"{model['guidance_scale']}; median (min–max) of {s['reps']} renders per path, the "
        f"paths in rotating order, after {s['warmup']} warm-up renders each; one torch "
        "thread. API: the openai SDK's `videos.create_and_poll` at the poll interval shown, "
        "through the gateway, the multimodal service, Redis and one Celery render worker, "
        "create to completed; the worker's task time is Celery's own figure. Bare: "
        "`WanPipeline` in-process with the same arguments, then the same MP4, thumbnail "
        "and spritesheet encoders, into memory.",
        "",
        "| path | create → completed ms | overhead | worker's task ms | task overhead | "
        "outside the task ms |",
        "|---|---:|---:|---:|---:|---:|",
        f"| bare pipeline + encoding | {fmt_spread(_ms(results['bare']['render_s']), 0)} "
        "| - | - | - | - |",
    ]
    for name, row in results.items():
        if name == "bare":
            continue
        per_rep = row["per_rep_overhead"]
        task = row.get("worker_task_s")
        task_cells = (
            f"{fmt_spread(_ms(task), 0)} | {row['task_overhead']:+.1%} | "
            f"{fmt_spread(_ms(row['outside_task_s']), 0)}"
            if task
            else "- | - | -"
        )
        lines.append(
            f"| API, polling every {row['poll_interval_ms']} ms | "
            f"{fmt_spread(_ms(row['render_s']), 0)} | **{row['overhead']:+.1%}** "
            f"({per_rep['min']:+.1%} – {per_rep['max']:+.1%}) | {task_cells} |"
        )
    lines += [
        "",
        f"Overhead = API median / bare median − 1 (per-rep range in brackets); target ≤ "
        f"{result['target']:.0%}. Task overhead: the same for the worker's task alone.",
        "",
        cpu_machine_line(m, result["versions"], result["date"]),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--poll-ms", type=int, nargs="+", default=POLL_MS, help="the SDK's poll intervals"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root")
    args = parser.parse_args()
    if args.reps < 3:
        parser.error("--reps must be at least 3 (medians with spread)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.append(str(ROOT / "tests"))  # video_stack and the helpers it starts the stack with
    result = measure(args)
    table = render(result)
    write_results(args.out, "video_cpu", result, table, hardware("cpu"))
    print(table)


if __name__ == "__main__":
    main()
