"""Kernels compiled while serving: whether varied traffic makes the engine compile after start-up.

Triton compiles a kernel once per *specialization*: besides its constexprs, every integer
argument equal to 1 or divisible by 16, and every pointer aligned to 16 bytes, selects its
own binary. A specialization that start-up never ran is compiled the first time a step
needs it, and that step stalls for the compile (0.5-1.5 s on the GPU machine's host) with
every request in the batch behind it.

This starts the engine in-process (random bf16 weights of the real shapes) on a Triton
cache of its own, so every kernel it compiles lands there as a new entry, and then serves
``--passes`` passes of varied traffic: prompt lengths from 1 to 1,500 tokens, some sharing
a prefix, 1 to 96 new tokens, greedy and seeded top-k/top-p/min-p sampling, penalties and
logprobs on some, at several concurrencies (closed loop). Per pass: the kernels compiled
(name, and the TTIR signature that tells one specialization from another), the longest
step, and the wall time. With nothing compiled after start-up, every pass shows 0.

The engine's start-up warm-up (``jacana_engine/worker/warm_up.py``) runs apart from the rest of
the start-up, so its own compiles and seconds are counted on their own; ``--no-warm-up``
skips it (what serving compiles without it). ``--speculative ngram`` or ``--speculative
draft_model --draft-model qwen3-0.6b`` (random weights of that config, on the engine's
device) serves with in-process speculation, drafting always (no dynamic k: random weights
accept little, and the gate would stop drafting), so the verification steps' and the
draft model's kernels are counted too. Each pass also names its longest step's tokens.
``--replay`` serves the same traffic every pass, so pass 0's steps can be set against the
same steps replayed (what a first use costs), ``--profile-host`` says in which host
functions pass 0 spent its extra time (cProfile), and ``--profile-cuda`` in which operators,
CUDA API calls (module loads and allocations among them) and kernels (torch.profiler).

Usage: python research/compile_stability_gpu.py --model qwen3-0.6b [--passes 3] [--no-warm-up]
       [--speculative ngram|draft_model [--draft-model NAME]]
       [--replay [--profile-host] [--profile-cuda]] [--no-eager-row-buckets] [--out DIR]
"""

from __future__ import annotations

import argparse
import bisect
import cProfile
import json
import os
import pstats
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    config_dir,
    dummy_engine_config,
    environment,
    hardware,
    triton_cache_kernels,
    write_results,
)

RESULTS = Path(__file__).resolve().parent / "results"
CONCURRENCIES = (1, 3, 17, 64)


def random_request(rng: random.Random, vocab: int, prefix: list[int]) -> tuple[list[int], Any]:
    from jacana_engine.sample.params import SamplingParams

    length = rng.choice([rng.randint(1, 40), rng.randint(1, 600), rng.randint(600, 1500)])
    prompt = [rng.randrange(vocab) for _ in range(length)]
    if rng.random() < 0.25:  # shares a prefix: the prefix cache serves its first blocks
        prompt = prefix + prompt[: max(1, length - len(prefix))]
    if rng.random() < 0.5:
        extra: dict[str, Any] = {
            "temperature": rng.choice([0.6, 1.0]),
            "top_k": rng.choice([0, 20, 50]),
            "top_p": rng.choice([1.0, 0.9]),
            "min_p": rng.choice([0.0, 0.05]),
            "seed": rng.randrange(1 << 30),
        }
    else:
        extra = {"temperature": 0.0}
    if rng.random() < 0.15:
        extra["repetition_penalty"] = 1.1
    if rng.random() < 0.15:
        extra["presence_penalty"] = 0.5
    if rng.random() < 0.1:
        extra["logprobs"] = rng.choice([0, 5])
    sp = SamplingParams(max_tokens=rng.randint(1, 96), ignore_eos=True, **extra)
    return prompt, sp


