"""Verification rules: greedy acceptance is token-exact; rejection sampling keeps the
target distribution (checked statistically with fixed seeds and stated tolerances)."""

from __future__ import annotations

import pytest
import torch

from jacana_engine.spec.verify import greedy_accept, rejection_sample

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_greedy_accept_takes_the_matching_prefix_then_the_target_token():
    assert greedy_accept([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]  # all accepted + bonus
    assert greedy_accept([5, 6, 9, 8], [5, 6, 7]) == [5, 6, 9]  # correction at the mismatch
    assert greedy_accept([1, 6, 7, 8], [5, 6, 7]) == [1]  # first rejected: target's own
    assert greedy_accept([3], []) == [3]
    with pytest.raises(ValueError):
        greedy_accept([1, 2], [1, 2])


def _empirical(samples: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(samples), minlength=vocab).double() / len(samples)


N = 20_000


def _tol(n: int) -> float:
    """With n draws an empirical frequency has standard deviation <= sqrt(0.25 / n); the
    tolerance is 4.5 of those (a correct sampler fails with p < 1e-5 per entry), 0.016 at
    N, while a sampler that kept the draft's distribution misses by >= 0.1."""
    return 4.5 * (0.25 / n) ** 0.5


TOL = _tol(N)

TARGET = torch.tensor(
    [
        [0.10, 0.40, 0.20, 0.25, 0.05],
        [0.30, 0.05, 0.05, 0.50, 0.10],
        [0.20, 0.20, 0.20, 0.20, 0.20],
    ],
    dtype=torch.float64,
)


@pytest.mark.parametrize("draft", [[1, 3], [4, 1], [0, 0]])
def test_one_hot_drafts_keep_the_target_distribution(draft):
    """Deterministic drafts (n-gram, suffix): first token ~ p0; second token ~ p1 given
    the first draft was accepted; the bonus ~ p2 given both were."""
    g = torch.Generator().manual_seed(1234)
    runs = [rejection_sample(TARGET, draft, None, g) for _ in range(N)]
    assert all(1 <= len(r) <= 3 for r in runs)
    first = _empirical([r[0] for r in runs], 5)
    assert torch.allclose(first, TARGET[0], atol=TOL), first
    after_accept = [r[1] for r in runs if r[0] == draft[0]]
    assert len(after_accept) > N * TARGET[0, draft[0]] * 0.9
    second = _empirical(after_accept, 5)
    assert torch.allclose(second, TARGET[1], atol=_tol(len(after_accept))), second
    # the bonus token only appears after both drafts were accepted
    bonus = [r[2] for r in runs if len(r) == 3]
    assert all(r[:2] == draft for r in runs if len(r) == 3)
    if len(bonus) > 100:
        assert torch.allclose(_empirical(bonus, 5), TARGET[2], atol=_tol(len(bonus)))


def test_sampled_drafts_keep_the_target_distribution():
    """A draft model's drafts x ~ q are accepted with min(1, p/q), rejected ones
    resampled from max(0, p - q): the output's first token is ~ p, not q."""
    q = torch.tensor([[0.50, 0.10, 0.10, 0.10, 0.20]], dtype=torch.float64)
    target = TARGET[:2]
    g = torch.Generator().manual_seed(99)
    firsts = []
    for _ in range(N):
        x = int(torch.multinomial(q[0], 1, generator=g))
        firsts.append(rejection_sample(target, [x], q, g)[0])
    emp = _empirical(firsts, 5)
    assert torch.allclose(emp, target[0], atol=TOL), emp
    assert not torch.allclose(emp, q[0], atol=0.1)


def test_zero_probability_drafts_are_never_accepted():
    target = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        assert rejection_sample(target, [0], None, g) == [1]
    assert rejection_sample(target, [1], None, g) == [1, 2]  # accepted, then the bonus


def test_rejection_sample_checks_shapes():
    with pytest.raises(ValueError):
        rejection_sample(TARGET, [1], None)
