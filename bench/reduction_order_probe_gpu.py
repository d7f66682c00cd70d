"""In which order does torch's CUDA ``mean`` over the last dimension add a row?

transformers' RMSNorm takes ``x.float().pow(2).mean(-1)``; our norm kernels sum the squares
in Triton's own order, so the float32 mean, and through ``rsqrt`` now and then a bf16
output, can differ from transformers' by an ulp (``hf_trace_parity_gpu.py`` found such a
norm among the origins on SmolLM2). Each candidate below rebuilds the sum with elementwise
float32 additions (each exact IEEE, so the order is all that differs) in one shape of
torch's reduction kernel (``aten/src/ATen/native/cuda/Reduce.cuh``): W threads per row,
each adding its own elements in one of two patterns, then halving: lane t takes lane
t + W/2's sum, then t + W/4's, down to one; the mean as the sum times 1/N or over N.
The report counts, per (rows, N), the rows whose mean has torch's bits under each candidate,
and checks Triton's ``rsqrt`` against torch's on the means.

    python bench/reduction_order_probe_gpu.py [--out DIR] [--sites hf_trace_sites_MODEL.pt]

With ``--sites``, the norm origins traced there are replayed: transformers' norm
recomputed, and again with the best candidate's mean. With ``--reveal 576x1,576x4,...``
the order itself is read off torch's ``mean`` on rows of N values launched R at a time
(``reveal_meeting_sizes``), written to ``reduction_trees.npz`` for ``tree_from_sizes``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path

import torch
import triton
import triton.language as tl

from jacana_engine.kernels.reference import halving_sum, thread_partials, transformers_rms_norm


def emulated_mean(sq: torch.Tensor, width: int, vec: int, pattern: str, mul: bool):
    total = halving_sum(thread_partials(sq, width, vec, pattern))
    n = sq.shape[1]
    return total * torch.tensor(1.0 / n, dtype=torch.float32) if mul else total / n


@triton.jit
def _rsqrt_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.rsqrt(tl.load(x_ptr + i, mask=i < n, other=1.0)), mask=i < n)


def triton_rsqrt(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _rsqrt_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out


CANDIDATES = [
    (w, v, pat, mul)
    for w, v, pat, mul in itertools.product(
        (32, 64, 128, 256, 512), (1, 2, 4, 8), ("vector", "strided"), (True, False)
    )
]


def reveal_meeting_sizes(
    n: int, rows: int, device: str = "cuda", mean=lambda t: t.mean(-1)
) -> torch.Tensor:
    """[n, n] int32: for each pair of positions (i, j), how many of the n addends lie
    under the addition where i's and j's partial sums first meet, in torch's ``mean``
    over rows of n float32 values launched ``rows`` at a time. Each probe row holds +M at
    i, -M at j and 1 elsewhere, M so large that any partial sum with M in it stays M: the
    ones added into i's or j's partial sums before they meet vanish, the rest add exactly,
    so the row's sum is n minus the size of that meeting addition's subtree (the tree of
    additions, binary, is then fixed by these sizes: ``tree_from_sizes``). ``mean`` maps
    [rows, n] float32 to the rows' means: torch's by default."""
    big = 2.0**40
    pairs = torch.triu_indices(n, n, offset=1, device=device)  # [2, P]
    sizes = torch.zeros(n, n, dtype=torch.int32, device=device)
    count = pairs.shape[1]
    for start in range(0, count, rows):
        chunk = pairs[:, start : start + rows]
        probe = torch.ones(rows, n, device=device)
        live = chunk.shape[1]
        idx = torch.arange(live, device=device)
        probe[idx, chunk[0]] = big
        probe[idx, chunk[1]] = -big
        total = torch.round(mean(probe)[:live].double() * n).to(torch.int32)
        sizes[chunk[0], chunk[1]] = n - total
    return sizes + sizes.T


def tree_from_sizes(sizes) -> list:
    """The tree of additions (nested pairs of positions) whose meeting sizes are
    ``sizes`` ([n, n]; the diagonal ignored). Bottom-up: at each size, in increasing
    order, every group pairs with the one group it meets at that size (its sibling); a
    group is named by its first position, whose meeting sizes are the whole group's."""
    import numpy as np

    sizes = np.asarray(sizes)
    n = sizes.shape[0]
    subtree: dict[int, object] = {i: i for i in range(n)}  # group's first position -> tree
    for size in sorted(set(sizes[np.triu_indices(n, 1)].tolist())):
        firsts = sorted(subtree)
        sibling: dict[int, int] = {}
        for k, a in enumerate(firsts):
            if a in sibling:
                continue
            b = next((b for b in firsts[k + 1 :] if b not in sibling and sizes[a, b] == size), None)
            if b is not None:
                sibling[a], sibling[b] = b, a
        for a, b in sibling.items():
            if a < b:
                subtree[a] = [subtree[a], subtree.pop(b)]
    [tree] = subtree.values()
    return tree