class StepProbe:
    """What the engine's latest step did besides its time: the prompt and generated tokens
    of its forward pass (its throughput meter's ``record``, called once a forward, wrapped
    to keep the last pair), and how many Triton kernels were loaded into the process so
    far (``jit_post_compile_hook``: every in-memory cache miss, whether the binary came
    from the disk cache or was compiled), by name; with a draft model in process, the token
    rows its forward passes computed so far (catch-ups and one-token drafts). One per
    engine (``_reset_bookkeeping`` builds a new meter: make it after the warm-up)."""

    def __init__(self, engine: Any) -> None:
        self.last = (0, 0)
        self.step = 0  # the pass's step count so far (serve_pass resets it)
        self.loads: list[str] = []
        meter = engine._throughput
        record = meter.record

        def keep(prompt_tokens: int, generation_tokens: int) -> None:
            self.last = (prompt_tokens, generation_tokens)
            record(prompt_tokens, generation_tokens)

        meter.record = keep
        self.counts_loads = install_load_hook(self.loads)
        self.draft_rows = 0
        proposer = getattr(engine.speculator, "proposer", None)
        if hasattr(proposer, "_step"):  # DraftModelProposer: its forward over new tokens
            forward = proposer._step

            def count(chunks: list) -> list[int]:
                self.draft_rows += sum(len(new) for _, new in chunks)
                return forward(chunks)

            proposer._step = count


def install_load_hook(loads: list[str]) -> bool:
    """Append the name of each Triton kernel loaded into this process to ``loads``;
    False where this Triton has no ``knobs.runtime.jit_post_compile_hook``."""
    try:
        from triton import knobs
    except ImportError:
        return False
    runtime = knobs.runtime
    if not hasattr(runtime, "jit_post_compile_hook"):
        return False

    def loaded(*, fn: Any, **_: Any) -> None:
        loads.append(getattr(fn, "name", str(fn)))

    runtime.jit_post_compile_hook = loaded
    return True


def closed_loop(
    engine: Any, probe: StepProbe, requests: list, concurrency: int, tag: str
) -> tuple[int, list[tuple[float, int, int, int, int]]]:
    """Keep ``concurrency`` of ``requests`` in flight until all have run: the output
    tokens, and each step's (ms, prompt tokens, generated tokens, Triton kernels loaded,
    draft-model rows) in order (an overlapped step's tokens are those of the step it read
    back)."""
    from torch.profiler import record_function  # torch after main() set Triton's cache

    pending = list(requests)
    output_tokens, steps = 0, []

    def submit() -> None:
        prompt, sp = pending.pop()
        engine.add_request(f"{tag}-{len(pending)}", prompt, sp)

    for _ in range(min(concurrency, len(pending))):
        submit()
    while engine.has_unfinished_requests():
        loaded, drafted = len(probe.loads), probe.draft_rows
        t0 = time.perf_counter()
        with record_function(f"{STEP_LABEL}{probe.step}"):  # names the step in a profile
            outs = engine.step()
        ms = (time.perf_counter() - t0) * 1e3
        probe.step += 1
        steps.append((ms, *probe.last, len(probe.loads) - loaded, probe.draft_rows - drafted))
        for out in outs:
            output_tokens += len(out.new_token_ids)
            if out.finished and pending:
                submit()
    return output_tokens, steps


def serve_pass(
    engine: Any,
    probe: StepProbe,
    rng: random.Random,
    vocab: int,
    index: int,
    concurrencies: list[int],
) -> dict[str, Any]:
    """One pass: at each concurrency, a closed loop over 2 x concurrency requests."""
    prefix = [rng.randrange(vocab) for _ in range(rng.choice([16, 40, 256]))]
    output_tokens, steps = 0, []
    probe.step = 0
    start = time.perf_counter()
    for concurrency in concurrencies:
        requests = [random_request(rng, vocab, prefix) for _ in range(2 * concurrency)]
        out, loop_steps = closed_loop(
            engine, probe, requests, concurrency, f"p{index}c{concurrency}"
        )
        output_tokens += out
        steps += loop_steps
    longest = max(steps)
    return {
        "requests": 2 * sum(concurrencies),
        "output_tokens": output_tokens,
        "steps": len(steps),
        "wall_s": time.perf_counter() - start,
        "longest_step_ms": longest[0],
        "longest_step_tokens": list(longest[1:3]),  # (prompt tokens computed, generated)
        "longest_step_draft_rows": longest[4],
        # each step: [ms, prompt tokens, generated tokens, Triton kernels loaded in it,
        # token rows the draft model computed in it]
        "step_log": [[round(ms, 3), p, g, k, d] for ms, p, g, k, d in steps],
    }


