"""What the skinny GEMM kernels compile to for sm90, on this machine
(``hopper_codegen``): weight loads past L1, the activating launch's SiLU, lookahead."""

from __future__ import annotations


def test_weights_load_past_l1_and_an_activating_launch_runs_silu_for_hopper():
    """Compiled for sm90 at the 8B gate_up's 2x4096 folded tile: by default the weight
    loads are ``ld.global.cg`` (cached in L2 only, ``skinny_gemm/jit.py``), on both
    kernels; only the activating launch computes an exponential (its SiLU in the
    epilogue)."""
    from hopper_codegen import hopper_ptx_counts

    counts = hopper_ptx_counts()
    act, plain = counts["skinny_folded_act"], counts["skinny_folded"]
    assert act["ld.global.cg"] >= 1 and plain["ld.global.cg"] >= 1, counts
    assert act["ex2.approx"] >= 1 and plain["ex2.approx"] == 0, counts


def test_lookahead_asks_for_the_next_tile_right_after_the_wait_for_hopper():
    """``SkinnyConfig.lookahead`` compiled for sm90 (the 8B qkv's 2x2048, PDL): the same
    loads before the wait (the prefetched tile), and after it the loop's first weight
    tile beside x, before the first branch; without it only x's tile is asked for there."""
    from hopper_codegen import hopper_ptx_counts

    counts = hopper_ptx_counts()
    plain, ahead = counts["skinny_2x2048"], counts["skinny_2x2048_ahead"]
    assert plain["loads_before_wait"] == ahead["loads_before_wait"] > 0, counts
    assert ahead["loads_after_wait"] == plain["loads_after_wait"] + plain["loads_before_wait"]
