"""Aligning a window's text tokens to its audio: cross-attention -> token start times.

Whisper's word timestamps (openai-whisper's ``timing.py``, CTranslate2's ``Whisper.align``
that faster-whisper calls) come from a teacher-forced decoder pass over

    <|sot|> [<|lang|> <|task|>] <|notimestamps|> text tokens... <|endoftext|>

against the window's encoder output. The cross-attention of a few heads known to follow the
speech (``WhisperConfig.alignment_heads``) is turned into a [tokens, frames] matrix:
pre-softmax scores cut to the window's real frames, softmax over frames, each head
standardized over the tokens, a median filter along the frames, the mean over the heads.
Dynamic time warping on its negation pairs every text token with the audio frames it
covers (one frame = 20 ms, the encoder's stride).

The steps are pure functions on numpy float32 (as CTranslate2 computes them on the CPU,
tie-breaking included), each testable alone; ``align`` runs the model pass (on the model's
device) and chains them. Host side, no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from jacana_asr.segments import FRAMES_PER_SECOND, INPUT_STRIDE
from jacana_asr.whisper_model import WhisperModel

MEDIAN_FILTER_WIDTH = 7  # frames; faster-whisper's and openai-whisper's
TOKENS_PER_SECOND = FRAMES_PER_SECOND / INPUT_STRIDE  # encoder frames a second: 50


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median of each ``width`` (odd) neighbourhood along the last axis, the edges padded
    by reflection (``x[1], x[0] | x[0] ...``, numpy's "reflect"). An axis no longer than
    width // 2 cannot be reflected and is returned as is, as CTranslate2 does."""
    if width < 1 or width % 2 == 0:
        raise ValueError(f"the median filter's width must be odd, got {width}")
    half = width // 2
    if x.shape[-1] <= half:
        return x.copy()
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(half, half)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.median(windows, axis=-1).astype(x.dtype)


def standardize(x: np.ndarray, axis: int) -> np.ndarray:
    """(x - mean) / std along ``axis`` (population std, no epsilon: CTranslate2's
    LayerNorm(axis, 0) without scale or shift)."""
    mean = x.mean(axis=axis, keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(axis=axis, keepdims=True))
    return (x - mean) / std


def negative_dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The monotonic path through x [n, m] that maximizes the summed x (DTW on -x).

    Returns (row indices, column indices) of the path, from (0, 0) to (n - 1, m - 1), each
    step moving down, right or both. Ties prefer, in order: diagonal only when strictly
    cheapest, then down when strictly cheapest, else right (CTranslate2's ``negative_dtw``).
    The cost table is filled one anti-diagonal at a time (cells i + j = k depend only on
    diagonals k - 1 and k - 2), in float32 as CTranslate2 sums.
    """
    x = np.asarray(x, dtype=np.float32)
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
    cost[0, 0] = 0.0
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    for k in range(2, n + m + 1):
        i = np.arange(max(1, k - m), min(n, k - 1) + 1)
        j = k - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        diagonal = (c0 < c1) & (c0 < c2)
        down = ~diagonal & (c1 < c0) & (c1 < c2)
        cost[i, j] = -x[i - 1, j - 1] + np.where(diagonal, c0, np.where(down, c1, c2))
        trace[i, j] = np.where(diagonal, 0, np.where(down, 1, 2))
    trace[0, :] = 2
    trace[:, 0] = 1
    rows, cols = [], []
    i, j = n, m
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        else:
            j -= 1
    return np.array(rows[::-1]), np.array(cols[::-1])


def alignment_matrix(scores: np.ndarray, num_frames: int, width: int) -> np.ndarray:
    """scores: pre-softmax cross-attention [heads, tokens, n_audio_ctx] of one sequence;
    num_frames: mel frames of real audio in the window. Returns [tokens, num_frames // 2]."""
    frames = num_frames // INPUT_STRIDE
    content = scores[:, :, :frames].astype(np.float32)
    weights = np.exp(content - content.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)  # softmax over the real frames only
    weights = median_filter(standardize(weights, axis=-2), width)
    return weights.mean(axis=0)


@dataclass(frozen=True)
class TokenAlignment:
    """Where each text token of a window starts, and how sure the model was of it.

    starts: [text tokens + 1] seconds from the window's start: starts[i] is where token i
      begins, starts[-1] where <|endoftext|> begins (the last token's end).
    probabilities: [text tokens] each token's probability, the softmax taken over the text
      vocabulary (ids below <|endoftext|>) at the position that predicts it.
    """

    starts: np.ndarray
    probabilities: np.ndarray


@torch.inference_mode()
def align(
    model: WhisperModel,
    audio: torch.Tensor,
    sot_sequence: Sequence[int],
    text_tokens: Sequence[int],
    *,
    no_timestamps: int,
    eot: int,
    num_frames: int,
    median_filter_width: int = MEDIAN_FILTER_WIDTH,
) -> TokenAlignment:
    """Align ``text_tokens`` (no timestamps, no control tokens) to one window's audio.

    audio: the window's encoder output [1, n_audio_ctx, d_model]; sot_sequence:
    <|sot|> [<|lang|> <|task|>], without <|notimestamps|>; num_frames: mel frames of real
    audio in the window (3000 but at the end of the recording).
    """
    if any(not 0 <= t < eot for t in text_tokens):
        raise ValueError("text_tokens must be text token ids (below <|endoftext|>)")
    offset = len(sot_sequence)
    sequence = [*sot_sequence, no_timestamps, *text_tokens, eot]
    tokens = torch.tensor([sequence], dtype=torch.long)
    logits, scores = model.alignment_scores(audio, tokens)
    # logits: [1, length, vocab]; row t predicts sequence[t + 1].
    text_logits = logits[0, offset : offset + len(text_tokens), :eot]
    targets = torch.tensor(list(text_tokens), dtype=torch.long, device=text_logits.device)
    probabilities = text_logits.softmax(dim=-1).gather(-1, targets[:, None])[:, 0]
    matrix = alignment_matrix(scores[0].cpu().numpy(), num_frames, median_filter_width)
    # Rows <|notimestamps|> ... the last text token: the positions that predict text[0]
    # ... <|endoftext|>.
    rows, cols = negative_dtw(matrix[offset : offset + len(text_tokens) + 1])
    jumps = np.diff(rows, prepend=-1).astype(bool)  # the first frame of each row
    return TokenAlignment(
        starts=cols[jumps] / TOKENS_PER_SECOND,
        probabilities=probabilities.cpu().numpy(),
    )