def first_use_extra_ms(first: dict, replay: dict) -> float:
    """How much longer ``first``'s steps took than ``replay``'s, summed (steps lined up)."""
    pairs = zip(first["step_log"], replay["step_log"], strict=True)
    return sum(a[0] - b[0] for a, b in pairs)


def first_use_steps(first: dict, replay: dict, top: int = 12) -> list[dict[str, Any]]:
    """Steps of ``first`` that took longer than the same step of ``replay`` (the same
    traffic again: same composition, step by step), most extra time first."""
    if [s[1:3] for s in first["step_log"]] != [s[1:3] for s in replay["step_log"]]:
        return []  # the steps did not line up: nothing to compare
    extra = [
        {
            "step": i,
            "ms": a[0],
            "replay_ms": b[0],
            "prompt_tokens": a[1],
            "generated": a[2],
            "kernels_loaded": a[3],
        }
        for i, (a, b) in enumerate(zip(first["step_log"], replay["step_log"], strict=True))
    ]
    extra.sort(key=lambda e: e["replay_ms"] - e["ms"])
    return extra[:top]


def own_seconds(profiler: cProfile.Profile) -> dict[str, float]:
    """{function: seconds spent in its own code} of a host profile."""
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (cc, nc, tottime, ...)}
    return {f"{Path(f).name}:{line}:{name}": v[2] for (f, line, name), v in stats.items()}


def torch_profile_self_seconds(profiler: Any) -> tuple[dict[str, float], dict[str, float]]:
    """A torch.profiler run's self time by event name, in seconds: (on the host: operators
    and CUDA runtime/driver calls; on the device: kernels and copies)."""
    host: dict[str, float] = {}
    device: dict[str, float] = {}
    for event in profiler.key_averages():
        cpu_us = event.self_cpu_time_total
        device_us = getattr(event, "self_device_time_total", None)
        if device_us is None:  # torch before the device_* names
            device_us = getattr(event, "self_cuda_time_total", 0.0)
        if cpu_us:
            host[event.key] = host.get(event.key, 0.0) + cpu_us * 1e-6
        if device_us:
            device[event.key] = device.get(event.key, 0.0) + device_us * 1e-6
    return host, device


# The profiler label around each served step, followed by its index in the pass.
STEP_LABEL = "jacana step "
# What CUDA's lazy loading reports as it loads a module or a kernel on a first launch.
LOAD_EVENTS = ("Runtime Triggered Module Loading", "Lazy Function Loading")


def module_loads_by_operator(profiler: Any) -> dict[str, float]:
    """Seconds of CUDA module and kernel loading (``LOAD_EVENTS``) under each operator, by
    the step (``STEP_LABEL``) and the innermost ``aten::`` operator around the load (its
    name and input shapes), else the outermost event around it, else ``?``."""
    events = list(profiler.events())
    outer = sorted(
        (e for e in events if e.cpu_parent is None and e.name not in LOAD_EVENTS),
        key=lambda e: e.time_range.start,
    )
    starts = [e.time_range.start for e in outer]
    loads: dict[str, float] = {}
    for event in events:
        if event.name not in LOAD_EVENTS:
            continue
        owner, step, parent = None, "", event.cpu_parent
        while parent is not None:
            if owner is None and parent.name.startswith("aten::"):
                owner = parent
            if parent.name.startswith(STEP_LABEL):
                step = f"step {parent.name[len(STEP_LABEL) :]}: "
            parent = parent.cpu_parent
        if owner is None:  # not nested: the outermost event whose time holds it
            i = bisect.bisect_right(starts, event.time_range.start) - 1
            if i >= 0 and outer[i].time_range.end >= event.time_range.end:
                owner = outer[i]
        name = "?" if owner is None else f"{owner.name} {list(owner.input_shapes or [])}"
        key = step + name
        loads[key] = loads.get(key, 0.0) + event.time_range.elapsed_us() * 1e-6
    return loads


