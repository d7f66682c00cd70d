"""The greedy argmax kernel against ``torch.argmax`` (the same index, ties included).

On the CPU under Triton's interpreter at small sizes and one Qwen3-sized row; on the GPU
also at the decode graphs' batch sizes, and launched dependently after a GEMV.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from jacana_engine.kernels.argmax import SPAN, TokenCopies, argmax_rows

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize(
    ("rows", "vocab"), [(1, 1), (2, 7), (3, SPAN), (2, SPAN + 1), (4, 3 * SPAN - 5), (1, 151936)]
)
def test_same_index_as_torch(dtype, rows, vocab):
    gen = torch.Generator().manual_seed(rows * 7919 + vocab)
    x = torch.randn(rows, vocab, generator=gen).to(dtype).to(_device())
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))


@pytest.mark.parametrize("dtype", _DTYPES)
def test_ties_go_to_the_first_index_across_spans(dtype):
    """Coarse values (bfloat16 has few) tie often: within a span, and in two spans."""
    vocab = 3 * SPAN + 11
    x = torch.zeros(4, vocab)
    x[0, [5, 17]] = 2.0  # within the first span
    x[1, [SPAN + 3, 2 * SPAN + 1]] = 2.0  # the second and third spans
    x[2, [vocab - 1, SPAN - 1]] = 2.0  # the last entry and a span's last
    x[3] = torch.randint(0, 3, (vocab,), generator=torch.Generator().manual_seed(1))
    x = x.to(dtype).to(_device())
    got = argmax_rows(x)
    assert torch.equal(got, x.argmax(dim=-1))
    assert got[:3].tolist() == [5, SPAN + 3, SPAN - 1]


def test_rows_of_infinities_and_nan():
    """A row of only -inf gives 0, as torch's; NaN ranks first, as in torch (which puts
    it above +inf too: no row here holds both); +inf beats every finite value."""
    vocab = 2 * SPAN + 3
    x = torch.randn(4, vocab, generator=torch.Generator().manual_seed(2))
    x[0] = float("-inf")
    x[1, [SPAN + 9, SPAN + 40]] = float("nan")
    x[2, 2 * SPAN + 2] = float("inf")
    x[3, : SPAN + 1] = float("-inf")  # the first span all -inf, the winner after it
    x = x.to(_device())
    got = argmax_rows(x)
    assert torch.equal(got, x.argmax(dim=-1))
    assert got[:3].tolist() == [0, SPAN + 9, 2 * SPAN + 2]


def test_counters_are_ready_for_the_next_launch_and_out_is_written():
    """Every launch leaves its arrival counters at zero, so a second launch (and one with
    more rows) merges again; ``out`` receives the tokens."""
    from jacana_engine.kernels._arrivals import held_counters
    from jacana_engine.kernels.argmax import COUNTERS

    gen = torch.Generator().manual_seed(3)
    for rows in (2, 5, 2):
        x = torch.randn(rows, SPAN * 2 + 1, generator=gen).to(_device())
        out = torch.full((rows,), -1, dtype=torch.int64, device=x.device)
        assert argmax_rows(x, out=out) is out
        assert torch.equal(out, x.argmax(dim=-1))
        assert all(int(c.abs().sum()) == 0 for c in held_counters(COUNTERS, x.device))


def test_compiles_for_hopper_reading_the_logits_only_after_the_wait():
    """Compiled for sm90 here (no GPU needed), launched dependently: no global load before
    ``griddepcontrol.wait`` (the logits are the GEMV's before it), and one atomic, the
    row's arrival."""
    from hopper_codegen import hopper_ptx_counts

    counts = hopper_ptx_counts()["argmax_pdl"]
    assert counts["griddepcontrol.wait"] == 1 and counts["loads_before_wait"] == 0, counts
    assert counts["atom."] == 1 and counts["loads_after_wait"] >= 1, counts


def test_copies_go_to_the_next_ids_and_the_staged_ring_row():
    """With ``copies`` each row's token also lands in ``next_ids`` and in the ring row the
    slot tensor names when the kernel runs; the other ring rows keep what they held."""
    dev = _device()
    gen = torch.Generator().manual_seed(4)
    ring = torch.full((3, 6), -1, dtype=torch.int64, pin_memory=dev.type == "cuda")
    next_ids = torch.full((6,), -1, dtype=torch.int64, device=dev)
    slot = torch.zeros(1, dtype=torch.int64, device=dev)
    copies = TokenCopies(next_ids=next_ids, ring=ring, slot=slot)
    for step, rows in ((0, 4), (2, 2), (1, 4)):
        slot.fill_(step)
        x = torch.randn(rows, 2 * SPAN + 5, generator=gen).to(dev)
        tokens = argmax_rows(x, copies=copies)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        assert torch.equal(tokens, x.argmax(dim=-1))
        assert next_ids[:rows].tolist() == tokens.tolist() == ring[step, :rows].tolist()
        assert ring[step, rows:].tolist() == [-1] * (6 - rows)
    assert ring[0, :4].tolist() != ring[1, :4].tolist()


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="must be \\[M, V\\]"):
        argmax_rows(torch.zeros(3))
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        argmax_rows(torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="unit stride"):
        argmax_rows(torch.zeros(4, 2).t())
    with pytest.raises(ValueError, match="int64"):
        argmax_rows(torch.zeros(2, 3), out=torch.zeros(2, dtype=torch.int32))
    assert argmax_rows(torch.zeros(0, 5)).shape == (0,)
    ids, slot = torch.zeros(4, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="ring must be a contiguous"):
        copies = TokenCopies(next_ids=ids, ring=torch.zeros(2, 1, dtype=torch.int64), slot=slot)
        argmax_rows(torch.zeros(2, 3), copies=copies)
    with pytest.raises(ValueError, match="next_ids must be int64"):
        ring = torch.zeros(2, 4, dtype=torch.int64)
        copies = TokenCopies(next_ids=ids.int(), ring=ring, slot=slot)
        argmax_rows(torch.zeros(2, 3), copies=copies)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 3, 16, 64])
def test_dependent_launch_after_the_gemv_that_writes_the_logits(rows):
    """Launched with PDL right after a skinny lm_head GEMV (itself dependent) at
    Qwen3's vocabulary, in a CUDA graph too: the argmax waits for the logits."""
    from jacana_engine.kernels.skinny_gemm import MAX_M, pick_config, skinny_linear

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    gen = torch.Generator().manual_seed(rows)
    w = (torch.randn(151936, 1024, generator=gen) * 0.05).to(torch.bfloat16).cuda()
    h = torch.randn(rows, 1024, generator=gen).to(torch.bfloat16).cuda()

    def head():
        if rows <= MAX_M:
            config = dataclasses.replace(pick_config(rows, w.shape[0], w.shape[1]), pdl=True)
            logits = skinny_linear(h, w, config=config)
        else:
            logits = h @ w.t()
        return logits, argmax_rows(logits, pdl=True)

    logits, ids = head()
    assert torch.equal(ids, logits.argmax(dim=-1))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_logits, g_ids = head()
    for _ in range(3):
        h.copy_(torch.randn(rows, 1024, generator=gen).to(torch.bfloat16))
        graph.replay()
        assert torch.equal(g_ids, g_logits.argmax(dim=-1))
