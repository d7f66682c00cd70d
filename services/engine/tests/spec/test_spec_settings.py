"""Speculative settings: env variables reach SpeculativeConfig; bad values fail at start-up."""

from __future__ import annotations

import pytest

from jacana_common.settings import SettingsError
from jacana_engine.entrypoints.settings import EngineSettings


def test_env_reaches_the_speculative_config(monkeypatch):
    monkeypatch.setenv("JACANA_ENGINE_SPECULATIVE_PROPOSER", "suffix")
    monkeypatch.setenv("JACANA_ENGINE_NUM_SPECULATIVE_TOKENS", "6")
    monkeypatch.setenv("JACANA_ENGINE_SPECULATIVE_TRANSPORT", "remote")
    monkeypatch.setenv("JACANA_ENGINE_DRAFTER_ADDRESS", "drafter:50071")
    monkeypatch.setenv("JACANA_ENGINE_DRAFTER_DEADLINE_MS", "20")
    spec = EngineSettings.load().engine_config().speculative
    assert (spec.proposer, spec.num_speculative_tokens, spec.transport) == ("suffix", 6, "remote")
    assert spec.drafter_address == "drafter:50071" and spec.drafter_deadline_s == 0.02
    assert spec.enabled


def test_speculation_is_off_by_default():
    assert not EngineSettings.load().engine_config().speculative.enabled


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"speculative_proposer": "bogus"}, "SPECULATIVE_PROPOSER"),
        ({"speculative_proposer": "draft_model"}, "SPECULATIVE_DRAFT_MODEL"),
        ({"speculative_ngram_min": 5, "speculative_ngram_max": 2}, "NGRAM_MIN"),
        ({"num_speculative_tokens": 0}, "NUM_SPECULATIVE_TOKENS"),
        ({"num_speculative_tokens": 17}, "NUM_SPECULATIVE_TOKENS"),
        ({"speculative_transport": "carrier-pigeon"}, "SPECULATIVE_TRANSPORT"),
        ({"drafter_address": "no-port"}, "DRAFTER_ADDRESS"),
        ({"drafter_deadline_ms": 0}, "DRAFTER_DEADLINE_MS"),
    ],
)
def test_bad_values_fail_with_the_variable_named(overrides, names):
    with pytest.raises(SettingsError, match=names):
        EngineSettings.load(**overrides)
