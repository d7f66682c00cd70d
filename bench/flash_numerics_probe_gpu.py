"""Which formulation of a Triton attention tile gives the bits of torch's SDPA?

transformers runs SDPA, which on an H200 in bf16 is cuDNN's fused attention (torch's
first choice on Hopper; ``--reference flash`` compares with FlashAttention-2 instead).
Each variant is a small Triton kernel over one tile of keys at a time, given the same
bf16 q, k, v as SDPA is (transformers' call: causal for a prompt), and the report counts
output elements whose bits differ from SDPA's. A variant's name spells its choices
(``Variant``): warps (16 query rows each), keys a tile (``ncudnn``: 64 for one query,
128 for a prompt), how a score becomes exp2's argument (``EXP_FORMS``), the order of the
row sum (``SUM_ORDERS``: Triton's reduction, or a Hopper MMA fragment's per-thread left
folds and quad shuffles, per tile or kept across tiles), whether P.V accumulates inside
the dot, how the output is divided, the tiles' direction, and whether the compiler may
fuse multiplies and adds.

    python bench/flash_numerics_probe_gpu.py [--reference cudnn] [--variants PATTERNS]
        [--sites hf_trace_sites_MODEL.pt] [--out DIR]

Shapes: SmolLM2-135M (9 query heads, 3 KV heads, head_dim 64) and Qwen3-8B (32/8, 128);
decode (one query) at every context length 1..160 and prefill (causal prompt) at 2..160
tokens; or (``--sites``) the attention origins ``hf_trace_parity_gpu.py`` saved. Writes
``flash_numerics_probe_REFERENCE.json`` after every variant (a timeout keeps what ran);
the engine's own kernels are counted too (``engine``). Every variant compiles once per
shape, about 2 s on the GPU host: pick them with fnmatch patterns.
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import math
import os
import time
from pathlib import Path
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from jacana_engine.kernels._online_softmax import fragment_row_sums, quad_total
from jacana_engine.kernels._row_sum_order import four_columns

_LOG2E = 1.4426950408889634


@triton.jit
def _rcp_approx(x):
    return tl.inline_asm_elementwise(
        "rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def _quad_total(part, QUAD: tl.constexpr):
    """A quad's four partials [M, 4] to one sum [M]: QUAD 0 as a shuffle of xor 2 then
    xor 1, (a0 + a2) + (a1 + a3); QUAD 1 as xor 1 then xor 2, (a0 + a1) + (a2 + a3), the
    engine's (``quad_total``)."""
    a0, a1, a2, a3 = four_columns(part)
    return quad_total(part) if QUAD == 1 else (a0 + a2) + (a1 + a3)


