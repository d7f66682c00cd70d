"""Sampler: distributions, per-request seeds, greedy, edge cases."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from jacana_engine.sample.params import SamplingParams
from jacana_engine.sample.sampler import RequestRng, Sampler, SamplingBatch, logprobs

LOGITS = [2.0, 1.5, 1.2, 0.9, 0.3, 0.0, -0.4, -1.0, -1.7, -3.0]  # V = 10, no near-ties


def reference_probs(logits: list[float], p: SamplingParams) -> list[float]:
    """Independent scalar reference: temperature, top-k, top-p (over what top-k kept), min-p."""
    scaled = [x / p.temperature for x in logits]
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    kept = order[: p.top_k] if p.top_k else order
    z = sum(math.exp(scaled[i]) for i in kept)
    mass, nucleus = 0.0, []
    for i in kept:
        if nucleus and mass >= p.top_p:
            break
        nucleus.append(i)
        mass += math.exp(scaled[i]) / z
    top = max(scaled)
    final = [i for i in nucleus if math.exp(scaled[i] - top) >= p.min_p]
    z = sum(math.exp(scaled[i]) for i in final)
    return [math.exp(scaled[i]) / z if i in final else 0.0 for i in range(len(scaled))]


def chi_square_critical(dof: int, z: float = 3.09) -> float:
    """Upper 0.1% point of chi-square (Wilson-Hilferty approximation)."""
    c = 2.0 / (9.0 * dof)
    return dof * (1.0 - c + z * math.sqrt(c)) ** 3


PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=4),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=1.0, min_p=0.1),
    SamplingParams(temperature=0.9, top_k=6, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=2.0, top_k=3, top_p=0.5),
]


@pytest.mark.parametrize("params", PARAMS)
def test_frequencies_match_the_filtered_softmax(params):
    draws = 20_000
    logits = torch.tensor([LOGITS] * draws)
    sampler = Sampler(default_generator=torch.Generator().manual_seed(0))
    tokens = sampler(logits, [params] * draws)
    counts = torch.bincount(tokens, minlength=len(LOGITS)).double()
    expected = torch.tensor(reference_probs(LOGITS, params), dtype=torch.float64)
    freqs = counts / draws
    assert counts[expected == 0].sum() == 0  # masked tokens never appear
    assert (freqs - expected).abs().max() < 0.015
    kept = expected > 0
    if kept.sum() > 1:
        e = expected[kept] * draws
        chi2 = float(((counts[kept] - e) ** 2 / e).sum())
        assert chi2 < chi_square_critical(int(kept.sum()) - 1)


def test_mixed_batch_filters_each_row_by_its_own_params():
    mix = [PARAMS[1], PARAMS[2], SamplingParams(temperature=0.0), PARAMS[3], PARAMS[5]]
    draws = 6000
    params = mix * draws
    logits = torch.tensor([LOGITS] * len(params))
    tokens = Sampler(torch.Generator().manual_seed(8))(logits, params).view(draws, len(mix))
    for column, p in enumerate(mix):
        counts = torch.bincount(tokens[:, column], minlength=len(LOGITS)).double()
        expected = (
            torch.nn.functional.one_hot(torch.tensor(0), len(LOGITS)).double()
            if p.greedy
            else torch.tensor(reference_probs(LOGITS, p), dtype=torch.float64)
        )
        assert counts[expected == 0].sum() == 0
        assert (counts / draws - expected).abs().max() < 0.025


def test_per_row_generators_sample_the_same_distribution():
    params = SamplingParams(temperature=0.8, top_p=0.95)
    rows = 4000
    generators = [torch.Generator().manual_seed(1000 + i) for i in range(rows)]
    tokens = Sampler()(torch.tensor([LOGITS] * rows), [params] * rows, generators)
    freqs = torch.bincount(tokens, minlength=len(LOGITS)).double() / rows
    expected = torch.tensor(reference_probs(LOGITS, params), dtype=torch.float64)
    assert (freqs - expected).abs().max() < 0.03


def test_greedy_is_argmax_and_draws_nothing():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    generators = [torch.Generator().manual_seed(i) for i in range(6)]
    states = [g.get_state() for g in generators]
    params = [SamplingParams(temperature=0.0)] * 6
    assert torch.equal(Sampler()(logits, params, generators), logits.argmax(-1))
    mixed = [SamplingParams(temperature=0.0 if i % 2 else 1.0, top_k=5) for i in range(6)]
    tokens = Sampler()(logits, mixed, generators)
    assert torch.equal(tokens[1::2], logits[1::2].argmax(-1))
    for i, (g, state) in enumerate(zip(generators, states, strict=True)):
        assert torch.equal(g.get_state(), state) == bool(i % 2)  # only sampled rows advanced


def seeded_run(
    params: SamplingParams, steps: list[torch.Tensor], position: int, others: list[SamplingParams]
) -> list[int]:
    """Tokens of one seeded request sampled over ``steps``, sitting at ``position`` among
    ``others`` (fresh logits each step; their own generator when they have a seed, else the
    sampler's shared one)."""
    own = torch.Generator().manual_seed(params.seed)
    other_gens = [None if p.seed is None else torch.Generator().manual_seed(p.seed) for p in others]
    noise = torch.Generator().manual_seed(position + 100 * len(others))
    sampler = Sampler(default_generator=torch.Generator().manual_seed(99))
    out = []
    for row_logits in steps:
        batch = [torch.randn(1, row_logits.shape[-1], generator=noise) * 3 for _ in others]
        batch.insert(position, row_logits.unsqueeze(0))
        params_list = list(others)
        params_list.insert(position, params)
        gens = list(other_gens)
        gens.insert(position, own)
        out.append(int(sampler(torch.cat(batch), params_list, gens)[position]))
    return out


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_p=0.9, seed=42),
        SamplingParams(temperature=1.0, seed=42),
        SamplingParams(temperature=0.7, top_k=20, seed=42),
        SamplingParams(temperature=1.1, min_p=0.05, seed=42),
    ],
)
def test_same_seed_same_tokens_whatever_the_batch(params):
    g = torch.Generator().manual_seed(5)
    steps = [torch.randn(300, generator=g) for _ in range(40)]
    alone = seeded_run(params, steps, 0, [])
    crowds = [
        (0, [SamplingParams(temperature=0.0)] * 3),
        (2, [SamplingParams(top_k=5, seed=1), SamplingParams(temperature=0.0)] * 2),
        (1, [SamplingParams(temperature=1.2, min_p=0.2, seed=2), SamplingParams(top_p=0.5)]),
        (3, [SamplingParams(temperature=1.0)] * 3),  # unseeded rows: shared draws
    ]
    for position, others in crowds:
        assert seeded_run(params, steps, position, others) == alone
    assert seeded_run(replace(params, seed=43), steps, 0, []) != alone  # the seed does matter


