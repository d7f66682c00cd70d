"""Paged decode and prefill attention against the float64 reference; the row sum's order
(``FRAGMENT_SUM``, head_dim <= 64) against its emulation, bit for bit.

Tolerances (‖out − ref‖/‖ref‖, max|out − ref|/max|ref|): float32 inputs 1e-5 / 1e-4
(IEEE float32 dots); bfloat16 inputs 1e-2 / 3e-2 (bf16 operands and output rounding,
probabilities rounded to bf16 before the P·V product). Outputs are poisoned with NaN
before each call so that an unwritten row fails.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

import triton
import triton.language as tl

from jacana_engine.kernels._online_softmax import fragment_row_sums, initial_row_sum, row_sum
from jacana_engine.kernels.decode_attention import paged_decode_attention
from jacana_engine.kernels.kv_cache_write import kv_cache_write
from jacana_engine.kernels.prefill_attention import paged_prefill_attention
from jacana_engine.kernels.reference import mma_fragment_row_sum, paged_attention_reference

TOL = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (1e-2, 3e-2)}


def _dtypes(device) -> list[torch.dtype]:
    return [torch.float32, torch.bfloat16] if device.type == "cuda" else [torch.float32]


def _check_decode(
    device,
    seed,
    checks,
    paged_batch,
    *,
    seq_lens,
    n_heads,
    n_kv,
    head_dim,
    block_size,
    dtype,
    num_splits,
):
    batch = paged_batch(
        [1] * len(seq_lens),
        seq_lens,
        block_size=block_size,
        n_kv=n_kv,
        head_dim=head_dim,
        dtype=dtype,
        device=device,
    )
    q = torch.randn(len(seq_lens), n_heads, head_dim, device=device).to(dtype)
    k = torch.randn(len(seq_lens), n_kv, head_dim, device=device).to(dtype)
    v = torch.randn(len(seq_lens), n_kv, head_dim, device=device).to(dtype)
    kv_cache_write(k, v, batch.kv_cache, batch.slot_mapping)  # this step's token
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(
        q,
        batch.kv_cache,
        batch.seq_lens_t,
        batch.block_tables,
        scale,
        num_splits=num_splits,
        max_seq_len=max(seq_lens),
        out=out,
    )
    ref = paged_attention_reference(
        q, batch.kv_cache, batch.query_start_loc, batch.seq_lens_t, batch.block_tables, scale
    )
    rel_l2, max_rel = TOL[dtype]
    checks.close(
        out,
        ref,
        rel_l2=rel_l2,
        max_rel=max_rel,
        seed=seed,
        what=f"decode {dtype} splits={num_splits} lens={seq_lens}",
    )


def _decode_with_splits(
    device, paged_batch, seq_lens, head_dim, splits, min_split_tiles=1
) -> list[torch.Tensor]:
    """One batch of decode inputs (float32, 4 query heads over 2 KV heads) run once per
    split count in ``splits``."""
    batch = paged_batch(
        [1] * len(seq_lens), seq_lens, block_size=16, n_kv=2, head_dim=head_dim,
        dtype=torch.float32, device=device,
    )  # fmt: skip
    q = torch.randn(len(seq_lens), 4, head_dim, device=device)
    outs = []
    for num_splits in splits:
        out = torch.full_like(q, float("nan"))
        paged_decode_attention(
            q, batch.kv_cache, batch.seq_lens_t, batch.block_tables, head_dim**-0.5,
            num_splits=num_splits, max_seq_len=max(seq_lens), out=out,
            min_split_tiles=min_split_tiles,
        )  # fmt: skip
        outs.append(out)
    return outs


def test_min_split_tiles_runs_short_sequences_in_one_pass(device, seed, paged_batch):
    """With ``min_split_tiles=4`` a sequence of at most 4 tiles (256 keys) runs in one pass
    whatever the launch's split count (a CUDA graph's is fixed by the longest length), so
    it has the bits of one split, cuDNN's order; by default the splits part from the
    second tile on (their merge rounds otherwise), or the first check would prove
    nothing."""
    lens = [1, 64, 65, 200, 256]
    one, eight = _decode_with_splits(device, paged_batch, lens, 64, (1, 8), min_split_tiles=4)
    assert torch.equal(one, eight), f"seed={seed}"
    one, eight = _decode_with_splits(device, paged_batch, [130, 200, 256], 64, (1, 8))
    assert not torch.equal(one, eight), f"seed={seed}"


def _check_prefill(
    device,
    seed,
    checks,
    paged_batch,
    *,
    query_lens,
    seq_lens,
    n_heads,
    n_kv,
    head_dim,
    block_size,
    dtype,
    block_m=None,
):
    batch = paged_batch(
        query_lens,
        seq_lens,
        block_size=block_size,
        n_kv=n_kv,
        head_dim=head_dim,
        dtype=dtype,
        device=device,
    )
    tokens = batch.num_tokens
    q = torch.randn(tokens, n_heads, head_dim, device=device).to(dtype)
    k = torch.randn(tokens, n_kv, head_dim, device=device).to(dtype)
    v = torch.randn(tokens, n_kv, head_dim, device=device).to(dtype)
    kv_cache_write(k, v, batch.kv_cache, batch.slot_mapping)
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))
    paged_prefill_attention(
        q,
        batch.kv_cache,
        batch.query_start_loc,
        batch.seq_lens_t,
        batch.block_tables,
        scale,
        max_query_len=max(query_lens),
        out=out,
        block_m=block_m,
    )
    # float32 for the GPU sizes, whose float64 score matrices would not fit
    compute = torch.float64 if tokens < 4096 else torch.float32
    ref = paged_attention_reference(
        q,
        batch.kv_cache,
        batch.query_start_loc,
        batch.seq_lens_t,
        batch.block_tables,
        scale,
        compute_dtype=compute,
    )
    rel_l2, max_rel = TOL[dtype]
    checks.close(
        out,
        ref,
        rel_l2=rel_l2,
        max_rel=max_rel,
        seed=seed,
        what=f"prefill {dtype} q={query_lens} s={seq_lens}",
    )


@pytest.mark.parametrize(
    "n_heads,n_kv,head_dim,block_size",
    [(8, 2, 64, 16), (7, 7, 32, 8), (14, 2, 48, 16)],  # GQA 4, MHA, group 7 + odd head_dim
)
@pytest.mark.parametrize("num_splits", [1, 3, None])
def test_decode_small(
    device, seed, checks, paged_batch, n_heads, n_kv, head_dim, block_size, num_splits
):
    seq_lens = [1, 64, 65] + [random.randint(1, 300) for _ in range(2)]
    for dtype in _dtypes(device):
        _check_decode(
            device,
            seed,
            checks,
            paged_batch,
            seq_lens=seq_lens,
            n_heads=n_heads,
            n_kv=n_kv,
            head_dim=head_dim,
            block_size=block_size,
            dtype=dtype,
            num_splits=num_splits,
        )


@pytest.mark.parametrize(
    "n_heads,n_kv,head_dim,block_size",
    [(8, 2, 64, 16), (7, 1, 48, 8)],  # GQA 4; group 7 (rows not a power of 2) + odd head_dim
)
@pytest.mark.parametrize("block_m", [None, 128])  # None: these small grids take 64 rows
def test_prefill_small(
    device, seed, checks, paged_batch, n_heads, n_kv, head_dim, block_size, block_m
):
    # plain prefill, chunked prefill after a cached prefix, a decode row, a long chunk
    query_lens = [23, 17, 1, 70]
    contexts = [0, random.randint(1, 90), random.randint(0, 150), random.randint(0, 40)]
    seq_lens = [q + c for q, c in zip(query_lens, contexts, strict=True)]
    for dtype in _dtypes(device):
        _check_prefill(
            device,
            seed,
            checks,
            paged_batch,
            query_lens=query_lens,
            seq_lens=seq_lens,
            n_heads=n_heads,
            n_kv=n_kv,
            head_dim=head_dim,
            block_size=block_size,
            dtype=dtype,
            block_m=block_m,
        )


def test_prefill_block_m_follows_the_grid_size():
    """Qwen3-8B heads (group 4, 8 KV heads) on an H200's 132 SMs: one 1024-token prompt
    (256 programs at 128 rows) takes 64 rows a program, four 2048-token prompts (2,048)
    keep 128; a group wider than the small tile keeps a whole group a program."""
    from jacana_engine.kernels.prefill_attention import choose_block_m

    assert choose_block_m(1, 1024, 4, 8, 132) == 64
    assert choose_block_m(4, 2048, 4, 8, 132) == 128
    assert choose_block_m(1, 1024, 128, 1, 132) == 128
    with pytest.raises(ValueError, match="power of two"):
        paged_prefill_attention(
            torch.zeros(4, 8, 16),
            torch.zeros(2, 2, 16, 2, 16),
            torch.tensor([0, 4], dtype=torch.int32),
            torch.tensor([4], dtype=torch.int32),
            torch.zeros(1, 1, dtype=torch.int32),
            0.25,
            max_query_len=4,
            block_m=2,
        )


def test_prefill_leaves_uncovered_rows(device, seed, paged_batch):
    """Rows past the last sequence (padding tokens) keep what ``out`` held."""
    batch = paged_batch(
        [5, 3], [9, 3], block_size=8, n_kv=1, head_dim=32, dtype=torch.float32, device=device
    )
    q = torch.randn(batch.num_tokens + 4, 2, 32, device=device)
    out = torch.full_like(q, 7.0)
    paged_prefill_attention(
        q,
        batch.kv_cache,
        batch.query_start_loc,
        batch.seq_lens_t,
        batch.block_tables,
        0.2,
        max_query_len=5,
        out=out,
    )
    assert torch.isfinite(out).all(), f"seed={seed}"
    assert (out[batch.num_tokens :] == 7.0).all(), f"seed={seed}"
    assert not (out[: batch.num_tokens] == 7.0).any(), f"seed={seed}"


def test_prefill_takes_a_padded_tile_table_with_empty_sequence_slots(device, seed, paged_batch):
    """As a captured graph launches it: a table with room to spare (padding entries exit)
    and sequence slots with no queries give the bits of the step's own table."""
    from jacana_engine.kernels.attention_tiles import prefill_tiles

    batch = paged_batch(
        [9, 1, 4, 0, 0], [20, 7, 4, 0, 0], block_size=8, n_kv=2, head_dim=32,
        dtype=torch.float32, device=device,
    )  # fmt: skip
    q = torch.randn(batch.num_tokens, 4, 32, device=device)
    args = (q, batch.kv_cache, batch.query_start_loc, batch.seq_lens_t, batch.block_tables, 0.2)
    mine = paged_prefill_attention(*args, max_query_len=9, block_m=4)  # 2 queries a tile
    table = torch.from_numpy(prefill_tiles([9, 1, 4, 0, 0], 2, capacity=14)).to(device)
    assert (table[8:, 0] == -1).all()  # 5 + 1 + 2 tiles, then padding
    padded = paged_prefill_attention(*args, max_query_len=64, block_m=4, tiles=table)
    assert torch.equal(mine, padded), f"seed={seed}"
    with pytest.raises(ValueError, match="block_m"):
        paged_prefill_attention(*args, max_query_len=9, tiles=table)