@triton.jit
def _tile_attention_kernel(
    q_ptr,  # [P, BLOCK_M, D] bf16 (rows past the real ones are zeros)
    k_ptr,  # [P, S, D]
    v_ptr,  # [P, S, D]
    pos_ptr,  # [P, BLOCK_M] int32: each row's position (it sees keys <= position)
    o_ptr,  # [P, BLOCK_M, D] bf16
    S,
    scale,
    scale_log2,  # scale * log2(e), rounded once from double on the host
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    EXP: tl.constexpr,  # how a score becomes exp2's argument (EXP_FORMS)
    SUM: tl.constexpr,  # the order of the row sum l (SUM_ORDERS)
    DOT_ACC: tl.constexpr,  # 1: P.V accumulates into the rescaled acc inside the dot
    DIV: tl.constexpr,  # 0: acc / l; 1: acc * (1 / l); 2: acc * rcp.approx; 3: acc * div_rn(1, l)
    REVERSE: tl.constexpr,  # tiles last to first, as flash walks them
):
    p_id = tl.program_id(0)
    m = tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + p_id * BLOCK_M * D + m[:, None] * D + d[None, :])
    pos = tl.load(pos_ptr + p_id * BLOCK_M + m)
    log2e = 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # the running max, as EXP keeps it
    l_i = tl.zeros([BLOCK_M], tl.float32)
    part = tl.zeros([BLOCK_M, 4], tl.float32)  # per-thread partial sums (SUM 2, 3)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    n_tiles = tl.cdiv(S, BLOCK_N)
    for t in range(0, n_tiles):
        tile = n_tiles - 1 - t if REVERSE else t
        n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        kv_off = p_id * S * D + n[:, None] * D + d[None, :]
        k = tl.load(k_ptr + kv_off, mask=n[:, None] < S, other=0.0)
        v = tl.load(v_ptr + kv_off, mask=n[:, None] < S, other=0.0)
        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N] fp32, unscaled
        visible = (n[None, :] < S) & (n[None, :] <= pos[:, None])
        if EXP == 1:  # flash: the max of raw scores, exp2(fma(s, scale_log2, -max * scale_log2))
            s = tl.where(visible, s, float("-inf"))
        elif EXP == 2:  # scaled by the softmax scale, then exp(x - max) as exp2((x - max) * log2e)
            s = tl.where(visible, s * scale, float("-inf"))
        elif EXP == 3:  # scaled, then times log2e in its own rounding
            s = tl.where(visible, (s * scale) * log2e, float("-inf"))
        else:  # one multiply by scale * log2e
            s = tl.where(visible, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        if EXP == 1:
            alpha = tl.exp2((m_i - m_safe) * scale_log2)
            p = tl.exp2(tl.fma(s, scale_log2, -(m_safe * scale_log2)[:, None]))
        elif EXP == 2:
            alpha = tl.exp2((m_i - m_safe) * log2e)
            p = tl.exp2((s - m_safe[:, None]) * log2e)
        else:
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
        if SUM == 0:  # Triton's own reduction of the tile, then into the running sum
            l_i = l_i * alpha + tl.sum(p, axis=1)
        elif SUM == 1:  # the tile's sum in MMA fragment order, then into the running sum
            tile_part = fragment_row_sums(p, tl.zeros([BLOCK_M, 4], tl.float32))
            l_i = l_i * alpha + _quad_total(tile_part, 0)
        else:  # per-thread partials kept across tiles, the quad added once at the end
            part = fragment_row_sums(p, part * alpha[:, None])
        if DOT_ACC:
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    if SUM >= 2:
        l_i = _quad_total(part, SUM - 2)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    if DIV == 0:
        out = acc / l_safe[:, None]
    elif DIV == 1:
        out = acc * (1.0 / l_safe)[:, None]
    elif DIV == 2:
        out = acc * _rcp_approx(l_safe)[:, None]
    else:
        out = acc * tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), l_safe)[:, None]
    o_rows = o_ptr + p_id * BLOCK_M * D + m[:, None] * D
    tl.store(o_rows + d[None, :], out.to(o_ptr.dtype.element_ty))


EXP_FORMS = {
    0: "scores times scale * log2e, minus the max of those, exp2",
    1: "exp2(fma(raw score, scale * log2e, -raw max * scale * log2e)), as FlashAttention",
    2: "scores times scale; exp2((score - max) * log2e), as exp() through ex2",
    3: "scores times scale, then times log2e in a second rounding; minus the max, exp2",
}
SUM_ORDERS = {
    0: "Triton's reduction of each tile, added to the rescaled running sum",
    1: "each tile summed in MMA fragment order (thread left folds, quad xor 2 then 1)",
    2: "thread partials kept across tiles (rescaled, then the tile's values folded in), "
    "the quad added once at the end: xor 2 then 1",
    3: "as 2, the quad added xor 1 then 2",
}


REFERENCE_BACKENDS = ("flash", "cudnn")