def test_rows_without_generator_share_the_default():
    logits = torch.tensor([LOGITS] * 3)
    params = [SamplingParams(temperature=1.0)] * 3
    a = Sampler(torch.Generator().manual_seed(3))(logits, params)
    b = Sampler(torch.Generator().manual_seed(3))(logits, params)
    assert torch.equal(a, b)


def test_top_k_larger_than_vocab_is_no_top_k():
    logits = torch.tensor([LOGITS] * 2000)
    big = Sampler(torch.Generator().manual_seed(1))(logits, [SamplingParams(top_k=1000)] * 2000)
    none = Sampler(torch.Generator().manual_seed(1))(logits, [SamplingParams()] * 2000)
    assert torch.equal(big, none)


def test_tiny_top_p_keeps_the_most_likely_token():
    logits = torch.tensor([LOGITS] * 500)
    tokens = Sampler(torch.Generator().manual_seed(2))(
        logits, [SamplingParams(temperature=1.5, top_p=1e-6)] * 500
    )
    assert torch.all(tokens == 0)


def test_min_p_one_keeps_only_the_top_token():
    tokens = Sampler(torch.Generator().manual_seed(2))(
        torch.tensor([LOGITS] * 200), [SamplingParams(min_p=1.0)] * 200
    )
    assert torch.all(tokens == 0)


def test_ties_at_the_cut_are_kept():
    # Like HF's top-k: every token tied with the k-th survives, whatever order a sort picks.
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0, -1.0]] * 3000)
    for params in (SamplingParams(top_k=2), SamplingParams(top_k=2, top_p=0.99)):
        tokens = Sampler(torch.Generator().manual_seed(4))(logits, [params] * 3000)
        assert set(tokens.tolist()) == {1, 2, 4}


def test_all_but_one_masked():
    logits = torch.full((300, 20), float("-inf"))
    logits[:, 13] = -5.0
    params = [SamplingParams(temperature=t, top_p=0.5, min_p=0.3) for t in (0.3, 1.0, 4.0)] * 100
    tokens = Sampler(torch.Generator().manual_seed(0))(logits, params)
    assert torch.all(tokens == 13)


def test_half_precision_logits_and_batch_object():
    logits = torch.randn(4, 64).to(torch.bfloat16)
    params = [SamplingParams(temperature=0.5, top_k=8)] * 4
    batch = SamplingBatch.build(params, [None] * 4, vocab_size=64)
    assert batch.top_k_rows is not None and batch.nucleus_rows is None
    assert not batch.needs_min_p and not batch.all_greedy
    tokens = Sampler(torch.Generator().manual_seed(0)).sample(logits, batch)
    top8 = logits.float().topk(8, dim=-1).indices
    assert tokens.dtype == torch.int64
    assert all(int(t) in top8[i].tolist() for i, t in enumerate(tokens))


def test_mismatched_generators_are_rejected():
    with pytest.raises(ValueError, match="generators"):
        SamplingBatch.build([SamplingParams()] * 2, [None], vocab_size=10)


def test_request_rng():
    rng = RequestRng(seed=0)
    a, b = rng.generator(7), rng.generator(7)
    assert torch.equal(torch.rand(5, generator=a), torch.rand(5, generator=b))
    first = torch.rand(5, generator=rng.generator(None))
    second = torch.rand(5, generator=rng.generator(None))
    assert not torch.equal(first, second)
    # an engine started with the same seed hands out the same unseeded streams
    replay = RequestRng(seed=0)
    assert torch.equal(torch.rand(5, generator=replay.generator(None)), first)


def test_logprobs():
    logits = torch.randn(3, 30)
    chosen_ids = torch.tensor([4, 0, 29])
    chosen, top_ids, top_lp = logprobs(logits, chosen_ids, num_top=5)
    reference = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(chosen, reference[torch.arange(3), chosen_ids])
    assert torch.equal(top_ids, reference.topk(5, dim=-1).indices)
    assert torch.allclose(top_lp, reference.topk(5, dim=-1).values)
    _, none_ids, none_lp = logprobs(logits, chosen_ids)
    assert none_ids.shape == (3, 0) and none_lp.shape == (3, 0)
