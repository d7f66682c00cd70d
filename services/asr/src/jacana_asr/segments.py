"""Turning one window's decoded tokens into timed segments, and where the next window starts.

Pure functions over token ids (host side, no torch). Whisper writes a timestamp token before
and after each stretch of speech it transcribes: ``<|0.00|> text <|2.40|><|2.40|> more
<|4.80|>``. Two timestamps in a row close one segment and open the next; a lone timestamp at
the end means nothing more was said in the window. Timestamps count in steps of
``TIME_PRECISION`` seconds from the window's start.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

FRAMES_PER_SECOND = 100  # log-mel frames: hop 160 at 16 kHz
INPUT_STRIDE = 2  # mel frames per encoder position (the second conv has stride 2)
TIME_PRECISION = INPUT_STRIDE / FRAMES_PER_SECOND  # seconds per timestamp step: 0.02


@dataclass(frozen=True)
class TimedTokens:
    """One segment's tokens (timestamps included) and its span in seconds of the audio."""

    start: float
    end: float
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class WindowSplit:
    """What one window yielded: its segments and the frame the next window starts at.

    single_timestamp_ending: the output ended in a lone timestamp (nothing more was said
    in the window).
    """

    segments: tuple[TimedTokens, ...]
    next_seek: int
    single_timestamp_ending: bool = False


def split_window(
    tokens: list[int], *, timestamp_begin: int, seek: int, window_frames: int
) -> WindowSplit:
    """Cut a window's output at its timestamp pairs.

    tokens: the decoded ids without the prompt; seek: the window's first frame;
    window_frames: how many frames of audio it held (3000 but at the end of the audio).
    When the output ends inside a segment (no closing timestamp pair), that unfinished
    segment is dropped and the next window starts at the last closed timestamp, so the
    speech it held is decoded again with its full context.
    """
    time_offset = seek / FRAMES_PER_SECOND
    is_timestamp = [t >= timestamp_begin for t in tokens]
    ends_with_lone_timestamp = len(tokens) >= 2 and is_timestamp[-1] and not is_timestamp[-2]
    # Positions where a timestamp follows a timestamp: a segment ends just before each.
    cuts = [i for i in range(1, len(tokens)) if is_timestamp[i] and is_timestamp[i - 1]]

    def seconds(token: int) -> float:
        return time_offset + (token - timestamp_begin) * TIME_PRECISION

    if not cuts:
        # Zero or one timestamp pair: the window is one segment, as long as its last
        # timestamp says (or the whole window when there is none past the first).
        stamps = [t for t in tokens if t >= timestamp_begin]
        duration = window_frames / FRAMES_PER_SECOND
        if stamps and stamps[-1] != timestamp_begin:
            duration = (stamps[-1] - timestamp_begin) * TIME_PRECISION
        segment = TimedTokens(time_offset, time_offset + duration, tuple(tokens))
        return WindowSplit((segment,), seek + window_frames, ends_with_lone_timestamp)

    if ends_with_lone_timestamp:
        cuts.append(len(tokens))
    segments = []
    begin = 0
    for end in cuts:
        piece = tokens[begin:end]
        segments.append(TimedTokens(seconds(piece[0]), seconds(piece[-1]), tuple(piece)))
        begin = end
    if ends_with_lone_timestamp:
        next_seek = seek + window_frames
    else:
        # tokens[begin - 1] is the last closed segment's closing timestamp.
        next_seek = seek + (tokens[begin - 1] - timestamp_begin) * INPUT_STRIDE
    return WindowSplit(tuple(segments), next_seek, ends_with_lone_timestamp)


def compression_ratio(text: str) -> float:
    """Bytes of text over bytes of its zlib stream: repetitive (looping) output scores high."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0
