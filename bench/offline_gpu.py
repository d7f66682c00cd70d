"""Offline GPU benchmark: Jacana's engine in-process vs HF transformers ``generate``.

Both peers run in this one process on the same GPU, with random bf16 weights of the real
architecture (``bench/configs/<model>/config.json``; dummy weights: speed only, no
quality), the same random prompt ids, greedy decoding, EOS ignored; each repetition runs
Jacana then transformers on fresh prompts (so no run hits Jacana's prefix cache).

Workloads (per model):
- ``b1``: one request, 128 prompt / 256 new tokens: TTFT, TPOT = (t_last - t_first) / 255.
- ``ttft1024``: one 1024-token prompt, one new token: TTFT.
- ``c64``: closed loop at 64 in flight, 1024 / 128, ``2 * 64`` requests: output tok/s
  (all output tokens / wall time), median TTFT and TPOT per request. Transformers runs
  the same shapes as one static batch of 64 (its ``generate`` has no continuous batching).

Also recorded: start-up (weights, KV pool, CUDA-graph capture), peak host RSS after
loading, GPU memory, the GPU time of one replayed decode graph, with ``--profile`` a
torch.profiler kernel table of Jacana's steps for each workload, and with ``--timeline``
where a batch-1 decode step's time goes on the GPU (busy, idle, the largest idle gaps and
what runs outside the graphs: ``step_timeline.py``).

Writes ``<out>/offline_gpu/<hardware>.json`` and ``.md`` (``--out``, default bench/results;
hardware: the GPU's model, e.g. ``h200``), the JSON after each model.

Usage: python bench/offline_gpu.py --model qwen3-8b [--reps 3] [--no-hf] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import step_timeline as timeline
import torch
from common import (
    RESULTS_DIR,
    config_dir,
    dummy_engine_config,
    environment,
    fmt_spread,
    hardware,
    random_prompts,
    results_paths,
    spread,
)

from jacana_engine.config import EngineConfig
from jacana_engine.core.engine import LLMEngine
from jacana_engine.sample.params import SamplingParams
from jacana_engine.tuning.decode_gemm import describe_decode_gemms

# what each workload reports, in table order (the peer has TTFT, TPOT and tokens/s only)
METRICS = (
    "ttft_ms",
    "tpot_ms",
    "itl_ms",
    "itl_tail_ms",
    "itl_max_ms",
    "itl_drift_ms",
    "gc_ms_a_token",
    "output_tok_s",
)
WORKLOADS = {
    "b1": {"concurrency": 1, "requests": 1, "prompt": 128, "new": 256},
    "ttft1024": {"concurrency": 1, "requests": 1, "prompt": 1024, "new": 1},
    "c64": {"concurrency": 64, "requests": 128, "prompt": 1024, "new": 128},
}


# ---- Jacana -------------------------------------------------------------------------------


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _gib(fn_name: str) -> float:
    return getattr(torch.cuda, fn_name)() / 2**30 if torch.cuda.is_available() else 0.0


def engine_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The ``EngineConfig`` fields the command line sets, beside the model, its KV pool and
    device: what ``build_engine`` starts the engine with and the results record."""
    return dict(
        max_num_batched_tokens=args.max_batched_tokens,
        enforce_eager=args.eager,
        decode_gemm=args.decode_gemm,
        fuse_rope_attention=args.fuse_rope_attention,
        exact_decode_attention=args.exact_decode_attention,
        tuning_cache=args.tuning_cache,
        pdl=not args.no_pdl,
        overlap_decode=not args.serial,
        prefill_graph_tokens=args.prefill_graph_tokens,
        prefill_graph_seqs=args.prefill_graph_seqs,
        eager_row_buckets=args.eager_row_buckets,
    )


