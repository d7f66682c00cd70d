"""Logits processors: penalties, logit_bias and min_tokens, batched, against references.

References: a direct per-row, per-token Python implementation of each rule; HF's
``RepetitionPenaltyLogitsProcessor`` row by row; and HF ``generate`` on SmolLM2 (greedy,
fp32, CPU) with ``repetition_penalty`` / ``sequence_bias`` / ``min_new_tokens``, which
must be token-exact with the engine.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
import torch

from hf_reference import hf_greedy
from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.sample.logits_processors import LogitsProcessors, registered, token_counts
from jacana_engine.sample.params import SamplingParams

pytestmark = pytest.mark.usefixtures("torch_one_thread")

V = 64
EOS = (0, 63)


@dataclasses.dataclass
class Row:
    sampling_params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]


def random_rows(n: int, seed: int, make_params) -> list[Row]:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        prompt = torch.randint(
            0, V, (int(torch.randint(1, 30, (1,), generator=gen)),), generator=gen
        )
        output = torch.randint(
            0, V, (int(torch.randint(0, 40, (1,), generator=gen)),), generator=gen
        )
        rows.append(Row(make_params(i), prompt.tolist(), output.tolist()))
    return rows


def reference(logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
    """Every rule, one row and one token at a time, in the documented order."""
    out = logits.clone().double()
    for r, row in enumerate(rows):
        sp = row.sampling_params
        for token, bias in sp.logit_bias:
            out[r, token] += bias
        seen = set(row.prompt_token_ids) | set(row.output_token_ids)
        for token in seen:
            x = out[r, token].item()
            out[r, token] = x / sp.repetition_penalty if x > 0 else x * sp.repetition_penalty
        for token, count in Counter(row.output_token_ids).items():
            out[r, token] -= count * sp.frequency_penalty + sp.presence_penalty
        if len(row.output_token_ids) < sp.min_tokens:
            banned = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(EOS))
            for token in banned:
                out[r, token] = -math.inf
    return out.float()


def mixed_params(i: int) -> SamplingParams:
    """Every row different; some rows use nothing (they must come back untouched)."""
    g = torch.Generator().manual_seed(100 + i)
    u = torch.rand(6, generator=g).tolist()
    if i % 5 == 4:
        return SamplingParams()
    return SamplingParams(
        repetition_penalty=[1.0, 0.7, 1.3, 2.0][i % 4],
        frequency_penalty=round(4 * u[0] - 2, 3) if i % 3 else 0.0,
        presence_penalty=round(4 * u[1] - 2, 3) if i % 2 else 0.0,
        logit_bias={int(u[2] * V): 50 * u[3] - 25, 5: -3.0} if i % 3 == 1 else {},
        min_tokens=[0, 10, 50][i % 3],
        stop_token_ids=(7,) if i % 2 else (),
        ignore_eos=i % 6 == 1,
    )


def every_row_params(i: int) -> SamplingParams:
    """Every row edited by both penalties (the processors edit all rows in place)."""
    return SamplingParams(
        repetition_penalty=[0.7, 1.3, 2.0][i % 3],
        frequency_penalty=[0.5, -1.25][i % 2],
        presence_penalty=[-0.5, 1.5, 0.25][i % 3],
    )


@pytest.mark.parametrize("make_params", [mixed_params, every_row_params])
def test_batched_pipeline_equals_the_per_row_reference(make_params):
    rows = random_rows(24, seed=0, make_params=make_params)
    logits = torch.randn(24, V, generator=torch.Generator().manual_seed(1)) * 4
    want = reference(logits, rows)
    got = LogitsProcessors(V, EOS)(logits.clone(), rows)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    for r, row in enumerate(rows):
        if row.sampling_params == SamplingParams():
            assert torch.equal(got[r], logits[r])  # inactive rows are bit-identical


def test_repetition_penalty_equals_transformers_row_by_row():
    transformers = pytest.importorskip("transformers")
    penalties = [0.5, 1.0, 1.2, 1.5, 3.0]
    rows = random_rows(
        len(penalties),
        seed=2,
        make_params=lambda i: SamplingParams(repetition_penalty=penalties[i]),
    )
    logits = torch.randn(len(rows), V, generator=torch.Generator().manual_seed(3)) * 5
    got = LogitsProcessors(V, EOS, names=["repetition_penalty"])(logits.clone(), rows)
    for r, row in enumerate(rows):
        hf = transformers.RepetitionPenaltyLogitsProcessor(penalty=penalties[r])
        ids = torch.tensor([row.prompt_token_ids + row.output_token_ids])
        want = hf(ids, logits[r : r + 1].clone())[0]
        torch.testing.assert_close(got[r], want, rtol=0, atol=1e-6)


def test_frequency_and_presence_follow_openai():
    row = Row(SamplingParams(frequency_penalty=0.5, presence_penalty=1.5), [9, 9, 9], [3, 3, 3, 4])
    logits = torch.zeros(1, V)
    got = LogitsProcessors(V, EOS)(logits, [row])[0]
    assert got[3].item() == pytest.approx(-(3 * 0.5 + 1.5))
    assert got[4].item() == pytest.approx(-(0.5 + 1.5))
    assert got[9].item() == 0.0  # prompt tokens are not penalized by these two
    negative = Row(SamplingParams(frequency_penalty=-1.0), [], [8, 8])
    assert LogitsProcessors(V, EOS)(torch.zeros(1, V), [negative])[0, 8].item() == 2.0


def test_min_tokens_bans_eos_and_stop_ids_until_reached():
    sp = SamplingParams(min_tokens=3, stop_token_ids=(7,))
    early, done = Row(sp, [1], [5, 6]), Row(sp, [1], [5, 6, 8])
    ignoring = Row(dataclasses.replace(sp, ignore_eos=True), [1], [])
    got = LogitsProcessors(V, EOS)(torch.zeros(3, V), [early, done, ignoring])
    assert torch.isinf(got[0, [0, 7, 63]]).all() and torch.isfinite(got[0, 1:7]).all()
    assert torch.isfinite(got[1]).all()
    assert torch.isinf(got[2, 7]) and torch.isfinite(got[2, [0, 63]]).all()


def test_logit_bias_accumulates_on_the_named_tokens_only():
    row = Row(SamplingParams(logit_bias={"3": 100, 60: -100.0}), [1], [])
    got = LogitsProcessors(V, EOS)(torch.ones(1, V), [row])[0]
    assert got[3].item() == 101.0 and got[60].item() == -99.0
    assert (got[[i for i in range(V) if i not in (3, 60)]] == 1.0).all()
    assert SamplingParams(logit_bias={9: 1, 2: 3}).logit_bias == ((2, 3.0), (9, 1.0))


def test_token_counts_is_a_histogram_per_row():
    lists = [[1, 1, 2], [], [5] * 7 + [0]]
    counts = token_counts(lists, 8, torch.device("cpu"))
    assert counts.shape == (3, 8)
    for row, tokens in zip(counts.tolist(), lists, strict=True):
        assert row == [Counter(tokens)[t] for t in range(8)]


def test_registry_order_and_names():
    assert registered() == (
        "logit_bias",
        "repetition_penalty",
        "frequency_presence_penalty",
        "min_tokens",
        "structured_output",  # last: nothing may lift a token its grammar rejects
    )
    with pytest.raises(ValueError, match="unknown"):
        LogitsProcessors(V, names=["temperature"])
    assert not LogitsProcessors(V).needed([SamplingParams(), SamplingParams(temperature=0.3)])


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"temperature": 0.0},
        {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 3},
        {"max_tokens": 4, "stop": ("x",), "stop_token_ids": (2,), "ignore_eos": True},
        {"logprobs": 3, "prompt_logprobs": 1},
        {"logit_bias": {3: 1.0}},
        {"repetition_penalty": 1.1},
        {"frequency_penalty": 0.5},
        {"presence_penalty": -0.5},
        {"min_tokens": 2},
        {"min_tokens": 1, "logprobs": 0, "temperature": 0.5},
    ],
)
def test_edits_logits_is_what_the_processors_say_and_steers_the_fast_path(change):
    from jacana_engine.sample import device_sampling

    params = SamplingParams(**change)
    assert params.edits_logits == LogitsProcessors(V, EOS).needed([params])
    assert params.reads_logprobs == ("logprobs" in change or "prompt_logprobs" in change)
    plain = not params.edits_logits and not params.reads_logprobs
    assert device_sampling.supported([params]) == plain
    # one row outside the fast path keeps the whole batch off it
    assert not device_sampling.supported([SamplingParams(), params, SamplingParams(min_tokens=1)])


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.01}, "frequency_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"logit_bias": {V: 1.0}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {3: 100.5}}, "logit_bias"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 17, "max_tokens": 16}, "min_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ],
)
def test_out_of_range_values_are_rejected_naming_the_field(change, param):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**change).validate(V)
    assert info.value.param == param


# ---- engine level ------------------------------------------------------------------------


def test_same_seed_same_tokens_whatever_the_batch(toy):
    """Penalised, biased, seeded sampling does not depend on the neighbours in the batch."""
    rng = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 96, (12,), generator=rng).tolist() for _ in range(6)]
    seeded = SamplingParams(
        temperature=1.0,
        seed=77,
        max_tokens=40,
        ignore_eos=True,
        frequency_penalty=2.0,
        presence_penalty=-0.5,
        repetition_penalty=1.2,
        logit_bias={3: 2.0},
    )
    neighbours = [
        SamplingParams(temperature=0.9, seed=i, max_tokens=40, presence_penalty=1.0 - i / 3)
        for i in range(5)
    ]
    solo = toy.engine().generate([prompts[0]], seeded)[0]
    batched = toy.engine().generate(prompts, [seeded, *neighbours])[0]
    tight = toy.engine(num_kv_blocks=24).generate(prompts, [seeded, *neighbours])
    assert solo == batched == tight[0]
    plain = SamplingParams(temperature=1.0, seed=77, max_tokens=40, ignore_eos=True)
    assert toy.engine().generate([prompts[0]], plain)[0] != solo  # the penalties mattered


def test_min_tokens_holds_off_eos(toy):
    rng = torch.Generator().manual_seed(5)
    candidates = (torch.randint(0, 96, (6,), generator=rng).tolist() for _ in range(5000))
    prompt = next(p for p in candidates if toy.LM.next_token(p) == toy.LM.EOS)
    engine = toy.engine()
    assert engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8)) == [[]]
    held = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, min_tokens=4))
    assert len(held[0]) >= 4 and toy.LM.EOS not in held[0][:4]


def test_greedy_logit_bias_forces_a_token(toy):
    sp = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logit_bias={42: 100})
    assert toy.engine().generate([[1, 2, 3]], sp) == [[42] * 5]


# ---- SmolLM2 against transformers generate -----------------------------------------------

PROMPT = "1, 2, 3, 1, 2, 3, 1, 2,"
CHAT = [{"role": "user", "content": "Say hi."}]


def _bias_case(tok) -> tuple[dict, dict]:
    up, down = tok(" 4").input_ids[-1], tok(" 3").input_ids[-1]
    return {"logit_bias": {up: 4.0, down: -5.0}}, {"sequence_bias": {(up,): 4.0, (down,): -5.0}}


CASES = {
    "repetition-1.3": lambda tok: ({"repetition_penalty": 1.3}, {"repetition_penalty": 1.3}),
    "repetition-0.8": lambda tok: ({"repetition_penalty": 0.8}, {"repetition_penalty": 0.8}),
    "logit-bias": _bias_case,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_processing_is_token_exact_with_transformers(smollm2_engine, hf_smollm2, case):
    hf_model, tok = hf_smollm2
    ours, theirs = CASES[case](tok)
    ids = tok(PROMPT).input_ids
    plain = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    got = smollm2_engine.generate([ids], dataclasses.replace(plain, **ours))[0]
    assert got == hf_greedy(hf_model, ids, 24, **theirs)
    if case != "repetition-0.8":  # (encouraging repetition need not change this output)
        assert got != smollm2_engine.generate([ids], plain)[0], "the processing did nothing"


def test_min_tokens_is_token_exact_with_transformers_min_new_tokens(smollm2_engine, hf_smollm2):
    hf_model, tok = hf_smollm2
    text = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    ids = tok(text).input_ids
    eos = sorted(smollm2_engine.eos_token_ids)
    short = smollm2_engine.generate([ids], SamplingParams(temperature=0.0, max_tokens=60))[0]
    assert len(short) < 40  # the model ends its answer by itself...
    floor = len(short) + 8
    sp = SamplingParams(temperature=0.0, max_tokens=60, min_tokens=floor)
    got = smollm2_engine.generate([ids], sp)[0]
    want = hf_greedy(hf_model, ids, 60, min_new_tokens=floor, eos_token_id=eos)
    if want and want[-1] in eos:
        want = want[:-1]  # the engine does not return the EOS it stopped on
    assert len(got) >= floor and got == want  # ...and is held to at least ``floor`` tokens


@pytest.mark.gpu
def test_cuda_rows_keep_their_tokens_whatever_path_their_neighbours_take(tmp_path):
    """On CUDA plain rows sample in the device kernel and processed rows in the full
    sampler; a seeded row's path, hence its tokens, must not depend on its neighbours."""
    transformers = pytest.importorskip("transformers")
    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine

    cfg = transformers.Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    cfg.architectures = ["Qwen3ForCausalLM"]
    cfg.save_pretrained(tmp_path)
    config = EngineConfig(
        model=str(tmp_path),
        load_format="dummy",
        device="cuda",
        dtype="float32",
        kv_cache_memory=1 << 28,
        max_model_len=512,
    )
    engine = LLMEngine(config, tokenizer=None)
    plain = SamplingParams(temperature=1.0, seed=5, max_tokens=24, ignore_eos=True)
    processed = dataclasses.replace(plain, seed=6, frequency_penalty=1.0, logprobs=2)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, presence_penalty=1)
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9, 8]]
    params = [plain, processed, greedy]
    alone = [engine.generate([p], sp)[0] for p, sp in zip(prompts, params, strict=True)]
    assert engine.generate(prompts, params) == alone
    assert engine.generate(prompts[:2], params[:2]) == alone[:2]
    assert engine.generate([prompts[0], prompts[2]], [plain, greedy]) == [alone[0], alone[2]]
    # asking for logprobs keeps a row on its path: the same tokens, alone or batched
    observed = dataclasses.replace(plain, logprobs=3, prompt_logprobs=1)
    assert engine.generate([prompts[0]], observed) == [alone[0]]
    assert engine.generate(prompts, [observed, processed, greedy]) == alone


