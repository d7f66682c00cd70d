"""Word timestamps for one window: its text tokens grouped into words, each timed by the
cross-attention alignment (alignment.py), then the heuristics faster-whisper (after
openai-whisper) applies to them, so that our words are faster-whisper's:

- words split at spaces and punctuation (languages written without spaces: wherever the
  tokens decode to whole characters); a word's probability is the mean of its tokens';
- words longer than twice the median word duration (at most 1.4 s) are cut at sentence
  ends: a sentence-ending mark keeps only the start of its span, the word after one only
  the end;
- opening punctuation joins the following word, closing punctuation the preceding one;
- a segment's first word after a pause is shortened to twice the median duration when it
  (or its pair with the second word) is too long; a segment's span and its words' span
  are reconciled (the words win unless they overrun the segment by more than 0.5 s);
- the next window starts after the last word, unless the window ended in silence.

Pure functions on host data (token ids, seconds) but ``window_words``, which runs the
alignment pass on the model. No state.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from jacana_asr.alignment import TokenAlignment, align
from jacana_asr.segments import FRAMES_PER_SECOND, TimedTokens, WindowSplit
from jacana_asr.transcription import Word
from jacana_asr.whisper_model import WhisperModel
from jacana_asr.whisper_tokens import WhisperTokens

PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
# Written without spaces between words: split wherever the tokens decode to whole characters.
UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})
MAX_MEDIAN_DURATION = 0.7  # seconds: a longer median word duration is capped at this
_REPLACEMENT_CHAR = "\ufffd"

Decode = Callable[[list[int]], str]


@dataclass
class WordTiming:
    """One word of a window as aligned: text (with its leading space), token ids, and
    seconds from the window's start. Mutable: the heuristics move and merge them."""

    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


def split_on_unicode(tokens: Sequence[int], decode: Decode) -> tuple[list[str], list[list[int]]]:
    """Group tokens into the shortest runs that decode to whole characters (a character
    may span several byte-level tokens)."""
    decoded_full = decode(list(tokens))
    words: list[str] = []
    word_tokens: list[list[int]] = []
    current: list[int] = []
    offset = 0  # characters of decoded_full consumed by the words so far
    for token in tokens:
        current.append(token)
        decoded = decode(current)
        at = decoded.find(_REPLACEMENT_CHAR)
        # An incomplete character decodes to U+FFFD, unless the text itself has one there.
        if at < 0 or (
            offset + at < len(decoded_full) and decoded_full[offset + at] == _REPLACEMENT_CHAR
        ):
            words.append(decoded)
            word_tokens.append(current)
            current = []
            offset += len(decoded)
    return words, word_tokens


def split_on_spaces(
    tokens: Sequence[int], decode: Decode, eot: int
) -> tuple[list[str], list[list[int]]]:
    """Words start at a space, a punctuation mark or a control token."""
    words: list[str] = []
    word_tokens: list[list[int]] = []
    for subword, subword_tokens in zip(*split_on_unicode(tokens, decode), strict=True):
        special = subword_tokens[0] >= eot
        if special or subword.startswith(" ") or subword.strip() in string.punctuation or not words:
            words.append(subword)
            word_tokens.append(subword_tokens)
        else:
            words[-1] += subword
            word_tokens[-1].extend(subword_tokens)
    return words, word_tokens


def split_words(
    tokens: Sequence[int], decode: Decode, eot: int, language: str
) -> tuple[list[str], list[list[int]]]:
    """(words, their tokens) of ``tokens`` (text tokens then <|endoftext|>)."""
    if language in UNSPACED_LANGUAGES:
        return split_on_unicode(tokens, decode)
    return split_on_spaces(tokens, decode, eot)


def word_timings(
    words: Sequence[str], word_tokens: Sequence[list[int]], alignment: TokenAlignment
) -> list[WordTiming]:
    """Time each word from where its first token starts to where the next word's does.

    words / word_tokens: ``split_words`` of the text tokens and <|endoftext|> (whose word
    is dropped); alignment: of the same text tokens.
    """
    if len(word_tokens) <= 1:  # only <|endoftext|>
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    starts = alignment.starts[boundaries[:-1]]
    ends = alignment.starts[boundaries[1:]]
    return [
        WordTiming(word, list(tokens), start, end, float(np.mean(alignment.probabilities[i:j])))
        for word, tokens, start, end, i, j in zip(
            words[:-1], word_tokens[:-1], starts, ends, boundaries[:-1], boundaries[1:], strict=True
        )
    ]


def merge_punctuations(timings: list[WordTiming], prepended: str, appended: str) -> None:
    """Join opening marks to the next word and closing marks to the previous one, in place
    (a merged-away entry keeps its timing with an empty word and no tokens)."""
    i, j = len(timings) - 2, len(timings) - 1
    while i >= 0:
        previous, following = timings[i], timings[j]
        if previous.word.startswith(" ") and previous.word.strip() in prepended:
            following.word = previous.word + following.word
            following.tokens = previous.tokens + following.tokens
            previous.word, previous.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(timings):
        previous, following = timings[i], timings[j]
        if not previous.word.endswith(" ") and following.word in appended:
            previous.word = previous.word + following.word
            previous.tokens = previous.tokens + following.tokens
            following.word, following.tokens = "", []
        else:
            i = j
        j += 1


def _median_and_max_duration(timings: list[WordTiming]) -> tuple[float, float]:
    durations = np.array([t.end - t.start for t in timings])
    durations = durations[durations.nonzero()]
    median = np.median(durations) if len(durations) > 0 else 0.0
    median = min(MAX_MEDIAN_DURATION, float(median))
    return median, median * 2