def build_engine(model: str, args: argparse.Namespace) -> tuple[LLMEngine, dict[str, Any]]:
    config = dummy_engine_config(
        model, kv_gib=args.kv_gib, device=args.device, **engine_fields(args)
    )
    _sync()
    t0 = time.perf_counter()
    engine = LLMEngine(config, tokenizer=None)
    _sync()
    startup = time.perf_counter() - t0
    graphs = engine.runner.graphs
    info = {
        "startup_s": startup,
        "cuda_graph_capture_s": graphs.capture_seconds if graphs else 0.0,
        "prefill_graph_capture_s": getattr(engine.runner.prefill_graphs, "capture_seconds", 0.0),
        # the decode-GEMM tuners (chain and in-graph), before the capture
        "decode_gemm_tuning_s": engine.runner.tuning_seconds,
        # the dummy requests served before ready (LLMEngine.warm_up; older engines: none)
        "warm_up_s": getattr(engine, "warm_up_seconds", 0.0),
        "cuda_graph_sizes": graphs.sizes if graphs else [],
        "kv_cache_gib": engine.runner.kv_plan.num_bytes / 2**30,
        "peak_host_rss_gib_after_load": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "gpu_allocated_gib_after_start": _gib("memory_allocated"),
        "weights_gib": sum(p.numel() * p.element_size() for p in engine.model.parameters()) / 2**30,
        # the tuner's picks: close timings may pick differently run to run
        "decode_gemm_picks": describe_decode_gemms(engine.model),
    }
    return engine, info


class GcPauses:
    """Seconds the garbage collector ran while this context was open (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def sampling_field(text: str) -> tuple[str, Any]:
    """``FIELD=VALUE`` of ``--sampling``: a ``SamplingParams`` field, its value in JSON."""
    field_name, _, value = text.partition("=")
    if field_name not in SamplingParams.__dataclass_fields__ or not value:
        raise argparse.ArgumentTypeError(f"not FIELD=VALUE of a SamplingParams field: {text!r}")
    return field_name, json.loads(value)


def run_closed_loop(
    engine: LLMEngine,
    prompts: list[list[int]],
    concurrency: int,
    new_tokens: int,
    sampling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Keep ``concurrency`` requests in flight until every prompt has run; per-request
    TTFT/TPOT, total output tokens over wall time, and the inter-token intervals: their
    median (``itl_ms``), their largest, and how much the slow ones add to the mean
    (``itl_tail_ms`` = mean - median: a one-off stall shows there, not in the median),
    with one request at a time how much slower its last quarter of intervals ran than its
    first (``itl_drift_ms``, medians: a batch-1 step that reaches the card's power cap
    within the request shows there, 0.02-0.08 ms on an H200, while
    the growing context adds a few µs), and the Python garbage collector's pauses over
    the run, per output token (``gc_ms_a_token``: one cause such a stall could have).
    With one request at a time, also the intervals in order (``itl_series_ms``: whether
    slow steps come with the growing context, or now and then) and the wall-clock time
    of the first token (``itl_series_t0_unix``, to line them up with ``nvidia-smi``'s
    samples). ``sampling``: more ``SamplingParams`` fields every request sets (logprobs,
    penalties, ...)."""
    sp = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, **(sampling or {}))
    pending = list(enumerate(prompts))
    submitted: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    count: dict[str, int] = {}
    intervals: list[float] = []  # seconds a token, each output after a request's first
    gc_pauses = GcPauses()
    _sync()
    start = time.perf_counter()
    start_unix = time.time()  # the wall clock at ``start``: perf_counter times map onto it

    def submit() -> None:
        i, p = pending.pop(0)
        rid = f"r{i}"
        submitted[rid] = time.perf_counter()
        count[rid] = 0
        engine.add_request(rid, p, sp)

    for _ in range(min(concurrency, len(pending))):
        submit()
    with gc_pauses:
        while engine.has_unfinished_requests():
            outs = engine.step()
            now = time.perf_counter()
            for out in outs:
                if out.new_token_ids:
                    if out.request_id in last:
                        gap = (now - last[out.request_id]) / len(out.new_token_ids)
                        intervals += [gap] * len(out.new_token_ids)
                    first.setdefault(out.request_id, now)
                    last[out.request_id] = now
                    count[out.request_id] += len(out.new_token_ids)
                if out.finished and pending:
                    submit()
    wall = time.perf_counter() - start
    total = sum(count.values())
    ttft = [first[r] - submitted[r] for r in first]
    tpot = [(last[r] - first[r]) / (count[r] - 1) for r in first if count[r] > 1]
    itl = statistics.median(intervals) if intervals else None
    return {
        "wall_s": wall,
        "output_tokens": total,
        "output_tok_s": total / wall,
        "ttft_ms": 1e3 * statistics.median(ttft),
        "tpot_ms": 1e3 * statistics.median(tpot) if tpot else None,
        "itl_ms": 1e3 * itl if intervals else None,
        "itl_tail_ms": 1e3 * (statistics.fmean(intervals) - itl) if intervals else None,
        "itl_max_ms": 1e3 * max(intervals) if intervals else None,
        "itl_drift_ms": itl_drift_ms(intervals) if concurrency == 1 else None,
        "gc_ms_a_token": 1e3 * gc_pauses.seconds / total if total else None,
    } | (
        {
            "itl_series_ms": [round(1e3 * x, 4) for x in intervals],
            "itl_series_t0_unix": start_unix + min(first.values()) - start,
        }
        if concurrency == 1 and first
        else {}
    )