@dataclasses.dataclass(eq=False)  # hashed by identity, as engine sequences are
class GrowingRow:
    sampling_params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]


def test_growing_histories_keep_each_row_and_follow_its_appends():
    """The kept arrays equal prompt + output after every append, past the buffer's first
    capacity, for rows of different lengths; a history shorter than what was kept (a row
    rewritten) is rebuilt; unhashable rows are built anew each time."""
    from jacana_engine.core.sequence import Sequence
    from jacana_engine.sample.logits_processors import GrowingHistories

    seen = GrowingHistories(lambda h: (h.prompt_token_ids, h.output_token_ids))
    rows = [GrowingRow(SamplingParams(), list(range(n)), []) for n in (0, 3, 40)]
    gen = torch.Generator().manual_seed(11)
    for step in range(70):
        for i, row in enumerate(rows):
            new = torch.randint(0, V, (i + step % 3,), generator=gen).tolist()
            row.output_token_ids.extend(new)
            got = seen(row)
            assert got.tolist() == row.prompt_token_ids + row.output_token_ids
    assert len(seen._kept) == 3  # kept, not rebuilt
    rows[1].output_token_ids[:] = [5, 6]
    assert seen(rows[1]).tolist() == [0, 1, 2, 5, 6]
    plain = Row(SamplingParams(), [1, 2], [3])
    assert seen(plain).tolist() == [1, 2, 3]
    engine_row = Sequence("r", [4, 5], SamplingParams(), max_tokens=4, output_token_ids=[6])
    assert seen(engine_row).tolist() == [4, 5, 6] and engine_row in seen._kept


def test_penalties_over_steps_equal_the_reference_with_histories_kept():
    """Rows kept between steps (by identity) get the edits the per-row reference gives
    at every step as their outputs grow."""
    processors = LogitsProcessors(V, EOS)
    rows = [
        GrowingRow(every_row_params(i), r.prompt_token_ids, list(r.output_token_ids))
        for i, r in enumerate(random_rows(6, seed=4, make_params=every_row_params))
    ]
    gen = torch.Generator().manual_seed(5)
    for _ in range(12):
        logits = torch.randn(len(rows), V, generator=gen) * 4
        want = reference(logits, rows)
        got = processors(logits.clone(), rows)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
        for row in rows:
            row.output_token_ids.extend(torch.randint(0, V, (3,), generator=gen).tolist())
