"""The fused split merge of paged decode attention ("last program merges").

With several splits, the last stage-1 program of each (sequence, KV head) merges the
partials and zeroes its arrival counter. Checked here: against the float64 reference
(GQA, scattered block tables, split counts that leave empty splits, padded rows of
length 0, which must come out as zeros); against the two-kernel merge, which runs the
same merge code (bit-identical on an H200 and under the interpreter; asserted to float32
4 ulp, bfloat16 1 ulp of the output, in case a compiler schedules the two differently);
and that the counters are all zero after each call, so a second call (a graph replay)
is right too.

Reference tolerances as in test_attention.py: float32 1e-5 / 1e-4, bfloat16 1e-2 / 3e-2.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from jacana_engine.kernels import decode_attention
from jacana_engine.kernels._arrivals import arrival_counters, held_counters
from jacana_engine.kernels.decode_attention import choose_num_splits, paged_decode_attention
from jacana_engine.kernels.reference import paged_attention_reference

TOL = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (1e-2, 3e-2)}
MERGE_ULPS = {torch.float32: 4, torch.bfloat16: 1}


class DecodeCase:
    """A decode batch: real sequences from ``paged_batch``, then ``padding`` rows of
    length 0 (table rows of block 0). ``reference()`` is float64, zeros on padding."""

    def __init__(self, paged_batch, seq_lens, *, padding, n_heads, n_kv, head_dim, dtype, device):
        self.batch = paged_batch(
            [1] * len(seq_lens),
            seq_lens,
            block_size=16,
            n_kv=n_kv,
            head_dim=head_dim,
            dtype=dtype,
            device=device,
        )
        self.real = len(seq_lens)
        rows = self.real + padding
        self.kv_cache = self.batch.kv_cache
        self.block_tables = torch.zeros(
            rows, self.batch.block_tables.shape[1], dtype=torch.int32, device=device
        )
        self.block_tables[: self.real] = self.batch.block_tables  # [rows, max_blocks]
        self.seq_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.seq_lens[: self.real] = self.batch.seq_lens_t  # [rows]
        self.q = torch.randn(rows, n_heads, head_dim, device=device).to(dtype)
        self.scale = head_dim**-0.5
        self.max_seq_len = max(seq_lens)

    def run(self, num_splits, *, fused_merge=True) -> torch.Tensor:
        out = torch.full_like(self.q, float("nan"))  # an unwritten row fails
        paged_decode_attention(
            self.q,
            self.kv_cache,
            self.seq_lens,
            self.block_tables,
            self.scale,
            num_splits=num_splits,
            max_seq_len=self.max_seq_len,
            out=out,
            fused_merge=fused_merge,
        )
        return out

    def reference(self) -> torch.Tensor:  # [rows, n_heads, head_dim] float64
        ref = torch.zeros(self.q.shape, dtype=torch.float64, device=self.q.device)
        ref[: self.real] = paged_attention_reference(
            self.q[: self.real],
            self.kv_cache,
            self.batch.query_start_loc,
            self.batch.seq_lens_t,
            self.batch.block_tables,
            self.scale,
        )
        return ref


def _counters_zero(device) -> bool:
    return not arrival_counters(decode_attention.COUNTERS, device, 0).any()


def _dtypes(device) -> list[torch.dtype]:
    return [torch.float32, torch.bfloat16] if device.type == "cuda" else [torch.float32]


@pytest.mark.parametrize("n_heads,n_kv,head_dim", [(8, 2, 64), (6, 3, 48)])  # GQA 4; 2 + odd D
@pytest.mark.parametrize("num_splits", [2, 5, 16])
def test_fused_merge_matches_reference_and_two_kernel_merge(
    device, seed, checks, paged_batch, n_heads, n_kv, head_dim, num_splits
):
    # 65 tokens = 2 tiles of 64: with 5 or 16 splits most splits are empty
    seq_lens = [1, 65, random.randint(100, 300)]
    for dtype in _dtypes(device):
        case = DecodeCase(
            paged_batch,
            seq_lens,
            padding=2,
            n_heads=n_heads,
            n_kv=n_kv,
            head_dim=head_dim,
            dtype=dtype,
            device=device,
        )
        what = f"{dtype} splits={num_splits} lens={seq_lens} + 2 empty"
        fused = case.run(num_splits)
        assert _counters_zero(device), f"{what} seed={seed}: counters not reset"
        rel_l2, max_rel = TOL[dtype]
        checks.close(fused, case.reference(), rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=what)
        assert (fused[case.real :] == 0).all(), f"{what} seed={seed}: padding rows not zero"
        two_kernel = case.run(num_splits, fused_merge=False)
        checks.ulps(fused, two_kernel, ulps=MERGE_ULPS[dtype], seed=seed, what=what)


@pytest.mark.parametrize("block_n,num_warps", [(16, 2), (32, 8)])
def test_other_tiles_and_warps_match_reference(
    device, seed, checks, paged_batch, monkeypatch, block_n, num_warps
):
    # the module constants are tuning knobs, not part of the arithmetic: tiles that split
    # a KV block's worth of tokens finer, and other warp counts give the same results
    monkeypatch.setattr(decode_attention, "_BLOCK_N", block_n)
    monkeypatch.setattr(decode_attention, "_NUM_WARPS", num_warps)
    seq_lens = [1, block_n + 1, random.randint(60, 130)]
    for num_splits in (1, 3):
        case = DecodeCase(
            paged_batch, seq_lens, padding=1, n_heads=8, n_kv=2, head_dim=64,
            dtype=torch.float32, device=device,
        )  # fmt: skip
        what = f"tiles {block_n} warps {num_warps} splits {num_splits} lens {seq_lens}"
        out = case.run(num_splits)
        checks.close(out, case.reference(), rel_l2=1e-5, max_rel=1e-4, seed=seed, what=what)
        assert (out[case.real :] == 0).all(), what


@pytest.mark.parametrize("num_splits", [1, 4])
def test_empty_sequences_give_zeros(device, seed, paged_batch, num_splits):
    """Rows of length 0 only (every split of every program empty), fused and not."""
    case = DecodeCase(
        paged_batch,
        [1],
        padding=3,
        n_heads=4,
        n_kv=1,
        head_dim=32,
        dtype=torch.float32,
        device=device,
    )
    case.seq_lens.zero_()
    for fused_merge in (True, False):
        out = case.run(num_splits, fused_merge=fused_merge)
        assert (out == 0).all(), f"seed={seed} splits={num_splits} fused={fused_merge}"
    assert _counters_zero(device), f"seed={seed}: counters not reset"


def test_second_call_reuses_zeroed_counters(device, seed, checks, paged_batch):
    """Two calls over the same counters (as graph replays are): new queries and lengths."""
    case = DecodeCase(
        paged_batch,
        [200, 130],
        padding=1,
        n_heads=4,
        n_kv=2,
        head_dim=32,
        dtype=torch.float32,
        device=device,
    )
    rel_l2, max_rel = TOL[torch.float32]
    for call in range(2):
        if call:
            case.q.normal_()
            case.seq_lens[:2] = torch.tensor([random.randint(1, 200), 130])
            case.batch.seq_lens_t.copy_(case.seq_lens[:2])
        out = case.run(3)
        assert _counters_zero(device), f"call {call} seed={seed}: counters not reset"
        checks.close(
            out, case.reference(), rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=f"call {call}"
        )


def test_counters_grow_and_keep_old_buffers():
    """A larger batch gets a larger buffer; the smaller one stays alive (graphs captured
    at smaller sizes still address it). Host-side only: a device no kernel here uses."""
    device, family = torch.device("meta"), decode_attention.COUNTERS
    small = arrival_counters(family, device, 1)
    assert arrival_counters(family, device, small.numel()) is small
    large = arrival_counters(family, device, small.numel() + 1)
    assert large.numel() > small.numel()
    held = held_counters(family, device)
    assert held[-2] is small and held[-1] is large
    assert arrival_counters(family, device, 1) is large
    assert arrival_counters("another kernel", device, 1) is not large


QWEN3_8B = dict(n_heads=32, n_kv=8, head_dim=128)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 64])
def test_fused_merge_gpu_graph_replays(gpu, device, seed, checks, paged_batch, batch):
    """Qwen3-8B shapes in bf16: eager against the reference and the two-kernel merge,
    then a captured graph replayed twice with new queries, lengths and cache contents."""
    max_len = 4096
    seq_lens = [max_len] + [random.randint(1, max_len) for _ in range(batch - 1)]
    padding = 3 if batch > 1 else 0
    case = DecodeCase(
        paged_batch,
        seq_lens,
        padding=padding,
        dtype=torch.bfloat16,
        device=device,
        **QWEN3_8B,
    )
    rows = batch + padding
    splits = choose_num_splits(rows, QWEN3_8B["n_kv"], max_len, device)
    rel_l2, max_rel = TOL[torch.bfloat16]
    what = f"batch={batch} splits={splits}"
    fused = case.run(splits)  # also the warm-up before the capture
    checks.close(fused, case.reference(), rel_l2=rel_l2, max_rel=max_rel, seed=seed, what=what)
    two_kernel = case.run(splits, fused_merge=False)
    checks.ulps(fused, two_kernel, ulps=MERGE_ULPS[torch.bfloat16], seed=seed, what=what)

    out = torch.empty_like(case.q)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode_attention(
            case.q,
            case.kv_cache,
            case.seq_lens,
            case.block_tables,
            case.scale,
            num_splits=splits,
            out=out,
        )
    for replay in range(2):
        case.q.normal_()
        case.kv_cache.normal_()
        new_lens = torch.randint(1, max_len + 1, (batch,), dtype=torch.int32, device=device)
        case.seq_lens[:batch] = new_lens
        case.batch.seq_lens_t.copy_(new_lens)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _counters_zero(device), f"{what} replay {replay} seed={seed}: counters set"
        checks.close(
            out,
            case.reference(),
            rel_l2=rel_l2,
            max_rel=max_rel,
            seed=seed,
            what=f"{what} replay {replay}",
        )
        assert (out[batch:] == 0).all(), f"{what} replay {replay} seed={seed}: padding"