def itl_drift_ms(intervals: list[float]) -> float | None:
    """The median of the last quarter of ``intervals`` (seconds, in order) minus the median
    of the first quarter, in ms; None for fewer than 8."""
    if len(intervals) < 8:
        return None
    quarter = len(intervals) // 4
    return 1e3 * (statistics.median(intervals[-quarter:]) - statistics.median(intervals[:quarter]))


def graph_replay_ms(engine: LLMEngine, batch: int) -> float | None:
    """GPU time of one decode-graph replay at ``batch`` (padded size), CUDA events; its
    rows attend one KV token each, as padding rows do. The start-up graphs end with the
    lm_head and the greedy argmax (``DecodeGraphs(head=...)``): a decode step's whole
    GPU work but its copies."""
    graphs = engine.runner.graphs
    if graphs is None or graphs.padded_size(batch) is None:
        return None
    return 1e3 * graphs.replay_seconds(graphs.padded_size(batch), 1, replays=20)


class StepParts:
    """Where the engine's steps spent their wall time over some runs, per step: the
    ``step_seconds_total`` parts of ``EngineStats`` (schedule / execute / outputs)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.steps = 0
        self.overlapped = 0  # of those, launched before the previous step's tokens were read

    @contextlib.contextmanager
    def measure(self, engine: LLMEngine):
        before = engine.stats()
        yield
        after = engine.stats()
        self.steps += after.steps_total - before.steps_total
        self.overlapped += after.overlapped_steps_total - before.overlapped_steps_total
        for part, total in after.step_seconds_total.items():
            spent = total - before.step_seconds_total.get(part, 0.0)
            self.seconds[part] = self.seconds.get(part, 0.0) + spent

    def per_step_ms(self) -> dict[str, float]:
        """Milliseconds per step of each part, and the share of steps that overlapped."""
        out = {part: 1e3 * s / max(1, self.steps) for part, s in self.seconds.items()}
        out["overlapped_share"] = self.overlapped / max(1, self.steps)
        return out


def profile_table(engine: LLMEngine, prompts, wl: dict[str, Any], rows: int = 25) -> str:
    """torch.profiler's CUDA-time table over one run of a workload (at most 32 steps of
    decode for the long ones)."""
    from torch.profiler import ProfilerActivity, profile

    new = min(wl["new"], 32)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_closed_loop(engine, prompts, wl["concurrency"], new)
        _sync()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows)


def b1_step_timeline(
    engine: LLMEngine, prompts, new_tokens: int = 64, sampling: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``step_timeline.summarize`` of one profiled run of ``new_tokens`` steps at batch 1:
    per decode step, GPU busy and idle time, the largest idle gaps and what runs outside
    the graphs."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_closed_loop(engine, prompts[:1], 1, new_tokens, sampling)
        _sync()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        return timeline.summarize(timeline.load_events(trace))


def host_profile(
    engine: LLMEngine,
    prompts: list[list[int]],
    new_tokens: int,
    sampling: dict[str, Any] | None = None,
    rows: int = 30,
) -> tuple[float, str]:
    """Wall seconds of one closed-loop run of ``prompts``, one at a time, under cProfile,
    and its functions with the most time of their own: where a host-bound step's time
    goes (a wait for the device shows as time in the call that waits)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    _sync()
    profiler.enable()
    result = run_closed_loop(engine, prompts, 1, new_tokens, sampling)
    _sync()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(rows)
    return result["wall_s"], text.getvalue()


