"""Whisper's logit rules: which tokens one decoding step may not pick.

Each rule bans tokens by setting their logits to -inf, in place, on one [vocab] row of
float32 logits, given that row's history of generated tokens. They run in the order
CTranslate2's Whisper ``generate`` applies them (see window_decoder.py); they hold no state,
so one list serves every row of every window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


class LogitRule(Protocol):
    """Bans tokens for the next step by setting their logits to -inf, in place."""

    def apply(self, step: int, logits: torch.Tensor, generated: Sequence[int]) -> None:
        """step: index of the token being chosen (0 = first); logits: [vocab] float32."""
        ...


@dataclass(frozen=True)
class SuppressTokens:
    ids: tuple[int, ...]

    def apply(self, step: int, logits: torch.Tensor, generated: Sequence[int]) -> None:
        if self.ids:
            logits[list(self.ids)] = float("-inf")


@dataclass(frozen=True)
class SuppressAtBegin:
    ids: tuple[int, ...]

    def apply(self, step: int, logits: torch.Tensor, generated: Sequence[int]) -> None:
        if step == 0 and self.ids:
            logits[list(self.ids)] = float("-inf")


@dataclass(frozen=True)
class TimestampRules:
    """Whisper's timestamp grammar (see the module docstring); ids from WhisperTokens."""

    eot: int
    no_timestamps: int
    timestamp_begin: int
    timestamp_end: int
    max_initial_timestamp: int  # an id, not an index

    def apply(self, step: int, logits: torch.Tensor, generated: Sequence[int]) -> None:
        logits[self.no_timestamps] = float("-inf")
        check_probability = False
        if step == 0:
            logits[: self.timestamp_begin] = float("-inf")
            logits[self.max_initial_timestamp + 1 : self.timestamp_end + 1] = float("-inf")
        else:
            last = generated[-1]
            if last >= self.timestamp_begin:
                penultimate = generated[-2] if step > 1 else last
                if penultimate >= self.timestamp_begin:  # a closed pair: text must follow
                    logits[self.timestamp_begin : self.timestamp_end + 1] = float("-inf")
                else:  # an open timestamp: close it (or end)
                    logits[: self.eot] = float("-inf")
                    logits[self.timestamp_begin : last] = float("-inf")
                    check_probability = True
            else:
                check_probability = True
                previous = next((t for t in reversed(generated) if t >= self.timestamp_begin), None)
                if previous is not None:  # timestamps must not go backwards
                    logits[self.timestamp_begin : previous + 1] = float("-inf")
        if check_probability:
            log_probs = logits.log_softmax(dim=-1)
            timestamp_mass = log_probs[self.timestamp_begin : self.timestamp_end + 1].logsumexp(0)
            if timestamp_mass > log_probs[: self.timestamp_begin].max():
                logits[: self.timestamp_begin] = float("-inf")
