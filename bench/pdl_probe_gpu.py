"""How much a batch-1 decode step could gain from programmatic dependent launch (PDL).

Inside a decode graph most kernels are short: a one-row GEMV of a 4096-wide layer reads
its 33 MB weight in ~11 us on an H200, ~3 us more than the bandwidth allows, and the
small kernels between the GEMVs (norms, RoPE, attention) leave HBM idle. With PDL
(Hopper and later) a kernel launched with the programmatic-serialization attribute may
start while its predecessor finishes; it must execute ``griddepcontrol.wait`` before it
reads anything the predecessor writes. A GEMV's weights are never written, so it can
fetch its first weight tile before waiting, overlapping the predecessor's tail.

This probe times that, with its own two kernels, before the engine's kernels take it on:
a graph of ``--layers`` pairs [small kernel (an RMSNorm of one 4096-wide row) -> one-row
GEMV of ``--k`` -> ``--n``], every GEMV with its own weight (streamed from HBM), in four
variants:

- ``plain``: ordinary launches;
- ``pdl``: the GEMV launched with PDL (waits at its start), the small kernel triggering
  its dependents at its own start;
- ``pdl+prefetch``: as ``pdl``, the GEMV loading its first weight tile before waiting;
- ``pdl+prefetch+l2``: as ``pdl+prefetch``, and before waiting every GEMV program also
  asks L2 to prefetch the next ``--l2-bytes`` of each of its weight rows, with the skinny
  GEMM's own helper (``skinny_gemm.prefetch_rows_to_l2``: ``cp.async.bulk.prefetch.L2``,
  no registers held): HBM then streams the GEMV's weights while the small kernel runs,
  instead of one tile per program;
- ``gemv only``: the GEMVs alone, back to back (the floor the small kernels add to);
- ``gemv only, pdl+prefetch``: the same chain, each GEMV triggering the next at its start
  and the next prefetching its first tile (GEMV after GEMV, as with norms folded in);
- ``gemv only, pdl+prefetch, flags``: as the one before, but a GEMV does not wait for its
  predecessor's grid to complete (``griddepcontrol.wait``): its programs spin on an
  arrival counter that each of the predecessor's programs bumps, with release order,
  once its outputs are stored. This times how long the hardware's grid-completion
  signal takes against an L2 counter's, at every one of a step's ~250 kernel boundaries.
  No deadlock: a GEMV launches only once every program of the one before has started
  (each triggers at its start), so those it spins on are resident.

Each variant: one CUDA graph, replayed ``--replays`` times between CUDA events per rep;
medians of ``--reps`` reps with min-max, in microseconds per pair. Every variant's last
output is checked against torch.

Usage: python bench/pdl_probe_gpu.py [--out bench/results] [--k 4096 --n 4096] [--name N]
Writes ``N.json`` and ``N.md`` (``pdl_probe_gpu`` by default). Needs a CUDA GPU of
compute capability 9.0 or later and a Triton with ``launch_pdl`` (3.4 or later).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import triton
import triton.language as tl
from common import RESULTS_DIR, environment, fmt_spread, spread, write_results

from jacana_engine.kernels.skinny_gemm import L2_MAX_PIECES, prefetch_rows_to_l2
from jacana_engine.tuning.gpu_timing import replay_seconds

VARIANTS = (
    "plain",
    "pdl",
    "pdl+prefetch",
    "pdl+prefetch+l2",
    "gemv only",
    "gemv only, pdl+prefetch",
    "gemv only, pdl+prefetch, flags",
)


@triton.jit
def _rms_row_kernel(x_ptr, w_ptr, out_ptr, H, BLOCK: tl.constexpr, TRIGGER: tl.constexpr):
    # x [1, H] -> out [1, H]: one program, as a decode step's norm at batch 1
    if TRIGGER:  # let the next kernel launch now; it waits for our completion itself
        tl.extra.cuda.gdc_launch_dependents()
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / H + 1e-6)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    N,
    K,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    WAIT: tl.constexpr,  # launched with PDL: wait for the predecessor before reading x
    PREFETCH: tl.constexpr,  # load the first weight tile before that wait
    TRIGGER: tl.constexpr,  # let the next kernel launch at this one's start
    L2_BYTES: tl.constexpr = 0,  # with PREFETCH: bytes per row after the first tile to L2
    L2_PIECES: tl.constexpr = L2_MAX_PIECES,  # in this many bulk prefetches a row
    wait_ptr=None,  # FLAGS: the predecessor's arrival counter (int32)
    done_ptr=None,  # FLAGS: this GEMV's arrival counter, bumped once per program
    wait_for=0,  # FLAGS: the predecessor's program count (0: no predecessor)
    FLAGS: tl.constexpr = False,  # wait on wait_ptr instead of griddepcontrol.wait
):
    # x [1, K] @ w[N, K].T -> out [1, N]; each program owns BLOCK_N outputs
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    n_mask = cols < N
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * K
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    start = 0
    if PREFETCH:
        w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & (ks < K)[None, :], other=0.0)
        if L2_BYTES > 0:  # the skinny GEMM's prefetch: each row's next bytes after a tile
            prefetch_rows_to_l2(w_ptr, cols, N, K, BLOCK_K, L2_BYTES, L2_PIECES)
        if FLAGS:
            _wait_for_arrivals(wait_ptr, wait_for)
        else:
            tl.extra.cuda.gdc_wait()
        x = tl.load(x_ptr + ks, mask=ks < K, other=0.0)
        acc += x.to(tl.float32)[None, :] * w.to(tl.float32)
        start = BLOCK_K
    elif WAIT:
        tl.extra.cuda.gdc_wait()
    for k0 in range(start, K, BLOCK_K):
        k = k0 + ks
        x = tl.load(x_ptr + k, mask=k < K, other=0.0)
        w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & (k < K)[None, :], other=0.0)
        acc += x.to(tl.float32)[None, :] * w.to(tl.float32)
    tl.store(out_ptr + cols, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=n_mask)
    if FLAGS:  # every thread's stores before the (one-thread) release
        tl.debug_barrier()
        tl.atomic_add(done_ptr, 1, sem="release")


@triton.jit
def _wait_for_arrivals(counter_ptr, expected):
    """Spin until the int32 at ``counter_ptr`` reaches ``expected`` (acquire order, so the
    arrivals' stores are visible after it)."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    while seen < expected:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire")


class Probe:
    """The tensors of one run: ``layers`` weights [N, K] bf16, a norm weight, buffers."""

    def __init__(
        self, layers: int, n: int, k: int, block_n: int, block_k: int, l2_bytes: int = 0
    ) -> None:
        dev = torch.device("cuda")
        self.n, self.k, self.block_n, self.block_k = n, k, block_n, block_k
        self.l2_bytes = l2_bytes
        self.weights = [
            (torch.randn(n, k, device=dev) * k**-0.5).to(torch.bfloat16) for _ in range(layers)
        ]
        self.norm_w = torch.ones(k, device=dev, dtype=torch.bfloat16)
        self.x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        self.normed = torch.empty_like(self.x)
        self.out = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
        self.arrivals = torch.zeros(layers, dtype=torch.int32, device=dev)  # one per GEMV

    def step(self, variant: str) -> None:
        pdl = "pdl" in variant
        gemv_only = variant.startswith("gemv only")
        flags = variant.endswith("flags")
        programs = triton.cdiv(self.n, self.block_n)
        if flags:  # a plain memset before the chain: the counters start each step at 0
            self.arrivals.zero_()
        for i, w in enumerate(self.weights):
            if not gemv_only:
                _rms_row_kernel[(1,)](
                    self.x, self.norm_w, self.normed, self.k,
                    BLOCK=triton.next_power_of_2(self.k), TRIGGER=pdl, num_warps=8,
                )  # fmt: skip
            _gemv_kernel[(triton.cdiv(self.n, self.block_n),)](
                self.normed, w, self.out, self.n, self.k,
                BLOCK_N=self.block_n, BLOCK_K=self.block_k,
                WAIT=pdl, PREFETCH="pdl+prefetch" in variant, TRIGGER=pdl and gemv_only,
                L2_BYTES=self.l2_bytes if variant.endswith("+l2") else 0,
                wait_ptr=self.arrivals[max(i - 1, 0)], done_ptr=self.arrivals[i],
                wait_for=programs if i > 0 else 0, FLAGS=flags,
                num_warps=4, num_stages=3, launch_pdl=pdl,
            )  # fmt: skip

    def check(self, variant: str) -> float:
        """max |out - torch| / max |torch| of the last GEMV after one eager step."""
        self.step(variant)
        torch.cuda.synchronize()
        ref = self.normed.float() @ self.weights[-1].float().T  # the GEMV's input as it ran
        return float((self.out.float() - ref).abs().max() / ref.abs().max())


def time_variant(probe: Probe, variant: str, replays: int) -> float:
    """Microseconds per (small kernel, GEMV) pair, one rep."""
    probe.step(variant)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        probe.step(variant)
    graph.replay()
    return replay_seconds(graph, replays) * 1e6 / len(probe.weights)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--block-n", type=int, default=8)
    parser.add_argument("--block-k", type=int, default=1024)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument(
        "--l2-bytes", type=int, default=2048,
        help="pdl+prefetch+l2: bytes of each weight row prefetched to L2 (a multiple of 256)",
    )  # fmt: skip
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--name", default="pdl_probe_gpu", help="result file name")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        raise SystemExit("needs a CUDA GPU of compute capability 9.0 or later (PDL)")
    if args.l2_bytes % (16 * L2_MAX_PIECES) or args.l2_bytes > 2 * (args.k - args.block_k):
        raise SystemExit("--l2-bytes: a multiple of 256 within a row past its first tile")
    probe = Probe(args.layers, args.n, args.k, args.block_n, args.block_k, args.l2_bytes)
    errors = {v: probe.check(v) for v in VARIANTS}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.reps):  # variants interleaved within each rep
        for v in VARIANTS:
            times[v].append(time_variant(probe, v, args.replays))
    gemv_bytes = args.n * args.k * 2
    rows = {
        v: {
            "us_per_pair": spread(t),
            "gemv_tb_s_if_alone": gemv_bytes / statistics.median(t) / 1e6,
            "max_rel_err": errors[v],
        }
        for v, t in times.items()
    }
    doc = {
        "benchmark": "pdl_probe_gpu",
        "environment": environment(),
        "device": torch.cuda.get_device_name(),
        "settings": vars(args) | {"out": str(args.out)},
        "variants": rows,
    }
    lines = [
        "# Programmatic dependent launch: a norm kernel then a one-row GEMV, per pair",
        "",
        f"{args.layers} pairs per CUDA graph, GEMV {args.k} -> {args.n} bf16 (BLOCK_N "
        f"{args.block_n}, BLOCK_K {args.block_k}), each with its own weight; median "
        f"(min–max) of {args.reps} reps of {args.replays} replays. {doc['device']}.",
        "",
        "| variant | us per pair (gemv only: per GEMV) | GEMV TB/s if alone | max rel err |",
        "|---|---|---|---|",
    ]
    for v, r in rows.items():
        lines.append(
            f"| {v} | {fmt_spread(r['us_per_pair'])} | {r['gemv_tb_s_if_alone']:.2f} | "
            f"{r['max_rel_err']:.1e} |"
        )
    table = "\n".join(lines)
    write_results(args.out, args.name, doc, table)
    print(table)


if __name__ == "__main__":
    main()
