"""Compiles Triton kernels for an H100/H200 (sm90) without a GPU
(``kernels/offline_compile.py``) and prints, as JSON, how many bfloat16 FMAs
(``fma.rn.bf16``) and chosen other instructions each one's PTX holds. Run as a script, outside
the CPU interpreter (``TRITON_INTERPRET`` unset): ``python hopper_ptx.py``.

Cases:
- ``folded_rotation`` / ``folded_rotation_qk_norm``: decode attention with the rope
  kernel's work folded in (``ROPE=True``), SmolLM2's heads, compiled with FMA contraction
  like every launch of it;
- ``cast_rounding``: the rotation written with casts for its roundings,
  ``(x1 * cos).to(bf16) - (x2 * sin).to(bf16)``, compiled with contraction. LLVM narrows
  each product to a bf16 multiply and fuses one into the subtraction;
- ``skinny_pdl``: the skinny GEMM's tile kernel at one row (8B o_proj's 8x1024, PDL,
  two tiles loaded before the wait);
- ``skinny_2x2048`` / ``skinny_2x2048_ahead``: the 8B qkv's 2x2048 with PDL, without and
  with ``lookahead``;
- ``skinny_folded_act`` / ``skinny_folded``: the activating and the folded one-row
  kernels at the 8B gate_up's 2x4096;
- ``argmax_pdl``: the greedy argmax over bf16 logits, launched dependently, with its
  token copies (``TokenCopies``).
- ``rope_qk_norm_pairs`` / ``rope_qk_norm_quads``: the rope kernel with the q/k norm in
  torch's order at head_dim 64 and 128 (``_row_sum_order.head_norm_order``), compiled as
  it launches (no contraction).

Beside the instruction counts, ``loads_before_wait`` and ``loads_after_wait`` count the
PTX global loads before ``griddepcontrol.wait`` and between it and the first branch
after it (what a program asks for before its first dependent round trip can return);
``barriers_before_rsqrt`` the ``bar.sync`` between the wait and the first ``rsqrt`` (a
norm's statistics passed between threads before 1/rms).
"""

from __future__ import annotations

import json

import triton
import triton.language as tl

from jacana_engine.kernels.offline_compile import compile_for, ptx_count, signature_for


