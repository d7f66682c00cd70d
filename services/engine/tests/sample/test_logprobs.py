"""Logprobs: the model's raw distribution, for sampled tokens and for the prompt.

Oracles: ``torch.log_softmax`` on random logits; the toy model, whose logits are known in
closed form (``4`` at its next token, ``0`` elsewhere); and HF ``transformers`` on the same
SmolLM2 GGUF (fp32, CPU), whose ``log_softmax(logits)`` must match to 1e-4.
"""

from __future__ import annotations

import math

import pytest
import torch

from jacana_engine.core.outputs import TokenLogprob
from jacana_engine.sample.logits_processors import LogitsProcessors
from jacana_engine.sample.params import SamplingParams
from jacana_engine.sample.sampler import Sampler, token_logprobs

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# Toy logits: 4 at the next token, 0 at the 96 others.
TOY_LOG_Z = math.log(math.exp(4.0) + 96)
TOY_HIT, TOY_MISS = 4.0 - TOY_LOG_Z, -TOY_LOG_Z


class Row:
    """A minimal token history for the sampler."""

    def __init__(self, params: SamplingParams, prompt=(1, 2), output=()) -> None:
        self.sampling_params = params
        self.prompt_token_ids = list(prompt)
        self.output_token_ids = list(output)


# ---- the batched helper ------------------------------------------------------------------


def test_token_logprobs_match_log_softmax_with_per_row_top_counts():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 300, generator=gen) * 3
    ids = torch.tensor([0, 17, 299, 5, 42])
    counts = [0, 3, 20, 1, 7]
    ref = torch.log_softmax(logits.double(), dim=-1)
    got = token_logprobs(logits, ids, counts)
    for row, (entry, k) in enumerate(zip(got, counts, strict=True)):
        assert entry.token_id == int(ids[row])
        assert entry.logprob == pytest.approx(float(ref[row, ids[row]]), abs=1e-5)
        top = ref[row].topk(k)
        assert [t for t, _ in entry.top] == top.indices.tolist()
        assert [lp for _, lp in entry.top] == pytest.approx(top.values.tolist(), abs=1e-5)
        assert all(a[1] >= b[1] for a, b in zip(entry.top, entry.top[1:], strict=False))