QWEN3_8B = dict(n_heads=32, n_kv=8, head_dim=128, block_size=16)


@triton.jit
def _fragment_sum_kernel(p_ptr, alpha_ptr, out_ptr, TILES: tl.constexpr, ROWS: tl.constexpr,
                         BLOCK_N: tl.constexpr):  # fmt: skip
    r = tl.arange(0, ROWS)
    n = tl.arange(0, BLOCK_N)
    l_i = initial_row_sum(ROWS, True)
    for t in tl.static_range(TILES):
        p = tl.load(p_ptr + t * ROWS * BLOCK_N + r[:, None] * BLOCK_N + n[None, :])
        alpha = tl.load(alpha_ptr + t * ROWS + r)
        l_i = fragment_row_sums(p, l_i * alpha[:, None])
    tl.store(out_ptr + r, row_sum(l_i, True))


@pytest.mark.parametrize("block_n", [64, 128])  # cuDNN's tiles: one query, a prompt
def test_fragment_row_sum_has_the_emulated_order(device, seed, block_n):
    """The kernels' running sum (two tiles, rescaled between them) has the bits of the
    emulated order, which a plain float32 sum of the same values does not always have
    (so the order is what is tested)."""
    rows, tiles = 16, 2
    p = torch.rand(tiles, rows, block_n, device=device) * torch.rand(tiles, rows, 1, device=device)
    alpha = torch.rand(tiles, rows, device=device)
    alpha[0] = 1.0
    got = torch.full((rows,), float("nan"), device=device)
    _fragment_sum_kernel[(1,)](p, alpha, got, TILES=tiles, ROWS=rows, BLOCK_N=block_n)
    want = mma_fragment_row_sum(list(p), list(alpha))
    assert torch.equal(got, want), f"seed={seed}: {(got != want).sum()} of {rows} rows differ"
    many = torch.rand(4096, block_n, device=device)
    ones = torch.ones(4096, device=device)
    assert (mma_fragment_row_sum([many], [ones]) != many.sum(-1)).any()