# ---- transformers -------------------------------------------------------------------------


def build_hf(model: str, device: str):
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(config_dir(model))
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    hf.eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf


def hf_generate_s(hf, prompts: list[list[int]], new_tokens: int) -> float:
    ids = torch.tensor(prompts, device=hf.device)
    _sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
        )
    _sync()
    return time.perf_counter() - t0


def hf_workload(hf, prompts, wl: dict[str, Any]) -> dict[str, Any]:
    if wl["concurrency"] == 1:
        ttft = hf_generate_s(hf, prompts[:1], 1)
        res: dict[str, Any] = {"ttft_ms": 1e3 * ttft}
        if wl["new"] > 1:
            total = hf_generate_s(hf, prompts[:1], wl["new"])
            res["tpot_ms"] = 1e3 * (total - ttft) / (wl["new"] - 1)
            res["output_tok_s"] = wl["new"] / total
        return res
    batch = prompts[: wl["concurrency"]]
    ttft = hf_generate_s(hf, batch, 1)
    total = hf_generate_s(hf, batch, wl["new"])
    return {
        "ttft_ms": 1e3 * ttft,
        "tpot_ms": 1e3 * (total - ttft) / (wl["new"] - 1),
        "output_tok_s": len(batch) * wl["new"] / total,
    }


# ---- driver -------------------------------------------------------------------------------


def bench_model(model: str, args: argparse.Namespace) -> dict[str, Any]:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    engine, info = build_engine(model, args)
    vocab = engine.vocab_size
    # warm-up: every workload once (kernel compilation, allocator growth)
    for i, wl in enumerate(WORKLOADS.values()):
        prompts = random_prompts(wl["requests"], wl["prompt"], vocab, seed=500 + i)
        run_closed_loop(engine, prompts, wl["concurrency"], min(wl["new"], 8), args.sampling)
    info["gpu_peak_gib_jacana"] = _gib("max_memory_allocated")
    info["decode_graph_gpu_ms"] = {b: graph_replay_ms(engine, b) for b in (1, 64)}
    hf = None
    if not args.no_hf:
        base = _gib("memory_allocated")
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        hf = build_hf(model, args.device)
        hf_generate_s(hf, random_prompts(1, 16, vocab, seed=5), 4)  # warm-up
        info["gpu_peak_gib_hf_warmup"] = _gib("max_memory_allocated") - base
    results: dict[str, Any] = {}
    for name, wl in WORKLOADS.items():
        ours: dict[str, list[float]] = {}
        theirs: dict[str, list[float]] = {}
        parts = StepParts()
        series = []  # itl_series_ms of each rep (one request at a time only)
        for rep in range(args.reps):
            prompts = random_prompts(wl["requests"], wl["prompt"], vocab, seed=1000 * rep + 7)
            with parts.measure(engine):
                r = run_closed_loop(engine, prompts, wl["concurrency"], wl["new"], args.sampling)
            for k in METRICS:
                if r.get(k) is not None:
                    ours.setdefault(k, []).append(r[k])
            if "itl_series_ms" in r:
                series.append({"t0_unix": r["itl_series_t0_unix"], "ms": r["itl_series_ms"]})
            if hf is not None:
                for k, v in hf_workload(hf, prompts, wl).items():
                    theirs.setdefault(k, []).append(v)
        results[name] = {
            "workload": wl,
            "jacana": {k: spread(v) for k, v in ours.items()},
            "transformers": {k: spread(v) for k, v in theirs.items()},
            "jacana_step_ms": parts.per_step_ms(),
        } | ({"jacana_itl_series_ms": series} if series else {})
        medians = {
            peer: {k: round(v["median"], 3) for k, v in results[name][peer].items()}
            for peer in ("jacana", "transformers")
        }
        print(name, json.dumps(medians), flush=True)
    if hf is not None:
        del hf
        gc.collect()
    profiles = {}
    if args.profile:
        for name, wl in WORKLOADS.items():
            prompts = random_prompts(wl["concurrency"], wl["prompt"], vocab, seed=99)
            profiles[name] = profile_table(engine, prompts, wl)
    if args.timeline:
        prompts = random_prompts(1, WORKLOADS.get("b1", {}).get("prompt", 128), vocab, seed=98)
        info["b1_step_timeline"] = b1_step_timeline(engine, prompts, sampling=args.sampling)
        print(f"{model} b1 step timeline (profiled)")
        print(timeline.render(info["b1_step_timeline"]), flush=True)
    if args.host_profile:
        b1 = WORKLOADS["b1"]
        prompts = random_prompts(1, b1["prompt"], vocab, seed=97)
        wall, text = host_profile(engine, prompts, b1["new"], args.sampling)
        info["b1_host_profile"] = {"wall_ms": 1e3 * wall, "tottime": text}
        print(f"{model} b1 under cProfile: {1e3 * wall:.1f} ms for {b1['new']} tokens")
        print(text, flush=True)
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"info": info, "results": results, "profiles": profiles}