@triton.jit
def _cast_rounding(x_ptr, cos_ptr, sin_ptr, out_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x1 = tl.load(x_ptr + i).to(tl.float32)
    x2 = tl.load(x_ptr + BLOCK + i).to(tl.float32)
    cos = tl.load(cos_ptr + i).to(tl.bfloat16).to(tl.float32)
    sin = tl.load(sin_ptr + i).to(tl.bfloat16).to(tl.float32)
    a = (x1 * cos).to(tl.bfloat16).to(tl.float32)
    b = (x2 * sin).to(tl.bfloat16).to(tl.float32)
    tl.store(out_ptr + i, (a - b).to(tl.bfloat16))


INSTRUCTIONS = (
    "fma.rn.bf16", "griddepcontrol.wait", "atom.",
    "ld.global.cg", "ex2.approx",
)  # fmt: skip


def _summary(kernel) -> dict:
    """The instruction counts and the loads around the PDL wait (module docstring)."""
    lines = kernel.asm["ptx"].splitlines()
    counts = {name: ptx_count(kernel, name) for name in INSTRUCTIONS}
    wait = next((i for i, line in enumerate(lines) if "griddepcontrol.wait" in line), None)
    loads = [i for i, line in enumerate(lines) if "ld.global" in line]
    if wait is not None:
        branch = next((i for i in range(wait, len(lines)) if " bra " in lines[i]), len(lines))
        counts["loads_before_wait"] = sum(i < wait for i in loads)
        counts["loads_after_wait"] = sum(wait < i < branch for i in loads)
        rsqrt = next((i for i in range(wait, len(lines)) if "rsqrt" in lines[i]), None)
        if rsqrt is not None:  # a norm's 1/rms: barriers on the way to it, after the wait
            counts["barriers_before_rsqrt"] = sum("bar.sync" in line for line in lines[wait:rsqrt])
    return counts


def _counts(
    fn, constexprs: dict, pointers: dict, floats: tuple = (), divisible=(), fusion: bool = True
) -> dict:
    signature = signature_for(fn, constexprs, pointers=pointers, floats=floats)
    kernel = compile_for(fn, signature, constexprs, divisible=divisible, enable_fp_fusion=fusion)
    return _summary(kernel)


def _rope_qk_norm(head_dim: int) -> dict:
    from jacana_engine.kernels import rope

    # Qwen3-8B's 32 q / 8 KV heads, K/V stored in the same launch
    constexprs = dict(
        HALF=head_dim // 2, HEAD_DIM=head_dim, BLOCK_HQ=32, BLOCK_HK=8,
        BLOCK_HALF=head_dim // 2, BLOCK_PASS=0, HAS_NORM=True,
        NORM_ORDER=rope.head_norm_order(head_dim, head_dim), STORE_KV=True, BLOCK_SIZE=16,
        BLOCK_D=head_dim, PDL=False,
    )  # fmt: skip
    pointers = {"positions_ptr": "*i64", "cos_sin_ptr": "*fp32", "slot_ptr": "*i64"}
    return _counts(rope._rope_kernel, constexprs, pointers, ("eps",), fusion=False)


def _folded_rotation(has_norm: bool) -> dict:
    from jacana_engine.kernels import decode_attention
    from jacana_engine.kernels.rope import qk_norm_order

    pointers = {
        "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "counters_ptr": "*i32",
        "part_acc_ptr": "*fp32", "part_max_ptr": "*fp32", "part_sum_ptr": "*fp32",
        "positions_ptr": "*i64", "cos_sin_ptr": "*fp32", "slot_ptr": "*i64",
    }  # fmt: skip
    # SmolLM2: 9 q heads over 3 KV heads of 64, block 16, four splits merged in the launch
    constexprs = dict(
        GROUP=3, BLOCK_G=16, BLOCK_N=decode_attention._BLOCK_N, BLOCK_D=64, BLOCK_SIZE=16,
        NUM_SPLITS=4, MIN_SPLIT_TILES=4, BLOCK_GQ=4, BLOCK_S=4, CHUNK_S=4, FUSED_MERGE=True,
        PRECISION="tf32", FRAGMENT_SUM=True, PDL=False, ROPE=True, HALF=32, HEAD_DIM=64,
        BLOCK_HALF=32, BLOCK_PASS=0, HAS_NORM=has_norm, EARLY_TILE=False,
        NORM_ORDER=qk_norm_order(64, 64) if has_norm else 0,
    )  # fmt: skip
    return _counts(
        decode_attention._decode_partial_kernel, constexprs, pointers, ("scale_log2", "rope_eps")
    )


def _skinny_config(cfg, **constexprs) -> dict:
    from jacana_engine.kernels.offline_compile import compile_skinny

    return _summary(compile_skinny(cfg, constexprs=constexprs))


def _argmax() -> dict:
    from jacana_engine.kernels import argmax

    pointers = {"x_ptr": "*bf16", "out_ptr": "*i64", "best_ptr": "*fp32",
                "index_ptr": "*i32", "counter_ptr": "*i32", "next_ptr": "*i64",
                "ring_ptr": "*i64", "slot_ptr": "*i64"}  # fmt: skip
    # 151936 / 2048 spans; with the token copies, as the decode graphs' head launches it
    constexprs = dict(NUM_SPANS=75, SPAN=argmax.SPAN, MERGE=128, PDL=True, COPIES=True)
    return _counts(argmax._argmax_kernel, constexprs, pointers)


def main() -> None:
    from jacana_engine.kernels.skinny_gemm import SkinnyConfig

    counts = {
        "folded_rotation": _folded_rotation(False),
        "folded_rotation_qk_norm": _folded_rotation(True),
        "cast_rounding": _counts(_cast_rounding, {"BLOCK": 128}, {"cos_ptr": "*fp32",
                                                                  "sin_ptr": "*fp32"}),
        "skinny_pdl": _skinny_config(SkinnyConfig(1, 8, 1024, False, pdl=True, prefetch_tiles=2)),
        "skinny_2x2048": _skinny_config(SkinnyConfig(1, 2, 2048, False, pdl=True)),
        "skinny_2x2048_ahead": _skinny_config(
            SkinnyConfig(1, 2, 2048, False, pdl=True, lookahead=True)
        ),
        # the 8B gate_up's 2x4096 on the folded kernel, activating and not
        "skinny_folded_act": _skinny_config(
            SkinnyConfig(1, 2, 4096, False, pdl=True, k_fold=8, activates=True)
        ),
        "skinny_folded": _skinny_config(SkinnyConfig(1, 2, 4096, False, pdl=True, k_fold=8)),
        "argmax_pdl": _argmax(),
        "rope_qk_norm_pairs": _rope_qk_norm(64),
        "rope_qk_norm_quads": _rope_qk_norm(128),
    }  # fmt: skip
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