def sum_by_tree(tree, x: torch.Tensor) -> torch.Tensor:
    """x [R, n] float32 summed along the tree (nested lists of positions): [R]."""
    if isinstance(tree, int):
        return x[:, tree]
    parts = [sum_by_tree(sub, x) for sub in tree]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/results")))
    parser.add_argument("--sites", type=Path)
    parser.add_argument("--samples", type=int, default=2048, help="random rows per shape")
    parser.add_argument("--reveal", default="", help="NxR,...: read off the order of those")
    args = parser.parse_args()
    if args.reveal:
        import numpy as np

        found = {}
        for shape in args.reveal.split(","):
            n, rows = (int(v) for v in shape.split("x"))
            found[f"n{n}_rows{rows}"] = reveal_meeting_sizes(n, rows).cpu().numpy()
        args.out.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(args.out / "reduction_trees.npz", **found)
        print({k: int(v.max()) for k, v in found.items()})
        return
    torch.manual_seed(0)
    report: dict = {"shapes": {}}
    rsqrt_differ, rsqrt_of = 0, 0
    for n, rows in itertools.product((576, 1024, 2048, 4096), (1, 2, 3, 4, 5, 8, 16, 64)):
        batches = max(1, args.samples // rows)
        x = torch.randn(batches, rows, n, device="cuda").to(torch.bfloat16)
        x = x * torch.rand(batches, rows, 1, device="cuda").to(torch.bfloat16) * 8
        sq = x.float().pow(2)
        # torch's mean per batch, launched on [rows, n] as a model's norm is
        ref = torch.stack([sq[b].mean(-1) for b in range(batches)])  # [B, rows]
        flat = sq.view(-1, n)
        exact = {}
        for cand in CANDIDATES:
            got = emulated_mean(flat, *cand).view(batches, rows)
            exact[cand] = int((got == ref).sum())
        best = max(exact, key=exact.get)
        report["shapes"][f"{rows}x{n}"] = {
            "rows_checked": batches * rows,
            "best": "/".join(map(str, best)),
            "best_exact": exact[best],
            "divide_instead": exact.get((*best[:3], not best[3]), 0),
            "torch_sum_then_divide": int((flat.sum(-1) / n == ref.view(-1)).sum()),
        }
        var = ref.view(-1) + 1e-5
        rsqrt_differ += int((triton_rsqrt(var) != torch.rsqrt(var)).sum())
        rsqrt_of += var.numel()
    report["triton_rsqrt_vs_torch"] = {"differ": rsqrt_differ, "of": rsqrt_of}
    if args.sites:
        report["sites"] = replay_sites(args.sites, report["shapes"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reduction_order_probe.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


def replay_sites(path: Path, shapes: dict) -> dict:
    """Each traced norm origin: does transformers' norm recomputed here give the traced
    bits, and does the best candidate's mean for its shape give them too?"""
    found = {}
    for site in torch.load(path):
        s = site["site"]
        if s["tensor"] not in ("in_norm", "post_norm", "final_norm"):
            continue
        x, w = site["x"].cuda(), site["weight"].cuda()
        rows, n = x.shape
        theirs = site["theirs"].cuda()
        entry = {
            "recomputed_equals_traced": bool(
                torch.equal(transformers_rms_norm(x, w, site["eps"]), theirs)
            )
        }
        best = shapes.get(f"{rows}x{n}", {}).get("best")
        if best:
            w_, v_, pat, mul = best.split("/")
            mean = emulated_mean(x.float().pow(2), int(w_), int(v_), pat, mul == "True")
            entry["best_candidate"] = best
            entry["candidate_differ"] = int(
                (transformers_rms_norm(x, w, site["eps"], mean) != theirs).sum()
            )
        entry["ours_differ"] = int((site["ours"].cuda() != theirs).sum())
        found[f"p{site['prompt']}f{s['forward']}l{s['layer']}/{s['tensor']}"] = entry
    return found


if __name__ == "__main__":
    main()