class PassProfiler:
    """Profiles a pass as the arguments ask: cProfile (own time of Python functions) and/or
    torch.profiler (operators, CUDA API calls, kernels, and which operators loaded CUDA
    modules). ``tables`` maps a table name to {name: seconds} once the pass has run."""

    def __init__(self, host: bool, cuda: bool, device: str) -> None:
        self.cprofile = cProfile.Profile() if host else None
        self.torch_profile = None
        if cuda:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if device.startswith("cuda"):
                activities.append(ProfilerActivity.CUDA)
            self.torch_profile = profile(activities=activities, record_shapes=True)
        self.tables: dict[str, dict[str, float]] = {}

    def __enter__(self) -> PassProfiler:
        if self.torch_profile is not None:
            self.torch_profile.__enter__()
        if self.cprofile is not None:
            self.cprofile.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cprofile is not None:
            self.cprofile.disable()
            self.tables["python"] = own_seconds(self.cprofile)
        if self.torch_profile is not None:
            self.torch_profile.__exit__(*exc)
            host, device = torch_profile_self_seconds(self.torch_profile)
            self.tables["torch host"] = host
            self.tables["torch device"] = device
            self.tables["torch loads"] = module_loads_by_operator(self.torch_profile)


# What each profile table holds, for the report.
PROFILE_TABLES = {
    "python": "Host functions (own time, cProfile)",
    "torch host": "Operators and CUDA API calls on the host (self time, torch.profiler)",
    "torch device": "Kernels and copies on the device (self time, torch.profiler)",
    "torch loads": "CUDA module and kernel loads (lazy loading), by the step and operator "
    "that met them",
}


def profile_first_use(first: dict[str, float], replay: dict[str, float], top: int = 20) -> list:
    """The names whose time pass 0 exceeded pass 1's by most (the same traffic with
    --replay), from two {name: seconds} profiles: [name, pass 0 ms, pass 1 ms]."""
    rows = [[k, v * 1e3, replay.get(k, 0.0) * 1e3] for k, v in first.items()]
    rows.sort(key=lambda r: r[2] - r[1])
    return [[k, round(a, 2), round(b, 2)] for k, a, b in rows[:top]]


def profile_lines(title: str, columns: list[str], rows: list) -> list[str]:
    """A profile table in Markdown: ``title``, then a row per [name, ms, ...] of ``rows``
    under the name and ``columns``."""
    lines = ["", title, "", "| name | " + " | ".join(columns) + " |"]
    lines.append("|---|" + "---|" * len(columns))
    lines += [
        f"| `{name[:120]}` | " + " | ".join(f"{ms:.1f}" for ms in values) + " |"
        for name, *values in rows
    ]
    return lines


def top_seconds(table: dict[str, float], top: int = 25) -> list:
    """The ``top`` names of a {name: seconds} profile that took the most: [name, ms]."""
    rows = sorted(table.items(), key=lambda kv: -kv[1])[:top]
    return [[k, round(v * 1e3, 2)] for k, v in rows]


