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

The engine's start-up warm-up (``jacana_engine/warm_up.py``) runs apart from the rest of
the start-up, so its own compiles and seconds are counted on their own; ``--no-warm-up``
skips it (what serving compiles without it). ``--speculative ngram`` or ``--speculative
draft_model --draft-model qwen3-0.6b`` (random weights of that config, on the engine's
device) serves with in-process speculation, drafting always (no dynamic k: random weights
accept little, and the gate would stop drafting), so the verification steps' and the
draft model's kernels are counted too. Each pass also names its longest step's tokens.

Usage: python bench/compile_stability_gpu.py --model qwen3-0.6b [--passes 3] [--no-warm-up]
       [--speculative ngram|draft_model [--draft-model NAME]] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    RESULTS_DIR,
    config_dir,
    dummy_engine_config,
    environment,
    triton_cache_kernels,
    write_results,
)

CONCURRENCIES = (1, 3, 17, 64)


def random_request(rng: random.Random, vocab: int, prefix: list[int]) -> tuple[list[int], Any]:
    from jacana_engine.sampling_params import SamplingParams

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


class StepTokens:
    """The prompt and generated tokens of the engine's latest forward pass: wraps its
    throughput meter's ``record`` (called once a forward) to keep the last pair."""

    def __init__(self, engine: Any) -> None:
        self.last = (0, 0)
        meter = engine._throughput
        record = meter.record

        def keep(prompt_tokens: int, generation_tokens: int) -> None:
            self.last = (prompt_tokens, generation_tokens)
            record(prompt_tokens, generation_tokens)

        meter.record = keep


def closed_loop(engine: Any, requests: list, concurrency: int, tag: str) -> dict[str, Any]:
    """Keep ``concurrency`` of ``requests`` in flight until all have run."""
    pending = list(requests)
    tokens = StepTokens(engine)
    stats: dict[str, Any] = {
        "steps": 0, "output_tokens": 0, "longest_step_s": 0.0, "longest_step_tokens": (0, 0)
    }  # fmt: skip

    def submit() -> None:
        prompt, sp = pending.pop()
        engine.add_request(f"{tag}-{len(pending)}", prompt, sp)

    for _ in range(min(concurrency, len(pending))):
        submit()
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        outs = engine.step()
        if (seconds := time.perf_counter() - t0) > stats["longest_step_s"]:
            stats["longest_step_s"], stats["longest_step_tokens"] = seconds, tokens.last
        stats["steps"] += 1
        for out in outs:
            stats["output_tokens"] += len(out.new_token_ids)
            if out.finished and pending:
                submit()
    return stats


def serve_pass(
    engine: Any, rng: random.Random, vocab: int, index: int, concurrencies: list[int]
) -> dict[str, Any]:
    """One pass: at each concurrency, a closed loop over 2 x concurrency requests."""
    prefix = [rng.randrange(vocab) for _ in range(rng.choice([16, 40, 256]))]
    runs = []
    start = time.perf_counter()
    for concurrency in concurrencies:
        requests = [random_request(rng, vocab, prefix) for _ in range(2 * concurrency)]
        runs.append(closed_loop(engine, requests, concurrency, f"p{index}c{concurrency}"))
    longest = max(runs, key=lambda r: r["longest_step_s"])
    return {
        "requests": 2 * sum(concurrencies),
        "output_tokens": sum(r["output_tokens"] for r in runs),
        "steps": sum(r["steps"] for r in runs),
        "wall_s": time.perf_counter() - start,
        "longest_step_ms": longest["longest_step_s"] * 1e3,
        # (prompt tokens computed, tokens generated) in that step (an overlapped step's
        # tokens are those of the step it read back)
        "longest_step_tokens": list(longest["longest_step_tokens"]),
    }


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
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default="compile_stability_gpu")
    parser.add_argument(
        "--no-warm-up", dest="warm_up", action="store_false", help="skip the engine's warm-up"
    )
    parser.add_argument("--speculative", choices=["none", "ngram", "draft_model"], default="none")
    parser.add_argument("--draft-model", default="qwen3-0.6b", help="for --speculative draft_model")
    args = parser.parse_args()

    # A cache of its own, set before Triton reads it: every compile is a new entry here.
    cache = Path(tempfile.mkdtemp(prefix="triton-cache-"))
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    from jacana_engine.engine import LLMEngine

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
    rng = random.Random(7)
    passes = []
    for index in range(args.passes):
        result = serve_pass(engine, rng, vocab, index, args.concurrency)
        now = triton_cache_kernels(cache)
        result["compiled"] = [now[k] for k in sorted(now.keys() - seen.keys())]
        seen = now
        passes.append(result)
        print(f"pass {index}: {json.dumps(result)}", flush=True)

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
        "sampling, penalties and logprobs on some.",
        "",
        "| pass | requests | output tokens | steps | wall s | longest step ms "
        "(prompt / generated tokens) | kernels compiled |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, p in enumerate(passes):
        names = ", ".join(sorted({c["kernel"] for c in p["compiled"]})) or "none"
        lines.append(
            f"| {i} | {p['requests']} | {p['output_tokens']} | {p['steps']} | "
            f"{p['wall_s']:.1f} | {p['longest_step_ms']:.0f} "
            f"({p['longest_step_tokens'][0]} / {p['longest_step_tokens'][1]}) | "
            f"{len(p['compiled'])}: {names} |"
        )
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
        "passes": passes,
    }
    table = "\n".join(lines)
    write_results(args.out, args.name, doc, table)
    print(table)


if __name__ == "__main__":
    main()