def render(doc: dict[str, Any]) -> str:
    lines = [
        "# Offline GPU benchmark: Jacana engine vs HF transformers (same process, same GPU)",
        "",
        f"Environment: `{json.dumps(doc['environment'])}`. Random bf16 weights with the real "
        "shapes (speed only). Median (min–max) of "
        f"{doc['reps']} reps.",
        "",
        "| model | workload | metric | Jacana | transformers | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for model, m in doc["models"].items():
        for name, r in m["results"].items():
            for metric in METRICS:
                ours, theirs = r["jacana"].get(metric), r["transformers"].get(metric)
                if ours is None:
                    continue
                ratio = "-"
                if theirs:
                    big_is_good = metric == "output_tok_s"
                    q = ours["median"] / theirs["median"]
                    ratio = f"{q if big_is_good else 1 / q:.1f}x"
                lines.append(
                    f"| {model} | {name} | {metric} | {fmt_spread(ours)} | "
                    f"{fmt_spread(theirs)} | {ratio} |"
                )
    lines += [
        "",
        "Jacana's engine steps, ms per step: schedule (drafting, scheduling) / execute "
        "(forward and sampling until the tokens are on the host, GPU wait included) / "
        "outputs (appending, detokenizing, stop checks). With overlapped decoding (the "
        "default) a decode step's execute is only its launch, and the wait for the step "
        "before it (whose tokens are read back after the launch) lands in outputs:",
        "",
        "| model | workload | schedule | execute | outputs | steps overlapped |",
        "|---|---|---|---|---|---|",
    ]
    for model, m in doc["models"].items():
        for name, r in m["results"].items():
            p = r.get("jacana_step_ms") or {}
            if p:
                shared = p.get("overlapped_share")
                lines.append(
                    f"| {model} | {name} | {p['schedule']:.3f} | {p['execute']:.3f} | "
                    f"{p['outputs']:.3f} | {'-' if shared is None else f'{shared:.0%}'} |"
                )
    lines += [
        "",
        "| model | start-up s | GEMM tuning s | graph capture s | warm-up s | KV GiB | "
        "host RSS GiB | GPU peak GiB | decode graph GPU ms, lm_head and argmax in it (b1 / b64) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model, m in doc["models"].items():
        i = m["info"]
        g = i["decode_graph_gpu_ms"]
        gs = " / ".join(f"{g[b]:.3f}" if g.get(b) else "-" for b in g)
        tuning = i.get("decode_gemm_tuning_s")  # not kept by earlier runs
        warm_up = i.get("warm_up_s")
        lines.append(
            f"| {model} | {i['startup_s']:.1f} | "
            f"{'-' if tuning is None else f'{tuning:.1f}'} | {i['cuda_graph_capture_s']:.1f} | "
            f"{'-' if warm_up is None else f'{warm_up:.2f}'} | {i['kv_cache_gib']:.1f} | "
            f"{i['peak_host_rss_gib_after_load']:.2f} | "
            f"{i['gpu_peak_gib_jacana']:.1f} | {gs} |"
        )
    return "\n".join(lines)


def bench_each_model(doc: dict[str, Any], args: argparse.Namespace) -> None:
    """``doc["models"][m] = bench_model(m, args)`` for each ``--model``, writing the JSON
    result after each (a later model's failure keeps the earlier ones), then its table."""
    json_path, md_path = results_paths(args.out, "offline_gpu", hardware(args.device))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    for model in args.model:
        doc["models"][model] = bench_model(model, args)
        json_path.write_text(json.dumps(doc, indent=2) + "\n")
    table = render(doc)
    md_path.write_text(table + "\n")
    print(table)


def engine_parser(description: str) -> argparse.ArgumentParser:
    """The engine and output options (``build_engine`` reads them); ``--model`` may
    repeat."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-hf", action="store_true")
    parser.add_argument("--eager", action="store_true", help="Jacana without CUDA graphs")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--timeline", action="store_true", help="per-step GPU busy/idle of b1 (step_timeline.py)"
    )
    parser.add_argument(
        "--host-profile", action="store_true", help="one b1 request under cProfile (host time)"
    )
    parser.add_argument(
        "--decode-gemm", choices=["auto", "torch"], default="auto", help="EngineConfig.decode_gemm"
    )
    parser.add_argument(
        "--fuse-rope-attention",
        action=argparse.BooleanOptionalAction,
        default=EngineConfig.model_fields["fuse_rope_attention"].default,
        help="EngineConfig.fuse_rope_attention (on by default, as there)",
    )
    parser.add_argument(
        "--exact-decode-attention",
        action=argparse.BooleanOptionalAction,
        default=EngineConfig.model_fields["exact_decode_attention"].default,
        help="EngineConfig.exact_decode_attention (on by default, as there)",
    )
    parser.add_argument("--no-pdl", action="store_true", help="EngineConfig.pdl off")
    parser.add_argument(
        "--serial", action="store_true", help="decode steps one at a time (overlap_decode off)"
    )
    parser.add_argument(
        "--tuning-cache",
        default=None,
        help="EngineConfig.tuning_cache: runs sharing one file run the same decode GEMM picks "
        "(default: timed at every start)",
    )
    parser.add_argument(
        "--prefill-graph-tokens",
        type=int,
        default=EngineConfig.model_fields["prefill_graph_tokens"].default,
        help="EngineConfig.prefill_graph_tokens (prefill graphs; 0: off; default: the engine's)",
    )
    parser.add_argument(
        "--prefill-graph-seqs",
        type=int,
        default=EngineConfig.model_fields["prefill_graph_seqs"].default,
        help="EngineConfig.prefill_graph_seqs (1: one prompt chunk alone; mixed steps eager)",
    )
    parser.add_argument(
        "--eager-row-buckets",
        action=argparse.BooleanOptionalAction,
        default=EngineConfig.model_fields["eager_row_buckets"].default,
        help="EngineConfig.eager_row_buckets (on by default, as there)",
    )
    parser.add_argument(
        "--sampling",
        type=sampling_field,
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a SamplingParams field every request sets, the value in JSON (repeatable; "
        "e.g. logprobs=5, presence_penalty=0.5); default: greedy, nothing else",
    )
    parser.add_argument("--kv-gib", type=float, default=24.0)
    parser.add_argument("--max-batched-tokens", type=int, default=8192)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root")
    parser.add_argument("--device", default="cuda")
    return parser


def main() -> None:
    parser = engine_parser(__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    args = parser.parse_args()
    args.sampling = dict(args.sampling)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for name in list(WORKLOADS):
        if name not in args.workloads:
            del WORKLOADS[name]
    doc: dict[str, Any] = {
        "environment": environment(),
        "reps": args.reps,
        "settings": engine_fields(args),
        "sampling": args.sampling,
        "models": {},
    }
    bench_each_model(doc, args)


if __name__ == "__main__":
    main()