def speculative_config(args: argparse.Namespace):
    """In-process speculation as ``--speculative`` / ``--draft-model`` ask, drafting always."""
    from jacana_engine.spec.config import SpeculativeConfig

    if args.speculative == "none":
        return SpeculativeConfig()
    draft: dict[str, Any] = {}
    if args.speculative == "draft_model":
        draft = dict(
            draft_model=str(config_dir(args.draft_model) / "config.json"),  # random weights
            draft_device=args.device,
            draft_dtype="bfloat16" if args.device.startswith("cuda") else "float32",
            draft_num_kv_blocks=1024,
        )
    return SpeculativeConfig(
        proposer=args.speculative, num_speculative_tokens=4, dynamic_k=False, **draft
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCIES))
    parser.add_argument("--kv-gib", type=float, default=16.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results root")
    parser.add_argument("--name", help="the result's file stem (default: the hardware)")
    parser.add_argument(
        "--no-warm-up", dest="warm_up", action="store_false", help="skip the engine's warm-up"
    )
    parser.add_argument("--speculative", choices=["none", "ngram", "draft_model"], default="none")
    parser.add_argument("--draft-model", default="qwen3-0.6b", help="for --speculative draft_model")
    parser.add_argument(
        "--profile-host",
        action="store_true",
        help="profile passes 0 and 1 on the host (cProfile) and list the functions whose own "
        "time pass 0 exceeded pass 1's by most (with --replay: where a first use spends), "
        "and those pass 1 spent most in",
    )
    parser.add_argument(
        "--tuning-cache",
        default=None,
        help="EngineConfig.tuning_cache: runs sharing one file decode on the same GEMM picks",
    )
    parser.add_argument(
        "--eager-row-buckets",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="EngineConfig.eager_row_buckets (on by default, as there)",
    )
    parser.add_argument(
        "--prefill-graph-seqs",
        type=int,
        default=0,
        help="EngineConfig.prefill_graph_seqs (0, the default: max_num_seqs, mixed steps "
        "replay; 1: one prompt chunk alone, mixed steps eager)",
    )
    parser.add_argument(
        "--profile-cuda",
        action="store_true",
        help="profile passes 0 and 1 with torch.profiler and list the operators, CUDA API "
        "calls and kernels whose self time pass 0 exceeded pass 1's by most",
    )
    parser.add_argument(
        "--replay",
        action="store_true",
        help="every pass serves the same traffic (prefix caching off, so the steps line up): "
        "what pass 0's steps spent beyond the same steps replayed is first-use cost",
    )
    args = parser.parse_args()

    # A cache of its own, set before Triton reads it: every compile is a new entry here.
    cache = Path(tempfile.mkdtemp(prefix="triton-cache-"))
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    from jacana_engine.core.engine import LLMEngine

    config_path = config_dir(args.model) / "config.json"
    vocab = json.loads(config_path.read_text())["vocab_size"]
    t0 = time.perf_counter()
    engine = LLMEngine(
        dummy_engine_config(
            args.model,
            kv_gib=args.kv_gib,
            device=args.device,
            warm_up=False,  # below, counted on its own
            speculative=speculative_config(args),
            enable_prefix_caching=not args.replay,
            eager_row_buckets=args.eager_row_buckets,
            prefill_graph_seqs=args.prefill_graph_seqs,
            tuning_cache=args.tuning_cache,
        ),
        tokenizer=None,
    )
    startup = time.perf_counter() - t0
    seen = startup_entries = triton_cache_kernels(cache)
    print(f"start-up {startup:.1f} s, {len(seen)} kernels compiled", flush=True)
    warm_up_s, warm_up_compiled = 0.0, []
    if args.warm_up:
        warm_up_s = engine.warm_up()
        now = triton_cache_kernels(cache)
        warm_up_compiled = [now[k] for k in sorted(now.keys() - seen.keys())]
        startup_entries = seen = now
        print(f"warm-up {warm_up_s:.1f} s, {len(warm_up_compiled)} kernels compiled", flush=True)
    probe = StepProbe(engine)
    rng = random.Random(7)
    passes: list[dict[str, Any]] = []
    profiles: list[dict[str, dict[str, float]]] = []
    for index in range(args.passes):
        if args.replay:
            rng = random.Random(7)
        loads_before = len(probe.loads)
        profiled = index < 2 and (args.profile_host or args.profile_cuda)
        profiler = PassProfiler(
            args.profile_host and profiled, args.profile_cuda and profiled, args.device
        )
        with profiler:
            result = serve_pass(engine, probe, rng, vocab, index, args.concurrency)
        if profiled:
            profiles.append(profiler.tables)
        result["kernels_loaded"] = probe.loads[loads_before:] if probe.counts_loads else None
        now = triton_cache_kernels(cache)
        result["compiled"] = [now[k] for k in sorted(now.keys() - seen.keys())]
        seen = now
        passes.append(result)
        summary = {k: v for k, v in result.items() if k != "step_log"}
        print(f"pass {index}: {json.dumps(summary)}", flush=True)
    first_use = first_use_steps(passes[0], passes[1]) if args.replay and args.passes > 1 else []
    first_use_ms = first_use_extra_ms(passes[0], passes[1]) if first_use else None
    profile_extra = {}  # a table each profile filled (no device table without a GPU)
    if len(profiles) == 2:
        for name, first in profiles[0].items():
            if rows := profile_first_use(first, profiles[1][name]):
                profile_extra[name] = rows
    # where a warm pass spends at all (pass 1 where two were profiled)
    profile_top = {name: top_seconds(table) for name, table in (profiles or [{}])[-1].items()}

    lines = [
        "# Kernels compiled while serving varied traffic",
        "",
        f"{args.model}, random bf16 weights"
        + (
            f", speculative {args.speculative}"
            + (
                f" ({args.draft_model}, random weights)"
                if args.speculative == "draft_model"
                else ""
            )
            + ", 4 tokens a step, always drafting"
            if args.speculative != "none"
            else ""
        )
        + f"; start-up {startup:.1f} s compiled "
        f"{len(startup_entries) - len(warm_up_compiled)} kernels on an empty Triton cache, "
        + (
            f"then the warm-up {warm_up_s:.1f} s compiled {len(warm_up_compiled)} more "
            f"({', '.join(sorted({c['kernel'] for c in warm_up_compiled})) or 'none'}). "
            if args.warm_up
            else "without the warm-up (--no-warm-up). "
        )
        + "Each pass: closed loops at concurrency "
        f"{', '.join(map(str, args.concurrency))} (2 x concurrency requests each), prompts of "
        "1-1,500 tokens (a quarter sharing a prefix), 1-96 new tokens, greedy or seeded "
        "sampling, penalties and logprobs on some"
        + ("; every pass the same traffic (--replay), prefix caching off" if args.replay else "")
        + ("" if args.eager_row_buckets else "; eager steps' rows not padded to buckets")
        + ".",
        "",
        "| pass | requests | output tokens | steps | wall s | longest step ms "
        "(prompt / generated tokens; draft-model rows) | Triton kernels loaded | "
        "kernels compiled |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, p in enumerate(passes):
        names = ", ".join(sorted({c["kernel"] for c in p["compiled"]})) or "none"
        lines.append(
            f"| {i} | {p['requests']} | {p['output_tokens']} | {p['steps']} | "
            f"{p['wall_s']:.1f} | {p['longest_step_ms']:.0f} "
            f"({p['longest_step_tokens'][0]} / {p['longest_step_tokens'][1]}; "
            f"{p['longest_step_draft_rows']}) | "
            f"{'n/a' if p['kernels_loaded'] is None else len(p['kernels_loaded'])} | "
            f"{len(p['compiled'])}: {names} |"
        )
    if first_use:
        lines += [
            "",
            "Pass 0's steps that took longest beyond the same step in pass 1 (first-use cost; "
            f"pass 0's steps took {first_use_ms:.0f} ms more in all):",
            "",
            "| step | prompt tokens | generated | Triton kernels loaded | pass 0 ms | pass 1 ms |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {e['step']} | {e['prompt_tokens']} | {e['generated']} | {e['kernels_loaded']} | "
            f"{e['ms']:.1f} | "
            f"{e['replay_ms']:.1f} |"
            for e in first_use
        ]
    elif args.replay:
        lines += ["", "Pass 0's and pass 1's steps did not line up: no first-use comparison."]
    for table, rows in profile_extra.items():
        title = f"{PROFILE_TABLES[table]}: where pass 0 spent most beyond pass 1"
        lines += profile_lines(title, ["pass 0 ms", "pass 1 ms"], rows)
    for table, rows in profile_top.items():
        title = f"{PROFILE_TABLES[table]}: the most time in pass {len(profiles) - 1}"
        lines += profile_lines(title, ["ms"], rows)
    compiled = [c for p in passes for c in p["compiled"]]
    if compiled:
        lines += ["", "Signatures of what compiled after start-up:", ""]
        lines += [f"- `{c['kernel']}`: `{c['signature']}`" for c in compiled]
        lines += ["", "The same kernels' signatures compiled at start-up:", ""]
        lines += [
            f"- `{e['kernel']}`: `{e['signature']}`"
            for e in startup_entries.values()
            if e["kernel"] in {c["kernel"] for c in compiled}
        ]
    doc = {
        "environment": environment(),
        "model": args.model,
        "startup_s": startup,
        "warm_up": args.warm_up,
        "warm_up_s": warm_up_s,
        "warm_up_compiled": warm_up_compiled,
        "speculative": args.speculative,
        "draft_model": args.draft_model if args.speculative == "draft_model" else None,
        "speculative_stats": {name: vars(s) for name, s in engine.stats().speculative.items()},
        "concurrencies": args.concurrency,
        "replay": args.replay,
        "eager_row_buckets": args.eager_row_buckets,
        "prefill_graph_seqs": args.prefill_graph_seqs,
        "first_use_steps": first_use,
        "profile_first_use": profile_extra,  # {table: [[name, pass 0 ms, pass 1 ms], ...]}
        "profile_top": profile_top,  # {table: [[name, ms], ...]} of the last profiled pass
        "first_use_extra_ms": first_use_ms,
        "passes": passes,
    }
    table = "\n".join(lines)
    write_results(args.out, "compile_stability_gpu", doc, table, args.name or hardware(args.device))
    print(table)


if __name__ == "__main__":
    main()