@pytest.mark.gpu
@pytest.mark.parametrize("max_len", [8192, 32768])
@pytest.mark.parametrize("num_splits", [None, 1, 8])
def test_decode_gpu_qwen3_8b(gpu, device, seed, checks, paged_batch, max_len, num_splits):
    seq_lens = [max_len, 1] + [random.randint(1, max_len) for _ in range(62)]
    _check_decode(
        device,
        seed,
        checks,
        paged_batch,
        seq_lens=seq_lens,
        dtype=torch.bfloat16,
        num_splits=num_splits,
        **QWEN3_8B,
    )


@pytest.mark.gpu
def test_prefill_gpu_qwen3_8b(gpu, device, seed, checks, paged_batch):
    query_lens = [1024, 1, 333, 512, 77, 1000, 2, 640]
    contexts = [0, 8191, 4096, 1500] + [random.randint(0, 4096) for _ in range(4)]
    seq_lens = [q + c for q, c in zip(query_lens, contexts, strict=True)]
    _check_prefill(
        device,
        seed,
        checks,
        paged_batch,
        query_lens=query_lens,
        seq_lens=seq_lens,
        dtype=torch.bfloat16,
        **QWEN3_8B,
    )


@pytest.mark.gpu
def test_attention_no_host_sync_gpu(gpu, device, seed, paged_batch):
    batch = paged_batch(
        [3, 1], [40, 100], block_size=16, n_kv=8, head_dim=128, dtype=torch.bfloat16, device=device
    )
    q = torch.randn(4, 32, 128, device=device, dtype=torch.bfloat16)
    qd = torch.randn(2, 32, 128, device=device, dtype=torch.bfloat16)
    # the engine's way: the tile table from the host's query lengths, on the device
    # before the step (without one the launcher reads query_start_loc back: a sync)
    from jacana_engine.kernels.attention_tiles import prefill_tiles

    tiles = torch.from_numpy(prefill_tiles([3, 1], 64 // 4)).to(device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        paged_prefill_attention(
            q,
            batch.kv_cache,
            batch.query_start_loc,
            batch.seq_lens_t,
            batch.block_tables,
            0.1,
            max_query_len=3,
            block_m=64,
            tiles=tiles,
        )
        paged_decode_attention(
            qd, batch.kv_cache, batch.seq_lens_t, batch.block_tables, 0.1, max_seq_len=100
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")
