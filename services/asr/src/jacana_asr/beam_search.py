"""Beam search over one window, step for step as CTranslate2's ``BeamSearch`` does it.

``BeamSearch`` owns the beams of one window (host side: token lists and float32 scores; the
decoder rows live in a ``DecoderBatch``). Per step:

1. each beam applies the logit rules to its own history; log-softmax gives its step scores,
   and each beam's running score is added to its row (float32);
2. the ``2 * beam_size`` best (beam, token) candidates are taken over all rows at once; the
   first step runs on one row, so its candidates all extend the prompt;
3. of the first ``beam_size`` candidates, each that is <|endoftext|> (or any, on the last
   step) is registered as a finished hypothesis (<|endoftext|> not kept) and its place goes
   to the next candidate beyond ``beam_size`` that is not <|endoftext|>; when none is left
   the ended candidate stays in the beam, as in CTranslate2;
4. the search ends on the last step, or once ``round(beam_size * patience)`` hypotheses have
   finished (with ``length_penalty == 0``: once the top beam has finished);
5. the answer is the hypothesis with the highest score / length ** length_penalty.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from jacana_asr.logit_rules import LogitRule
from jacana_asr.sampling import Hypothesis, apply_rules, best


class BeamSearch:
    def __init__(
        self,
        *,
        rules: Sequence[LogitRule],
        eot: int,
        first_input: int,
        max_new: int,
        beam_size: int,
        patience: float,
        length_penalty: float,
    ) -> None:
        if beam_size < 2:
            raise ValueError(f"beam search needs beam_size >= 2, got {beam_size}")
        max_candidates = round(beam_size * patience)
        if max_candidates < 1:
            raise ValueError("beam_size * patience must round to at least 1")
        self.rules, self.eot, self.max_new = rules, eot, max_new
        self.beam_size, self.length_penalty = beam_size, length_penalty
        self._max_candidates = max_candidates
        self._beams = [Hypothesis()]  # one row until the first step has chosen its candidates
        self._next = [first_input]
        self._finished: list[Hypothesis] = []
        self._top_finished = False
        self._done = False

    @property
    def rows(self) -> int:
        return 0 if self._done else len(self._beams)

    @property
    def done(self) -> bool:
        return self._done

    def inputs(self) -> list[int]:
        return list(self._next)

    def advance(self, step: int, logits: torch.Tensor) -> list[int]:
        """logits: [rows, vocab]. Returns, for each beam of the next step, the row it
        extends (empty once the search is done)."""
        log_probs = apply_rules(self.rules, step, logits, [b.tokens for b in self._beams])
        if step > 0:
            scores = torch.tensor(
                np.array([b.sum_logprob for b in self._beams], dtype=np.float32),
                device=log_probs.device,
            )
            log_probs = log_probs + scores[:, None]
        vocab = log_probs.shape[1]
        values, flat = log_probs.reshape(-1).topk(2 * self.beam_size)  # [2 * beam_size]
        values, flat = values.cpu().numpy(), flat.cpu().tolist()
        origins = [i // vocab for i in flat]
        words = [i % vocab for i in flat]

        last_step = step + 1 >= self.max_new
        chosen: list[int] = []  # candidate index of each next beam
        spare = self.beam_size
        for k in range(self.beam_size):
            pick = k
            if words[k] == self.eot or last_step:
                if k == 0:
                    self._top_finished = True
                origin = self._beams[origins[k]]
                tokens, logprobs = list(origin.tokens), list(origin.logprobs)
                if words[k] != self.eot:
                    tokens.append(words[k])
                    logprobs.append(float(values[k] - origin.sum_logprob))
                self._finished.append(Hypothesis(tokens, np.float32(values[k]), logprobs))
                for j in range(spare, 2 * self.beam_size):
                    if words[j] != self.eot:
                        pick, spare = j, j + 1
                        break
            chosen.append(pick)

        if last_step or self._enough_finished():
            self._done = True
            self._beams, self._next = [], []
            return []
        self._beams = [self._extend(self._beams[origins[c]], words[c], values[c]) for c in chosen]
        self._next = [words[c] for c in chosen]
        return [origins[c] for c in chosen]

    @staticmethod
    def _extend(beam: Hypothesis, word: int, score: np.float32) -> Hypothesis:
        """``beam`` + ``word``, whose running score becomes ``score`` (the word's own
        log-probability is the difference)."""
        own = float(score - beam.sum_logprob)
        return Hypothesis([*beam.tokens, word], np.float32(score), [*beam.logprobs, own])

    def _enough_finished(self) -> bool:
        if self.length_penalty == 0:  # CTranslate2 exits early only without a penalty
            return self._top_finished and len(self._finished) >= 1
        return len(self._finished) >= self._max_candidates

    def result(self) -> Hypothesis:
        if not self._done:
            raise RuntimeError("the search has not finished")
        return best(self._finished, self.length_penalty)