def test_sampler_reports_raw_logprobs_not_the_processed_distribution():
    """Bias, penalties and temperature change what is sampled, never the reported logprobs."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 50, generator=gen)
    raw = torch.log_softmax(logits, dim=-1)
    forced = 7
    rows = [
        Row(SamplingParams(temperature=0.0, logprobs=2, logit_bias={forced: 100.0})),
        Row(SamplingParams(temperature=0.3, logprobs=0, frequency_penalty=2.0), output=[3, 3]),
        Row(SamplingParams(temperature=0.0)),  # no logprobs asked for
    ]
    sampler = Sampler(processors=LogitsProcessors(50, eos_token_ids=[0]))
    out = sampler.forward(logits.clone(), rows, [None, torch.Generator().manual_seed(2), None])
    assert int(out.token_ids[0]) == forced
    first, second, third = out.logprobs
    assert first.token_id == forced
    assert first.logprob == pytest.approx(float(raw[0, forced]), abs=1e-6)
    assert [t for t, _ in first.top] == raw[0].topk(2).indices.tolist()
    assert second.top == ()
    assert second.logprob == pytest.approx(float(raw[1, int(out.token_ids[1])]), abs=1e-6)
    assert third is None


# ---- the engine on the toy model ---------------------------------------------------------


def run(engine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list]:
    for rid, (prompt, sp) in requests.items():
        engine.add_request(rid, prompt, sp)
    outs: dict[str, list] = {rid: [] for rid in requests}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id].append(out)
    return outs


def toy_prompt_reference(toy, prompt: list[int]) -> list[float | None]:
    return [None] + [
        TOY_HIT if prompt[t] == toy.LM.next_token(prompt[:t]) else TOY_MISS
        for t in range(1, len(prompt))
    ]


def test_output_logprobs_follow_the_tokens(toy):
    prompt = [5, 9, 11, 2, 30]
    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)
    outs = run(toy.engine(), {"a": (prompt, sp)})["a"]
    tokens = [t for o in outs for t in o.new_token_ids]
    entries = [e for o in outs for e in o.logprobs]
    assert tokens == toy.greedy(prompt, 6)
    assert [e.token_id for e in entries] == tokens
    for e in entries:
        assert e.logprob == pytest.approx(TOY_HIT, abs=1e-5)
        assert e.top[0] == (e.token_id, pytest.approx(TOY_HIT, abs=1e-5))
        assert [lp for _, lp in e.top[1:]] == pytest.approx([TOY_MISS] * 2, abs=1e-5)
    assert all(o.prompt_logprobs is None for o in outs)


def test_no_logprobs_unless_asked(toy):
    sp = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    outs = run(toy.engine(), {"a": ([1, 2, 3], sp)})["a"]
    assert all(o.logprobs is None and o.prompt_logprobs is None for o in outs)


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"max_num_batched_tokens": 5, "unchecked": True},  # prompts in chunks of <= 5 tokens
        {"num_kv_blocks": 12, "max_num_batched_tokens": 16},  # preemption: recomputed chunks
    ],
    ids=["whole", "chunked", "preempted"],
)
def test_prompt_logprobs_cover_every_prompt_token_once(toy, config):
    rng = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 96, (n,), generator=rng).tolist() for n in (13, 1, 22, 9)]
    # a prompt that follows the toy model from token 3 on: high logprobs there
    prompts.append([4, 8, 15, *toy.greedy([4, 8, 15], 10)])
    sp = SamplingParams(
        temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=2, logprobs=0
    )
    engine = toy.engine(**config)
    outs = run(engine, {str(i): (p, sp) for i, p in enumerate(prompts)})
    if "num_kv_blocks" in config:
        assert engine.stats().preemptions_total > 0
    for i, prompt in enumerate(prompts):
        first, *rest = outs[str(i)]
        entries = first.prompt_logprobs
        assert [e.token_id for e in entries] == prompt
        got = [e.logprob for e in entries]
        assert got == pytest.approx(toy_prompt_reference(toy, prompt), abs=1e-5)
        assert entries[0].top == ()
        assert all(len(e.top) == 2 for e in entries[1:])
        assert all(o.prompt_logprobs is None for o in rest)


def test_prompt_logprobs_are_computed_even_when_the_prompt_is_cached(toy):
    prompt = list(range(1, 30))
    engine = toy.engine(enable_prefix_caching=True)
    plain = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    run(engine, {"warm": (prompt, plain)})
    computed = engine.model.tokens_computed
    run(engine, {"hit": (prompt, plain)})
    assert engine.model.tokens_computed - computed < len(prompt)  # the cache is in use
    asked = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, prompt_logprobs=0)
    first = run(engine, {"asked": (prompt, asked)})["asked"][0]
    got = [e.logprob for e in first.prompt_logprobs]
    assert got == pytest.approx(toy_prompt_reference(toy, prompt), abs=1e-5)


def test_a_stop_token_gets_no_logprob_entry(toy):
    prompt = [3, 1, 4]
    stop = toy.greedy(prompt, 3)[2]
    sp = SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=(stop,), logprobs=1)
    outs = run(toy.engine(), {"a": (prompt, sp)})["a"]
    assert [len(o.logprobs) for o in outs] == [len(o.new_token_ids) for o in outs]
    assert outs[-1].new_token_ids == [] and outs[-1].logprobs == []
    assert sum(len(o.new_token_ids) for o in outs) == 2


# ---- SmolLM2 against transformers --------------------------------------------------------

PROMPTS = ["The capital of France is", "def add(a, b):\n    return", "Once upon a time"]
NEW_TOKENS = 12
TOP = 5


def reference_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    """HF ``log_softmax`` at every position of ``ids``: [len(ids), V] float64."""
    with torch.inference_mode():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits.double(), dim=-1)


def assert_entry_matches(entry: TokenLogprob, ref_row: torch.Tensor, k: int) -> None:
    assert entry.logprob == pytest.approx(float(ref_row[entry.token_id]), abs=1e-4)
    want = ref_row.topk(k)
    got_ids = [t for t, _ in entry.top]
    got_lps = [lp for _, lp in entry.top]
    assert got_lps == pytest.approx(want.values.tolist(), abs=1e-4)
    for t, lp in entry.top:  # ids may swap only between near-ties
        assert float(ref_row[t]) == pytest.approx(lp, abs=1e-4)
    assert len(set(got_ids)) == k


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0),
        # sampled and processed: the reported values are still the raw model's
        SamplingParams(temperature=0.8, seed=11, repetition_penalty=1.3, presence_penalty=0.5),
    ],
    ids=["greedy", "sampled-with-penalties"],
)
def test_logprobs_equal_transformers_log_softmax(smollm2_engine, hf_smollm2, params):
    import dataclasses

    hf_model, tok = hf_smollm2
    sp = dataclasses.replace(
        params, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=TOP, prompt_logprobs=TOP
    )
    prompts = [tok(p).input_ids for p in PROMPTS]
    ids = [f"lp-{i}" for i in range(len(prompts))]
    outs = run(smollm2_engine, dict(zip(ids, [(p, sp) for p in prompts], strict=True)))
    for rid, prompt in zip(ids, prompts, strict=True):
        output = [t for o in outs[rid] for t in o.new_token_ids]
        entries = [e for o in outs[rid] for e in o.logprobs]
        assert [e.token_id for e in entries] == output and len(output) == NEW_TOKENS
        ref = reference_logprobs(hf_model, prompt + output)  # [P + O, V]
        for j, entry in enumerate(entries):
            assert_entry_matches(entry, ref[len(prompt) - 1 + j], TOP)
        prompt_entries = outs[rid][0].prompt_logprobs
        assert [e.token_id for e in prompt_entries] == prompt
        assert prompt_entries[0].logprob is None
        for t in range(1, len(prompt)):
            assert_entry_matches(prompt_entries[t], ref[t - 1], TOP)
        if params.greedy:
            assert all(e.top[0][0] == e.token_id for e in entries)
