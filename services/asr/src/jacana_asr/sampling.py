"""Greedy decoding and temperature sampling of one window (best-of-n), as CTranslate2 does it.

``SamplingSearch`` owns the rows of one window: one for greedy decoding, ``best_of`` for
sampling, each an independent hypothesis. Every step each live row applies the logit rules
to its own history, takes log-softmax (the score), and picks its next token: the argmax,
or a draw from softmax(log_probs * (1 / T)). A row ends at <|endoftext|> (not kept) or at
the step budget; the window's answer is the row with the best length-normalized score
(summed log-probability / length ** length_penalty), CTranslate2's order of hypotheses.

``Draws`` owns a request's random state, on the host. It reproduces CTranslate2's CPU
sampler exactly: a ``std::mt19937`` seeded with the 32-bit seed, and for each row and step
libstdc++'s ``std::discrete_distribution`` over the float32 probabilities (cumulative sums
in float64, a uniform made of two 32-bit draws, the first index whose cumulative sum reaches
it). Rows draw in row order, so a request's draws do not depend on what it is batched with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from jacana_asr.logit_rules import LogitRule

_TWO_32 = 4294967296.0
_TWO_64 = 18446744073709551616.0
_BELOW_ONE = float(np.nextafter(1.0, 0.0))


class Draws:
    """A seeded stream of categorical draws (not thread-safe: one request's, used in order)."""

    def __init__(self, seed: int) -> None:
        if not 0 <= seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {seed}")
        # RandomState's integer seeding is MT19937's init_genrand, as std::mt19937(seed).
        _, key, pos, *_ = np.random.RandomState(seed).get_state()
        self._bits = np.random.MT19937()
        self._bits.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": pos}}

    def uniform(self) -> float:
        """std::generate_canonical<double, 53>: two 32-bit outputs, low word first."""
        low, high = (float(x) for x in self._bits.random_raw(2))
        value = (low + high * _TWO_32) / _TWO_64
        return value if value < 1.0 else _BELOW_ONE

    def categorical(self, probs: np.ndarray) -> int:
        """probs: [vocab] float32, not necessarily normalized; returns an index."""
        weights = probs.astype(np.float64)
        total = np.cumsum(weights)[-1]  # std::accumulate: sequential, as cumsum
        cumulative = np.cumsum(weights / total)
        cumulative[-1] = 1.0
        return int(np.searchsorted(cumulative, self.uniform(), side="left"))


@dataclass
class Hypothesis:
    """One row's tokens (<|endoftext|> excluded) and summed log-probability (float32, as
    CTranslate2 sums it); logprobs: each token's own log-probability, beside ``tokens``."""

    tokens: list[int] = field(default_factory=list)
    sum_logprob: np.float32 = field(default_factory=lambda: np.float32(0.0))
    logprobs: list[float] = field(default_factory=list)

    def normalized(self, length_penalty: float) -> float:
        """CTranslate2's final score: sum_logprob / length ** length_penalty."""
        length = np.float32(len(self.tokens))
        scale = np.power(length, np.float32(length_penalty))
        if scale == 0:
            return float("-inf") if self.sum_logprob < 0 else float("inf")
        return float(self.sum_logprob / scale)


def best(hypotheses: Sequence[Hypothesis], length_penalty: float) -> Hypothesis:
    """The hypothesis CTranslate2 returns first: the highest normalized score."""
    return max(hypotheses, key=lambda h: h.normalized(length_penalty))


def apply_rules(
    rules: Sequence[LogitRule], step: int, logits: torch.Tensor, histories: Sequence[list[int]]
) -> torch.Tensor:
    """logits: [rows, vocab] raw -> [rows, vocab] log-probabilities after each row's rules."""
    logits = logits.float().clone()
    for row, history in enumerate(histories):
        for rule in rules:
            rule.apply(step, logits[row], history)
    return logits.log_softmax(dim=-1)


class SamplingSearch:
    """Greedy (temperature 0, one row) or best-of-n sampling over one window's rows."""

    def __init__(
        self,
        *,
        rules: Sequence[LogitRule],
        eot: int,
        first_input: int,
        max_new: int,
        temperature: float,
        rows: int,
        length_penalty: float,
        draws: Draws | None,
    ) -> None:
        if temperature > 0 and draws is None:
            raise ValueError("sampling needs a Draws stream")
        self.rules, self.eot, self.max_new = rules, eot, max_new
        self.temperature, self.length_penalty, self.draws = temperature, length_penalty, draws
        # float(1) / T in float32, as CTranslate2 scales the log-probabilities.
        self._inverse_t = float(np.float32(1.0) / np.float32(temperature)) if temperature else 0.0
        self._alive = [Hypothesis() for _ in range(rows)]
        self._next = [first_input] * rows
        self._finished: list[Hypothesis] = []

    @property
    def rows(self) -> int:
        return len(self._alive)

    @property
    def done(self) -> bool:
        return not self._alive

    def inputs(self) -> list[int]:
        return list(self._next)

    def advance(self, step: int, logits: torch.Tensor) -> list[int]:
        """logits: [rows, vocab] of this step. Returns, for each row still decoding, the row
        it continues (rows that ended are dropped; the others keep their order)."""
        log_probs = apply_rules(self.rules, step, logits, [h.tokens for h in self._alive])
        picks = self._pick(log_probs)
        chosen = log_probs.gather(1, torch.tensor(picks, device=log_probs.device)[:, None])
        scores = chosen[:, 0].cpu().numpy()  # float32
        last_step = step + 1 >= self.max_new
        kept: list[int] = []
        alive, nexts = [], []
        for row, (hypothesis, token) in enumerate(zip(self._alive, picks, strict=True)):
            hypothesis.sum_logprob = np.float32(hypothesis.sum_logprob + scores[row])
            if token != self.eot:
                hypothesis.tokens.append(token)
                hypothesis.logprobs.append(float(scores[row]))
            if token == self.eot or last_step:
                self._finished.append(hypothesis)
            else:
                kept.append(row)
                alive.append(hypothesis)
                nexts.append(token)
        self._alive, self._next = alive, nexts
        return kept

    def result(self) -> Hypothesis:
        if not self.done:
            raise RuntimeError("the search has not finished")
        return best(self._finished, self.length_penalty)

    def _pick(self, log_probs: torch.Tensor) -> list[int]:
        # log_probs: [rows, vocab]
        if self.temperature == 0.0:
            return [int(t) for t in log_probs.argmax(dim=-1).tolist()]
        probs = (log_probs * self._inverse_t).softmax(dim=-1).cpu().numpy()  # [rows, vocab]
        return [self.draws.categorical(row) for row in probs]