def sdpa_reference(q, k, v, backend: str = "flash"):
    """transformers' call: q [1, H, T, D] (a transpose of [1, T, H, D]), k/v [1, Hkv, S, D],
    GQA in SDPA, causal for a prompt; the backend held (cuDNN on keys repeated per query
    head, which gave the same bits as transformers' own call on an H200)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = backend == "flash"
    if not gqa:
        group = q.shape[1] // k.shape[1]
        k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    chosen = SDPBackend.FLASH_ATTENTION if gqa else SDPBackend.CUDNN_ATTENTION
    with sdpa_kernel(chosen):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=q.shape[2] > 1, enable_gqa=gqa
        )


class Variant(NamedTuple):
    """One formulation of the tile kernel (see the kernel's constexprs)."""

    warps: int
    block_n: int  # keys a tile; 0: cuDNN's, 64 for one query and 128 for a prompt
    exp: int
    sum: int
    dot_acc: int
    div: int
    reverse: bool
    fusion: bool  # whether the compiler may fuse a multiply and an add (Triton's default)

    @property
    def name(self) -> str:
        return (
            f"warps{self.warps}/n{self.block_n or 'cudnn'}/exp{self.exp}/sum{self.sum}"
            f"/dot{self.dot_acc}/div{self.div}/{'rev' if self.reverse else 'fwd'}"
            + ("" if self.fusion else "/nofuse")
        )


def all_variants() -> list[Variant]:
    """The tile shapes and roundings the probe can run; ``--variants`` picks by pattern."""
    return [
        Variant(*c)
        for c in itertools.product(
            (1, 4),
            (0, 64, 128),
            EXP_FORMS,
            SUM_ORDERS,
            (0, 1),
            (0, 3),
            (False, True),
            (True, False),
        )
    ]


def probe_tiles(q, k, v, variant: Variant):
    """The probe kernel on transformers-layout inputs; returns [1, H, T, D]."""
    block_m = 16 * variant.warps
    block_n = variant.block_n or (64 if q.shape[2] == 1 else 128)
    _, h, t, dim = q.shape
    h_kv, s = k.shape[1], k.shape[2]
    group = h // h_kv
    if t == 1:  # decode: a program per KV head, its group's heads as rows
        rows = q[0, :, 0].reshape(h_kv, group, dim)
        keys, values = k[0], v[0]
        pos = torch.full((h_kv, group), s - 1, dtype=torch.int32, device=q.device)
    else:  # prefill: a program per (head, block of positions)
        blocks = math.ceil(t / block_m)
        rows = torch.zeros(h, blocks * block_m, dim, dtype=q.dtype, device=q.device)
        rows[:, :t] = q[0]
        rows = rows.view(h * blocks, block_m, dim)
        keys = k[0].repeat_interleave(group, 0).repeat_interleave(blocks, 0)
        values = v[0].repeat_interleave(group, 0).repeat_interleave(blocks, 0)
        pos = (s - t + torch.arange(blocks * block_m, device=q.device)).to(torch.int32)
        pos = pos.repeat(h, 1).view(h * blocks, block_m)
    n_prog, n_rows = rows.shape[0], rows.shape[1]
    qp = torch.zeros(n_prog, block_m, dim, dtype=q.dtype, device=q.device)
    qp[:, :n_rows] = rows
    pp = torch.full((n_prog, block_m), -1, dtype=torch.int32, device=q.device)
    pp[:, :n_rows] = pos
    out = torch.empty_like(qp)
    _tile_attention_kernel[(n_prog,)](
        qp, keys.contiguous(), values.contiguous(), pp, out, s, 1 / math.sqrt(dim),
        _LOG2E / math.sqrt(dim), BLOCK_M=block_m, BLOCK_N=block_n, D=dim,
        EXP=variant.exp, SUM=variant.sum, DOT_ACC=variant.dot_acc, DIV=variant.div,
        REVERSE=variant.reverse, num_warps=variant.warps,
        **({} if variant.fusion else {"enable_fp_fusion": False}),
    )  # fmt: skip
    if t == 1:
        return out[:, :group].reshape(1, h, 1, dim)
    return out.view(h, -1, dim)[:, :t].unsqueeze(0)


def engine_kernels(q, k, v):
    """The engine's decode or prefill kernel on the same inputs (one sequence, paged), the
    decode with the split count a batch-1 CUDA graph of the parity tests' engines (1,024
    tokens a sequence) launches it with, and the engine's default one-pass tiles
    (``EngineConfig.exact_decode_attention``)."""
    from jacana_engine.kernels.decode_attention import (
        choose_num_splits,
        cudnn_min_split_tiles,
        paged_decode_attention,
    )
    from jacana_engine.kernels.prefill_attention import paged_prefill_attention

    t, dim = q.shape[2], q.shape[3]
    h_kv, s = k.shape[1], k.shape[2]
    block = 16
    n_blocks = math.ceil(s / block)
    cache = torch.zeros(2, n_blocks, block, h_kv, dim, dtype=q.dtype, device=q.device)
    flat = cache.view(2, n_blocks * block, h_kv, dim)
    flat[0, :s] = k[0].transpose(0, 1)
    flat[1, :s] = v[0].transpose(0, 1)
    tables = torch.arange(n_blocks, dtype=torch.int32, device=q.device)[None]
    lens = torch.tensor([s], dtype=torch.int32, device=q.device)
    qs = q[0].transpose(0, 1).contiguous()  # [T, H, D]
    if t == 1:
        splits = choose_num_splits(1, h_kv, 1024, q.device)
        out = paged_decode_attention(
            qs, cache, lens, tables, 1 / math.sqrt(dim), num_splits=splits, max_seq_len=s,
            min_split_tiles=cudnn_min_split_tiles(dim),
        )  # fmt: skip
    else:
        qsl = torch.tensor([0, t], dtype=torch.int32, device=q.device)
        out = paged_prefill_attention(
            qs, cache, qsl, lens, tables, 1 / math.sqrt(dim), max_query_len=t
        )
    return out.transpose(0, 1).unsqueeze(0)


SHAPES = {"smollm2": (9, 3, 64), "qwen3-8b": (32, 8, 128)}


def sdpa_alternatives(q, k, v) -> dict[str, torch.Tensor]:
    """The ways transformers may reach SDPA for these inputs, each [1, H, T, D]: flash on
    keys and values laid out as its cache holds them (contiguous), and, with the keys
    repeated per query head (transformers' ``repeat_kv``, taken when it passes a mask), the
    efficient, math and cuDNN backends; a backend that refuses the call is left out."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]
    t, s = q.shape[2], k.shape[2]
    causal = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
    calls = {
        "flash_contiguous_kv": (SDPBackend.FLASH_ATTENTION, k.contiguous(), v.contiguous(), {}),
        "math_gqa": (SDPBackend.MATH, k, v, {}),
    }
    rk, rv = (x.repeat_interleave(group, dim=1) for x in (k, v))
    for name, backend in (
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("math", SDPBackend.MATH),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("flash", SDPBackend.FLASH_ATTENTION),
    ):
        calls[f"{name}_repeat_kv"] = (backend, rk, rv, {"gqa": False})
        calls[f"{name}_repeat_kv_mask"] = (backend, rk, rv, {"gqa": False, "mask": causal})
    found = {}
    for name, (backend, kk, vv, opts) in calls.items():
        mask = opts.get("mask")
        try:
            with sdpa_kernel(backend):
                found[name] = torch.nn.functional.scaled_dot_product_attention(
                    q, kk, vv, attn_mask=mask, is_causal=mask is None and t > 1,
                    enable_gqa=opts.get("gqa", True),
                )  # fmt: skip
        except RuntimeError:
            continue
    return found


def site_cases(path: Path, backend: str) -> tuple[list, dict]:
    """The attention origins that ``hf_trace_parity_gpu.py`` saved, as cases whose
    reference is SDPA recomputed here; with, per site, whether that recomputation and the
    engine's kernel reproduce what transformers and the engine gave in the traced run."""
    cases, checks = [], {}
    for i, site in enumerate(torch.load(path)):
        if site["site"]["tensor"] != "attn":
            continue
        q, k, v = (site[n].cuda() for n in ("q", "k", "v"))
        ref = sdpa_reference(q, k, v, backend)
        flat = ref[0].transpose(0, 1).reshape(site["theirs"].shape)  # [T, H * D]
        ours = engine_kernels(q, k, v)[0].transpose(0, 1).reshape(site["ours"].shape)
        name = f"p{site['prompt']}f{site['site']['forward']}l{site['site']['layer']}"
        checks[name] = {
            "sdpa_equals_traced": bool(torch.equal(flat.cpu(), site["theirs"])),
            "engine_equals_traced": bool(torch.equal(ours.cpu(), site["ours"])),
            "engine_vs_sdpa_differ": int((ours != flat).sum()),
            "traced_equals": [
                alt
                for alt, out in sdpa_alternatives(q, k, v).items()
                if torch.equal(out[0].transpose(0, 1).reshape(flat.shape).cpu(), site["theirs"])
            ],
            "keys": k.shape[2],
            "queries": q.shape[2],
        }
        kind = "decode" if q.shape[2] == 1 else "prefill"
        cases.append((f"site{i}", kind, k.shape[2], q, k, v, ref))
    return cases, checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/results")))
    parser.add_argument("--max-len", type=int, default=160)
    parser.add_argument(
        "--variants", default="", help="comma-separated names or fnmatch patterns (default: all)"
    )
    parser.add_argument("--reference", choices=REFERENCE_BACKENDS, default="flash")
    parser.add_argument(
        "--sites", type=Path, help="hf_trace_sites_MODEL.pt: replay its attention origins"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    cases = []  # (shape, kind, length, q, k, v, reference)
    report: dict[str, dict] = {}
    if args.sites:
        cases, report["sites"] = site_cases(args.sites, args.reference)
    for shape, (h, h_kv, dim) in SHAPES.items() if not args.sites else ():
        for kind, length in itertools.product(("decode", "prefill"), range(1, args.max_len + 1)):
            if kind == "prefill" and length == 1:
                continue
            t = 1 if kind == "decode" else length
            q = (torch.randn(1, t, h, dim, device="cuda") * 2).to(torch.bfloat16).transpose(1, 2)
            k = (torch.randn(1, h_kv, length, dim, device="cuda") * 2).to(torch.bfloat16)
            v = torch.randn(1, h_kv, length, dim, device="cuda").to(torch.bfloat16)
            try:
                ref = sdpa_reference(q, k, v, args.reference)
            except RuntimeError:  # a shape the backend refuses (cuDNN: some short ones)
                continue
            cases.append((shape, kind, length, q, k, v, ref))

    def count(fn) -> dict:
        """Per (shape, kind): differing elements, of how many, and the lengths with any."""
        tally: dict[str, dict] = {}
        for shape, kind, length, q, k, v, ref in cases:
            got = fn(q, k, v)
            bad = int((got.view(torch.int16) != ref.view(torch.int16)).sum())
            entry = tally.setdefault(f"{shape}/{kind}", {"differ": 0, "of": 0, "lengths": []})
            entry["differ"] += bad
            entry["of"] += ref.numel()
            if bad:
                entry["lengths"].append(length)
        for entry in tally.values():
            lengths = entry.pop("lengths")
            entry["lengths_with_differences"] = len(lengths)
            entry["first_lengths"] = lengths[:8]
        return tally

    wanted = set(filter(None, args.variants.split(",")))
    path = args.out / f"flash_numerics_probe_{args.reference}.json"
    args.out.mkdir(parents=True, exist_ok=True)
    if not wanted or "engine" in wanted:
        report["engine"] = count(engine_kernels)
        path.write_text(json.dumps(report, indent=1))
    for variant in all_variants():
        if wanted and not any(fnmatch.fnmatch(variant.name, w) for w in wanted):
            continue
        start = time.perf_counter()
        try:
            report[variant.name] = count(lambda q, k, v, c=variant: probe_tiles(q, k, v, c))
        except Exception as exc:  # a config Triton does not build here (registers)
            report[variant.name] = {"error": str(exc)[:200]}
        differ = sum(e["differ"] for e in report[variant.name].values() if isinstance(e, dict))
        print(f"# {variant.name}: {differ} differ ({time.perf_counter() - start:.1f} s)")
        path.write_text(json.dumps(report, indent=1))  # as it goes: a timeout keeps what ran
    print(json.dumps(report.pop("sites", None)))
    keys = sorted({k for r in report.values() for k in r if k != "error"})
    print("variant".ljust(52) + "".join(k.rjust(24) for k in keys))
    for name, r in report.items():
        cells = []
        for k in keys:
            e = r.get(k)
            cells.append(
                (f"{e['differ']}/{e['of']} ({e['lengths_with_differences']})" if e else "-").rjust(
                    24
                )
            )
        print(name.ljust(52) + "".join(cells) + (f"  {r['error']}" if "error" in r else ""))


if __name__ == "__main__":
    main()
