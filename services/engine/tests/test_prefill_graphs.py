"""One-sequence prefill graphs (``prefill_graphs.py``): the buckets, the host staging
against ``build_batch`` (on the CPU), and on a GPU the engine's outputs with the graphs on
against the same engine with them off."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from jacana_engine.kv_cache.block_manager import BlockManager
from jacana_engine.model_runner import build_batch
from jacana_engine.prefill_graphs import PrefillStaging, prefill_buckets
from jacana_engine.sampling_params import SamplingParams
from jacana_engine.scheduler import ScheduledSequence
from jacana_engine.sequence import Sequence

BLOCK = 4


def test_buckets_double_to_512_then_step_by_128_and_end_at_the_most():
    assert prefill_buckets(2048)[:6] == [32, 64, 128, 256, 512, 640]
    assert prefill_buckets(2048)[-2:] == [1920, 2048]
    assert prefill_buckets(1000) == [32, 64, 128, 256, 512, 640, 768, 896, 1000]
    assert prefill_buckets(40) == [32, 40]
    assert prefill_buckets(2) == [2]
    with pytest.raises(ValueError, match="at least 2 tokens"):
        prefill_buckets(1)


def _chunk(prompt_len: int, start: int, n: int, bm: BlockManager) -> ScheduledSequence:
    """Tokens [start, start + n) of a prompt whose first ``start`` are computed."""
    seq = Sequence("s", [100 + i for i in range(prompt_len)], SamplingParams(), 64)
    bm.allocate(seq, start + n)
    seq.num_computed_tokens = start
    return ScheduledSequence(seq, start, n, start + n == prompt_len)


@pytest.mark.parametrize("start,n,tokens", [(0, 7, 8), (0, 8, 8), (9, 6, 32), (5, 2, 2)])
def test_staging_holds_the_chunk_then_padding_that_writes_nothing(start, n, tokens):
    bm = BlockManager(64, BLOCK)
    s = _chunk(start + n + 3, start, n, bm)
    staging = PrefillStaging(max_tokens=32, max_blocks=16, block_size=BLOCK, pin=False)
    staging.fill_stand_in(32)  # what a capture left behind
    staging.fill(s, tokens)
    expected = build_batch([s], BLOCK)
    i64, i32, t = staging.host64, staging.host32, staging.max_tokens
    assert i64[:n].tolist() == expected.input_ids.tolist()
    assert i64[t : t + n].tolist() == expected.positions.tolist()
    assert i64[2 * t : 2 * t + n].tolist() == expected.meta.slot_mapping.tolist()
    assert i64[n:tokens].tolist() == [0] * (tokens - n)  # padding: token 0
    assert i64[t + n : t + tokens].tolist() == [0] * (tokens - n)  # at position 0
    assert i64[2 * t + n : 2 * t + tokens].tolist() == [-1] * (tokens - n)  # no KV write
    assert i32[:2].tolist() == expected.meta.query_start_loc.tolist()  # [0, n]
    assert i32[2] == expected.meta.seq_lens.item() == start + n
    table = s.seq.block_table
    assert i32[3 : 3 + len(table)].tolist() == expected.meta.block_tables[0].tolist()


def test_only_one_known_chunk_of_two_to_max_tokens_fits():
    bm = BlockManager(64, BLOCK)
    staging = PrefillStaging(max_tokens=16, max_blocks=4, block_size=BLOCK, pin=False)
    assert staging.fits([_chunk(10, 0, 10, bm)])
    assert not staging.fits([_chunk(20, 0, 17, bm)])  # more than max_tokens
    assert not staging.fits([_chunk(10, 9, 1, bm)])  # one token: the decode graphs'
    assert not staging.fits([_chunk(8, 0, 8, bm), _chunk(8, 0, 8, bm)])  # two sequences
    assert not staging.fits([_chunk(20, 8, 12, bm)])  # a table of 5 blocks
    pending = dataclasses.replace(_chunk(10, 0, 2, bm), pending_token=True)
    assert not staging.fits([pending])


def test_the_stand_in_attends_its_tokens_and_writes_nothing():
    staging = PrefillStaging(max_tokens=16, max_blocks=4, block_size=BLOCK, pin=False)
    staging.fill_stand_in(10)
    t = staging.max_tokens
    assert staging.host64[t : t + 10].tolist() == list(range(10))
    assert staging.host64[2 * t : 2 * t + 10].tolist() == [-1] * 10
    assert staging.host32[:3].tolist() == [0, 10, 10]
    assert staging.host32[3:].tolist() == [0] * 4  # block 0 alone: in every pool


# ---- on a GPU ---------------------------------------------------------------------------


def _engines(peaked_qwen3, tmp_path, **config):
    """The same small engine with prefill graphs off and on, on one tuning cache (the
    same decode GEMMs) and without prefix caching (every prompt is prefilled whole), so
    outputs can differ only where the prefill ran."""
    from gpu_engines import engines_differing_in

    return engines_differing_in(
        "prefill_graph_tokens",
        (0, 256),
        str(peaked_qwen3),
        tmp_path,
        tokenizer=None,
        enable_prefix_caching=False,
        **config,
    )


def _outputs(engine, prompt: list[int], params: SamplingParams) -> list:
    """Every output of one request, run alone (so its prefill is a step of its own)."""
    engine.add_request("r", prompt, params)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    return outs


def _tokens(outs: list) -> list[int]:
    return [t for out in outs for t in out.new_token_ids]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_prompts_of_a_bucket_length_prefill_to_the_same_tokens(peaked_qwen3, tmp_path):
    """A chunk that fills its bucket runs the eager step's kernels and shapes: greedy and
    seeded outputs equal the eager prefill's, for whole prompts and for a long prompt
    prefilled in chunks of 64 after its computed prefix."""
    eager_prefill, graphed = _engines(peaked_qwen3, tmp_path)
    assert eager_prefill.runner.prefill_graphs is None
    replayed = graphed.runner.prefill_graphs.replays  # the start-up warm-up's
    gen = torch.Generator().manual_seed(11)
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    seeded = SamplingParams(temperature=0.8, top_k=40, seed=3, max_tokens=12, ignore_eos=True)
    for n in (32, 64, 128, 256):
        prompt = torch.randint(0, 2048, (n,), generator=gen).tolist()
        for params in (greedy, seeded):
            ours = _tokens(_outputs(graphed, prompt, params))
            assert ours == _tokens(_outputs(eager_prefill, prompt, params)), (n, params)
    assert graphed.runner.prefill_graphs.replays - replayed == 8
    chunked = _engines(peaked_qwen3, tmp_path / "chunked", max_num_batched_tokens=64)
    replayed = chunked[1].runner.prefill_graphs.replays
    long_prompt = torch.randint(0, 2048, (192,), generator=gen).tolist()
    ours = _tokens(_outputs(chunked[1], long_prompt, greedy))
    assert ours == _tokens(_outputs(chunked[0], long_prompt, greedy))
    assert chunked[1].runner.prefill_graphs.replays - replayed == 3  # three chunks of 64


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_padded_prompt_gives_the_eager_prefills_prompt_logprobs(peaked_qwen3, tmp_path):
    """A chunk shorter than its bucket runs its GEMMs over the bucket's rows, which may
    round differently: every prompt token's logprob stays within a few bf16 roundings of
    the eager prefill's (this model's logits reach ~5, where one rounding is 0.03; a
    misplaced position or a padding row's KV write moves many tokens by whole units)."""
    eager_prefill, graphed = _engines(peaked_qwen3, tmp_path)
    replayed = graphed.runner.prefill_graphs.replays  # the start-up warm-up's
    gen = torch.Generator().manual_seed(12)
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=0, ignore_eos=True)
    for n in (5, 50, 200):
        prompt = torch.randint(0, 2048, (n,), generator=gen).tolist()
        ours, theirs = _outputs(graphed, prompt, params), _outputs(eager_prefill, prompt, params)
        mine = [e.logprob for e in ours[0].prompt_logprobs[1:]]
        ref = [e.logprob for e in theirs[0].prompt_logprobs[1:]]
        assert len(mine) == len(ref) == n - 1
        gaps = sorted(abs(a - b) for a, b in zip(mine, ref, strict=True))
        assert gaps[-1] < 0.25 and gaps[len(gaps) // 2] < 0.05, (n, gaps[-5:])
    assert graphed.runner.prefill_graphs.replays - replayed == 3
