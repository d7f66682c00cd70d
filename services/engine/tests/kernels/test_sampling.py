"""The sampling kernel against the reference distribution and the same-noise reference.

- Exactness: with the same Philox stream, the kernel picks the very token that the
  float64 reference (``sample_reference``) picks, on fresh random logits and parameters.
- Distribution: empirical frequencies of many draws (fixed seeds, so the outcome is
  deterministic) pass a chi-square goodness-of-fit test against
  ``sampling_probs_reference`` at significance 1e-6 (bins with expected count < 5
  merged), and tokens of probability 0 are never drawn. The kernel itself is drawn from
  400 times under the CPU interpreter and 200k times on the GPU; the same-noise
  reference, which the kernel matches token for token, 50k times everywhere.
- Determinism: a row's token depends on (seed, step, logits) only, not on the batch.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

from jacana_engine.kernels.reference import (
    sample_reference,
    sampling_probs_reference,
)
from jacana_engine.kernels.sampling import sample
from jacana_engine.kernels.sampling_filters import (
    FilterPlan,
    filter_thresholds,
    plan_filters,
)

_Z_1E6 = 4.753  # upper 1e-6 quantile of the standard normal


def _chi_square_limit(dof: int) -> float:
    """Wilson–Hilferty approximation of the chi-square quantile at significance 1e-6."""
    c = 2.0 / (9.0 * dof)
    return dof * (1.0 - c + _Z_1E6 * math.sqrt(c)) ** 3


def _assert_fits(tokens: torch.Tensor, probs: torch.Tensor, what: str) -> None:
    """tokens: [M] draws; probs: [V] float64 target."""
    m = tokens.numel()
    counts = torch.bincount(tokens.cpu(), minlength=probs.numel()).double()
    probs = probs.cpu()
    assert counts[probs == 0].sum() == 0, f"{what}: drew a token of probability 0"
    expected = probs * m
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big & (probs > 0)].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    dof = obs.numel() - 1
    if dof < 1:
        return
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 <= _chi_square_limit(dof), (
        f"{what}: chi2={chi2:.1f} > {_chi_square_limit(dof):.1f} (dof {dof})"
    )


def _random_params(n: int, vocab: int, device):
    temperature = torch.rand(n, device=device) * 1.5 + 0.2
    temperature[torch.rand(n, device=device) < 0.2] = 0.0  # greedy rows
    top_k = torch.randint(0, min(vocab, 20), (n,), device=device)
    top_k[torch.rand(n, device=device) < 0.4] = 0
    top_p = torch.rand(n, device=device) * 0.8 + 0.2
    top_p[torch.rand(n, device=device) < 0.4] = 1.0
    min_p = torch.rand(n, device=device) * 0.3
    min_p[torch.rand(n, device=device) < 0.5] = 0.0
    seeds = torch.randint(-(2**62), 2**62, (n,), device=device)
    steps = torch.randint(0, 2**40, (n,), device=device)
    return temperature, top_k, top_p, min_p, seeds, steps


def _check_exact(device, seed, n, vocab, scale) -> None:
    logits = torch.randn(n, vocab, device=device) * scale
    params = _random_params(n, vocab, device)
    temperature, top_k, top_p, min_p, _, _ = params
    expected = sample_reference(logits, *params)
    plan = plan_filters(temperature.tolist(), top_k.tolist(), top_p.tolist(), min_p.tolist(), vocab)
    runs = (("full sort", None, 4096), ("planned", plan, 4096), ("split", plan, 16))
    for label, chosen, vocab_split in runs:
        out = torch.full((n,), -1, dtype=torch.int64, device=device)
        sample(logits, *params, plan=chosen, out=out, vocab_split=vocab_split)
        bad = (out != expected).nonzero().flatten().tolist()
        assert not bad, f"seed={seed} {label}: rows {bad} differ from the same-noise reference"


def test_sample_matches_same_noise_reference(device, seed):
    _check_exact(device, seed, n=48, vocab=50, scale=3.0)


def test_greedy_takes_first_argmax_across_chunks(device, seed):
    vocab = 2500  # three 1024-wide chunks
    logits = torch.randn(3, vocab, device=device)
    logits[0, [1500, 2100]] = 10.0  # tie across chunks: the first wins
    logits[1, [1023, 1024]] = 10.0  # tie across a chunk edge
    logits[2, [7, 9]] = 10.0  # tie inside a chunk
    zeros = torch.zeros(3, device=device)
    ids = torch.zeros(3, dtype=torch.int64, device=device)
    plan = FilterPlan(active=False, sort_width=0)
    for vocab_split in (4096, 1024, 100):  # one program; chunk-aligned splits; ragged splits
        out = torch.full((3,), -1, dtype=torch.int64, device=device)
        sample(
            logits,
            zeros,
            ids,
            zeros + 1,
            zeros,
            ids,
            ids,
            plan=plan,
            out=out,
            vocab_split=vocab_split,
        )
        assert out.tolist() == [1500, 1023, 7], f"seed={seed} vocab_split={vocab_split}"


def test_same_seed_same_token_whatever_the_batch(device, seed):
    vocab = 40
    logits = torch.randn(6, vocab, device=device)  # flat-ish: draws vary with the noise
    params = _random_params(6, vocab, device)
    params[0][:] = 1.0  # all rows sampled
    alone = torch.cat(
        [sample(logits[i : i + 1], *(p[i : i + 1] for p in params)) for i in range(3)]
    )
    order = torch.tensor([4, 2, 5, 0, 3, 1], device=device)
    mixed = sample(logits[order], *(p[order] for p in params))
    again = sample(logits[order], *(p[order] for p in params))
    assert torch.equal(mixed, again), f"seed={seed}: not deterministic"
    assert mixed[3] == alone[0] and mixed[5] == alone[1] and mixed[1] == alone[2], f"seed={seed}"

    # the step moves the stream: over 64 steps an unfiltered row sees several tokens
    m = 64
    filters = _config_rows("temperature", m, device)
    seeds = params[4][:1].expand(m).contiguous()
    draws = sample(
        logits[:1].expand(m, vocab).contiguous(), *filters, seeds, torch.arange(m, device=device)
    )
    assert draws.unique().numel() > 3, f"seed={seed}: steps do not change the draws"


CONFIGS = {  # name: (temperature, top_k, top_p, min_p)
    "temperature": (0.7, 0, 1.0, 0.0),
    "top_k": (1.0, 5, 1.0, 0.0),
    "top_p": (1.3, 0, 0.8, 0.0),
    "all": (0.9, 10, 0.9, 0.05),
}


def _config_rows(name: str, m: int, device):
    t, k, p, mp = CONFIGS[name]
    return (
        torch.full((m,), t, device=device),
        torch.full((m,), k, dtype=torch.int64, device=device),
        torch.full((m,), p, device=device),
        torch.full((m,), mp, device=device),
    )


def test_kernel_distribution(device, seed):
    name, vocab, m = "all", 16, 400
    row = torch.randn(1, vocab, device=device) * 1.5
    filters = _config_rows(name, m, device)
    seeds = torch.full((m,), 1234, dtype=torch.int64, device=device)
    tokens = sample(
        row.expand(m, vocab).contiguous(), *filters, seeds, torch.arange(m, device=device)
    )
    probs = sampling_probs_reference(row, *(f[:1] for f in filters))[0]
    _assert_fits(tokens, probs, f"kernel {name} seed={seed}")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_same_noise_reference_distribution(seed, name):
    vocab, m = 32, 50_000
    row = torch.randn(1, vocab) * 2
    filters = _config_rows(name, 1, "cpu")
    probs = sampling_probs_reference(row, *filters)  # [1, V]
    seeds = torch.full((m,), 99, dtype=torch.int64)
    tokens = sample_reference(
        row.expand(m, vocab),
        *(f.expand(m) for f in filters),
        seeds,
        torch.arange(m),
        probs=probs.expand(m, vocab),
    )
    _assert_fits(tokens, probs[0], f"reference {name} seed={seed}")


@pytest.mark.parametrize("width", ["full", "planned"])
def test_thresholds_keep_the_reference_set(seed, width):
    n, vocab = 32, 200
    logits = torch.randn(n, vocab) * 2
    temperature, top_k, top_p, min_p, _, _ = _random_params(n, vocab, "cpu")
    temperature[temperature == 0] = 1.0
    top_k[top_p < 1.0] = torch.randint(1, 20, ((top_p < 1.0).sum(),))  # plannable rows
    plan = plan_filters(temperature.tolist(), top_k.tolist(), top_p.tolist(), min_p.tolist(), vocab)
    sort_width = vocab if width == "full" else plan.sort_width
    assert width == "full" or 0 < sort_width < vocab
    thr = filter_thresholds(logits, temperature, top_k, top_p, min_p, sort_width)
    kept = logits >= thr[:, None]
    ref_kept = sampling_probs_reference(logits, temperature, top_k, top_p, min_p) > 0
    bad = (kept != ref_kept).any(dim=1).nonzero().flatten().tolist()
    assert not bad, f"seed={seed}: rows {bad} keep a different set"


def test_plan_filters():
    v = 1000
    assert plan_filters([0.0, 1.0], [5, 0], [0.5, 1.0], [0.1, 0.0], v) == FilterPlan(False, 0)
    assert plan_filters([1.0], [0], [1.0], [0.1], v) == FilterPlan(True, 0)
    assert plan_filters([1.0, 1.0], [40, 7], [0.9, 1.0], [0.0, 0.0], v) == FilterPlan(True, 40)
    assert plan_filters([1.0, 1.0], [40, 0], [1.0, 0.9], [0.0, 0.0], v) == FilterPlan(True, v)
    assert plan_filters([1.0], [v], [1.0], [0.0], v) == FilterPlan(False, 0)


@pytest.mark.gpu
def test_sample_gpu_qwen3_vocab(gpu, device, seed):
    _check_exact(device, seed, n=64, vocab=151_936, scale=4.0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_kernel_distribution_gpu(gpu, device, seed, name):
    vocab, m = 64, 200_000
    row = torch.randn(1, vocab, device=device) * 2
    filters = _config_rows(name, m, device)
    seeds = torch.full((m,), 4321, dtype=torch.int64, device=device)
    tokens = sample(
        row.expand(m, vocab).contiguous(), *filters, seeds, torch.arange(m, device=device)
    )
    probs = sampling_probs_reference(row, *(f[:1] for f in filters))[0]
    _assert_fits(tokens, probs, f"kernel {name} seed={seed}")


@pytest.mark.gpu
def test_sample_no_host_sync_gpu(gpu, device, seed):
    n, vocab = 64, 151_936
    logits = torch.randn(n, vocab, device=device)
    params = _random_params(n, vocab, device)
    plan = plan_filters(*(p.tolist() for p in params[:4]), vocab)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sample(logits, *params, plan=plan)
        sample(logits, *params)
    finally:
        torch.cuda.set_sync_debug_mode("default")