def _truncate_at_sentence_ends(timings: list[WordTiming], max_duration: float) -> None:
    for i in range(1, len(timings)):
        if timings[i].end - timings[i].start > max_duration:
            if timings[i].word in SENTENCE_END_MARKS:
                timings[i].end = timings[i].start + max_duration
            elif timings[i - 1].word in SENTENCE_END_MARKS:
                timings[i].start = timings[i].end - max_duration


@dataclass(frozen=True)
class WordedWindow:
    """A window's segments with their words.

    segments: the window's segments, their spans reconciled with their words'; words: per
    segment; end: the last word's end (else the last segment's end), None without
    segments; last_speech: where speech was last heard (seconds of the recording), the
    next window's ``last_speech``: ``end``, else the one before this window.
    """

    segments: tuple[TimedTokens, ...]
    words: tuple[tuple[Word, ...], ...]
    last_speech: float
    end: float | None


def _fit_segment(
    words: list[WordTiming],
    start: float,
    end: float,
    last_speech: float,
    median: float,
    max_duration: float,
) -> tuple[float, float]:
    """Shorten the words at a segment's edges and reconcile its span with theirs, in
    place; returns the segment's (start, end). words: not empty, in seconds of the
    recording."""
    first, last = words[0], words[-1]
    # The first word after a pause, or it and the second, run too long: shorten.
    if first.end - last_speech > median * 4 and (
        first.end - first.start > max_duration
        or (len(words) > 1 and words[1].end - first.start > max_duration * 2)
    ):
        if len(words) > 1 and words[1].end - words[1].start > max_duration:
            boundary = max(words[1].end / 2, words[1].end - max_duration)
            first.end = words[1].start = boundary
        first.start = max(0, first.end - max_duration)
    # The segment's start wins over a first word that starts long before it.
    if start < first.end and start - 0.5 > first.start:
        first.start = max(0, min(first.end - median, start))
    else:
        start = first.start
    # The segment's end wins over a last word that ends long after it.
    if end > last.start and end + 0.5 < last.end:
        last.end = max(last.start + median, end)
    else:
        end = last.end
    return start, end


def place_words(
    segments: Sequence[TimedTokens],
    timings: list[WordTiming],
    text_tokens: Sequence[Sequence[int]],
    time_offset: float,
    last_speech: float,
) -> WordedWindow:
    """Hand the window's word timings to its segments and apply the duration heuristics.

    segments: the window's segments in order; timings: ``word_timings`` of all their text
    tokens joined (modified in place); text_tokens: each segment's text tokens;
    time_offset: the window's start (seconds); last_speech: the end of the speech heard
    before this window.
    """
    last_speech_before = last_speech
    median, max_duration = _median_and_max_duration(timings)
    if timings:
        _truncate_at_sentence_ends(timings, max_duration)
    merge_punctuations(timings, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
    offset = np.float64(time_offset)  # numpy's round() on numpy values, as faster-whisper's
    placed_segments: list[TimedTokens] = []
    placed_words: list[tuple[Word, ...]] = []
    index = 0
    for segment, tokens in zip(segments, text_tokens, strict=True):
        start, end = segment.start, segment.end
        words: list[WordTiming] = []  # this segment's, in seconds of the recording
        taken = 0  # of its text tokens
        while index < len(timings) and taken < len(tokens):
            t = timings[index]
            if t.word:
                start_s, end_s = round(offset + t.start, 2), round(offset + t.end, 2)
                words.append(WordTiming(t.word, t.tokens, start_s, end_s, t.probability))
            taken += len(t.tokens)
            index += 1
        if words:
            start, end = _fit_segment(words, start, end, last_speech, median, max_duration)
            last_speech = end
        placed_segments.append(dataclasses.replace(segment, start=float(start), end=float(end)))
        placed_words.append(
            tuple(Word(w.word, float(w.start), float(w.end), float(w.probability)) for w in words)
        )
    window_end = next(
        (w.end for ws in reversed(placed_words) for w in reversed(ws)),
        placed_segments[-1].end if placed_segments else None,
    )
    after = window_end if window_end is not None else last_speech_before
    return WordedWindow(tuple(placed_segments), tuple(placed_words), after, window_end)


def next_seek(split: WindowSplit, worded: WordedWindow, seek: int) -> int:
    """Where the next window starts: after the last word, unless the window ended in
    silence (a lone final timestamp) or the words end before the window starts."""
    if split.single_timestamp_ending or worded.end is None:
        return split.next_seek
    if worded.end <= seek / FRAMES_PER_SECOND:
        return split.next_seek
    return round(worded.end * FRAMES_PER_SECOND)


def window_words(
    model: WhisperModel,
    tokens: WhisperTokens,
    decode: Decode,
    encoded: torch.Tensor,
    sot_sequence: Sequence[int],
    language: str,
    segments: Sequence[TimedTokens],
    *,
    seek: int,
    num_frames: int,
    last_speech: float,
) -> WordedWindow:
    """Words of one window's segments (all of them, before any is dropped as empty).

    encoded: the window's encoder output [1, n_audio_ctx, d_model]; sot_sequence:
    <|sot|> [<|lang|> <|task|>]; decode: token ids -> text (control tokens dropped).
    """
    text_tokens = [[t for t in s.tokens if t < tokens.eot] for s in segments]
    joined = [t for piece in text_tokens for t in piece]
    timings: list[WordTiming] = []
    if joined:
        alignment = align(
            model,
            encoded,
            sot_sequence,
            joined,
            no_timestamps=tokens.no_timestamps,
            eot=tokens.eot,
            num_frames=num_frames,
        )
        words, word_tokens = split_words([*joined, tokens.eot], decode, tokens.eot, language)
        timings = word_timings(words, word_tokens, alignment)
    return place_words(segments, timings, text_tokens, seek / FRAMES_PER_SECOND, last_speech)
