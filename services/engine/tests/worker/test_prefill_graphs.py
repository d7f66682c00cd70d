"""Prefill graphs (``prefill_graphs.py``): the buckets, the host staging of one chunk and
of mixed steps against ``build_batch`` (on the CPU), and on a GPU the engine's outputs
with the graphs on against the same engine with them off."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from jacana_engine.core.scheduler import ScheduledSequence
from jacana_engine.core.sequence import Sequence
from jacana_engine.kernels.attention_tiles import prefill_tiles
from jacana_engine.kv_cache.block_manager import BlockManager
from jacana_engine.sample.params import SamplingParams
from jacana_engine.worker.batch import build_batch
from jacana_engine.worker.prefill_graphs import PrefillStaging, prefill_buckets

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


def _staging(max_tokens: int, max_blocks: int, max_seqs: int = 4, tile_rows: int = 40):
    return PrefillStaging(max_tokens, max_seqs, max_blocks, BLOCK, tile_rows, pin=False)


@pytest.mark.parametrize("start,n,tokens", [(0, 7, 8), (0, 8, 8), (9, 6, 32), (5, 2, 2)])
def test_staging_holds_one_chunk_then_padding_that_writes_nothing(start, n, tokens):
    bm = BlockManager(64, BLOCK)
    s = _chunk(start + n + 3, start, n, bm)
    staging = _staging(32, 16)
    staging.fill_stand_in(32, 2, 40)  # what a capture left behind
    query_start = staging.fill([s], tokens, 2, 40)
    expected = build_batch([s], BLOCK)
    assert query_start == expected.meta.query_start_loc.tolist() == [0, n]
    _assert_staged(staging, [s], tokens, expected, tile_rows=40, block_q=2)


def test_staging_holds_a_mixed_step_in_order_with_empty_sequence_slots():
    bm = BlockManager(64, BLOCK)
    step = [_chunk(12, 0, 12, bm), _chunk(9, 8, 1, bm), _chunk(20, 5, 6, bm)]
    staging = _staging(32, 16, max_seqs=5)
    staging.fill_stand_in(32, 4, 20)
    query_start = staging.fill(step, 32, 4, 20)
    expected = build_batch(step, BLOCK)
    assert query_start == expected.meta.query_start_loc.tolist() == [0, 12, 13, 19]
    _assert_staged(staging, step, 32, expected, tile_rows=20, block_q=4)
    # only the step's table rows travel: up to the third sequence's
    assert staging.step_bytes < staging.host.numel()


def _assert_staged(staging, step, tokens, expected, tile_rows, block_q):
    n = expected.input_ids.shape[0]
    i64, t = staging.host64, staging.max_tokens
    assert i64[:n].tolist() == expected.input_ids.tolist()
    assert i64[t : t + n].tolist() == expected.positions.tolist()
    assert i64[2 * t : 2 * t + n].tolist() == expected.meta.slot_mapping.tolist()
    assert i64[n:tokens].tolist() == [0] * (tokens - n)  # padding: token 0
    assert i64[t + n : t + tokens].tolist() == [0] * (tokens - n)  # at position 0
    assert i64[2 * t + n : 2 * t + tokens].tolist() == [-1] * (tokens - n)  # no KV write
    parts = staging.parts(staging.host32, tile_rows)
    b = len(step)
    # empty sequence slots: no queries (query_start_loc stays at n)
    assert parts["query_start_loc"].tolist() == expected.meta.query_start_loc.tolist() + [n] * (
        staging.max_seqs - b
    )
    assert parts["seq_lens"][:b].tolist() == expected.meta.seq_lens.tolist()
    lens = expected.meta.query_lens_cpu
    assert parts["tiles"].tolist() == prefill_tiles(lens, block_q, tile_rows).tolist()
    for k, s in enumerate(step):
        table = s.seq.block_table
        assert parts["block_tables"][k, : len(table)].tolist() == table


def test_a_step_fits_with_up_to_max_seqs_known_chunks_one_longer_than_a_token():
    bm = BlockManager(64, BLOCK)
    staging = _staging(16, 4, max_seqs=2)
    assert staging.fits([_chunk(10, 0, 10, bm)])
    assert staging.fits([_chunk(8, 0, 8, bm), _chunk(8, 7, 1, bm)])  # a prompt and a decode
    assert not staging.fits([_chunk(20, 0, 17, bm)])  # more than max_tokens
    assert not staging.fits([_chunk(10, 9, 1, bm)])  # one token: the decode graphs'
    assert not staging.fits([_chunk(8, 7, 1, bm), _chunk(9, 8, 1, bm)])  # decodes alone
    assert not staging.fits([_chunk(4, 0, 4, bm)] * 3)  # more than max_seqs
    assert not staging.fits([_chunk(20, 8, 12, bm)])  # a table of 5 blocks
    pending = dataclasses.replace(_chunk(10, 0, 2, bm), pending_token=True)
    assert not staging.fits([pending])


def test_the_stand_in_attends_its_tokens_and_writes_nothing():
    staging = _staging(16, 4, max_seqs=3, tile_rows=10)
    staging.fill_stand_in(10, 4, 10)
    t = staging.max_tokens
    assert staging.host64[t : t + 10].tolist() == list(range(10))
    assert staging.host64[2 * t : 2 * t + 10].tolist() == [-1] * 10
    parts = staging.parts(staging.host32, 10)
    assert parts["query_start_loc"].tolist() == [0, 10, 10, 10]
    assert parts["seq_lens"].tolist() == [10, 0, 0]
    assert parts["tiles"][:3].tolist() == [[0, 2], [0, 1], [0, 0]]  # the last tile first
    assert parts["tiles"][3:, 0].tolist() == [-1] * 7
    assert parts["block_tables"].tolist() == [[0] * 4] * 3  # block 0 alone: in every pool


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


def _staggered(engine, prompts: list[list[int]], params: SamplingParams) -> dict[str, list]:
    """Each request's tokens, request i added at step 2 i: prompts prefill beside the
    running requests' decodes (mixed steps)."""
    tokens: dict[str, list] = {}
    pending, step = list(enumerate(prompts)), 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] * 2 <= step:
            i, prompt = pending.pop(0)
            engine.add_request(f"r{i}", prompt, params)
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        step += 1
    return tokens


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mixed_steps_replay_and_serve_what_eager_mixed_steps_do(peaked_qwen3, tmp_path):
    """Prompts arriving while others decode: the steps that mix them replay a prefill
    graph (several sequences, empty slots, a padded tile table) and serve the greedy and
    seeded tokens of the same engine running those steps eagerly (the peaked model's
    margins hold across the GEMMs' row counts)."""
    from gpu_engines import engines_differing_in

    eager_mixed, graphed = engines_differing_in(
        "prefill_graph_seqs",
        (1, 0),
        str(peaked_qwen3),
        tmp_path,
        tokenizer=None,
        enable_prefix_caching=False,
    )
    assert graphed.runner.prefill_graphs.max_seqs == graphed.config.max_num_seqs
    before = graphed.runner.prefill_graphs.mixed_replays
    gen = torch.Generator().manual_seed(13)
    prompts = [
        torch.randint(0, 2048, (n,), generator=gen).tolist()
        for n in (3, 37, 90, 5, 61, 130, 7, 250)
    ]
    for params in (
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.8, top_k=40, seed=3, max_tokens=24, ignore_eos=True),
    ):
        ours = _staggered(graphed, prompts, params)
        assert ours == _staggered(eager_mixed, prompts, params), params
        assert all(len(t) == 24 for t in ours.values())
    assert graphed.runner.prefill_graphs.mixed_replays - before >= 8
    assert eager_mixed.runner.prefill_graphs.mixed_replays == 0
