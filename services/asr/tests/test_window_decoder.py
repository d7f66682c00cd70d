"""Whisper's logit rules on a toy vocabulary (no model needed).

Toy ids: text 0..4, <|endoftext|> 5, <|sot|> 6, <|transcribe|> 7, <|notimestamps|> 8,
timestamps 9..15; the first timestamp may be at most 11 (index 2).
"""

from __future__ import annotations

import math

import pytest
import torch

from jacana_asr.window_decoder import SuppressAtBegin, SuppressTokens, TimestampRules

EOT, NO_TS, TS0, TS_END = 5, 8, 9, 15
RULES = TimestampRules(
    eot=EOT,
    no_timestamps=NO_TS,
    timestamp_begin=TS0,
    timestamp_end=TS_END,
    max_initial_timestamp=11,
)


def _text_favoured() -> torch.Tensor:
    # Text tokens far likelier than any timestamp, so the probability rule stays quiet.
    logits = torch.zeros(16)
    logits[:TS0] = 10.0
    return logits


def _allowed(rule, step, generated, logits=None):
    logits = _text_favoured() if logits is None else logits.clone()
    rule.apply(step, logits, generated)
    return [i for i in range(16) if not math.isinf(float(logits[i]))]


def test_first_token_is_an_early_timestamp():
    assert _allowed(RULES, 0, []) == [9, 10, 11]


def test_after_a_pair_text_or_eot_follows():
    assert _allowed(RULES, 3, [9, 2, 12, 12]) == [0, 1, 2, 3, 4, 5, 6, 7]
    # A lone first timestamp counts as a pair as well: text must follow it.
    assert _allowed(RULES, 1, [10]) == [0, 1, 2, 3, 4, 5, 6, 7]


def test_an_open_timestamp_is_closed_not_before_itself():
    assert _allowed(RULES, 3, [9, 2, 12]) == [5, 6, 7, 12, 13, 14, 15]


def test_timestamps_never_decrease_after_text():
    assert _allowed(RULES, 2, [11, 3]) == [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]


def test_timestamp_mass_above_best_text_forces_a_timestamp():
    # Text token 0 is the single best token, but the six timestamps together outweigh it.
    logits = torch.full((16,), -10.0)
    logits[0] = 1.0
    logits[TS0 + 1 : TS_END + 1] = 0.0
    assert _allowed(RULES, 2, [9, 3], logits) == [10, 11, 12, 13, 14, 15]
    logits[TS0 + 1 : TS_END + 1] = -2.0  # now 6 * e^-2 < e^1: text stays allowed
    assert 0 in _allowed(RULES, 2, [9, 3], logits)


def test_suppression_rules():
    assert _allowed(SuppressTokens((1, 3)), 7, []) == [0, 2, *range(4, 16)]
    assert _allowed(SuppressAtBegin((0, EOT)), 0, []) == [1, 2, 3, 4, *range(6, 16)]
    assert len(_allowed(SuppressAtBegin((0, EOT)), 1, [2])) == 16


@pytest.mark.parametrize("bad", [{"max_length": 1}, {"temperature": -1.0}])
def test_window_options_validate(bad):
    from jacana_asr.window_decoder import WindowOptions

    with pytest.raises(ValueError):
        WindowOptions(**bad)
