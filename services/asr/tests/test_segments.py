"""Window splitting against faster-whisper's own splitter on the same token sequences."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from faster_whisper.transcribe import WhisperModel as ReferenceModel

from jacana_asr.segments import compression_ratio, split_window

TIMESTAMP_BEGIN = 50363  # tiny.en's <|0.00|>


def reference_split(tokens, seek, window_frames):
    """faster-whisper's splitter, called on a stand-in for its model object (it reads
    only the two constants below from it)."""
    owner = SimpleNamespace(time_precision=0.02, input_stride=2)
    tokenizer = SimpleNamespace(timestamp_begin=TIMESTAMP_BEGIN)
    segments, next_seek, _ = ReferenceModel._split_segments_by_timestamps(
        owner,
        tokenizer=tokenizer,
        tokens=tokens,
        time_offset=seek * 0.01,
        segment_size=window_frames,
        segment_duration=window_frames * 0.01,
        seek=seek,
    )
    return [(s["start"], s["end"], tuple(s["tokens"])) for s in segments], next_seek


def stamp(seconds: float) -> int:
    return TIMESTAMP_BEGIN + round(seconds / 0.02)


CASES = {
    "pairs, lone ending": [stamp(0), 10, 11, stamp(2.4), stamp(2.4), 12, stamp(4.8)],
    "pairs, unfinished ending": [stamp(0), 10, stamp(1), stamp(1.2), 11, 12],
    "one pair": [stamp(0.5), 10, 11, stamp(3)],
    "no timestamps": [10, 11, 12],
    "only the first timestamp": [stamp(0), 10, 11],
    "double at the end": [stamp(0), 10, stamp(2), stamp(2)],
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("seek", [0, 2_140])
def test_split_window_matches_reference(name, seek):
    tokens = CASES[name]
    window = 3000 if seek == 0 else 1_234
    split = split_window(tokens, timestamp_begin=TIMESTAMP_BEGIN, seek=seek, window_frames=window)
    got = [(s.start, s.end, s.tokens) for s in split.segments]
    want, want_seek = reference_split(tokens, seek, window)
    assert split.next_seek == want_seek
    assert len(got) == len(want)
    for (start, end, toks), (ref_start, ref_end, ref_toks) in zip(got, want, strict=True):
        assert toks == ref_toks
        assert start == pytest.approx(ref_start, abs=1e-9)
        assert end == pytest.approx(ref_end, abs=1e-9)


def test_split_window_random_sequences_match_reference():
    rng = random.Random(7)
    for _ in range(300):
        tokens = []
        clock = 0
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.4:
                clock += rng.randint(0, 40)
                tokens.append(TIMESTAMP_BEGIN + clock)
            else:
                tokens.append(rng.randint(0, 50_000))
        split = split_window(tokens, timestamp_begin=TIMESTAMP_BEGIN, seek=300, window_frames=3000)
        want, want_seek = reference_split(tokens, 300, 3000)
        assert split.next_seek == want_seek, tokens
        assert [(s.tokens) for s in split.segments] == [w[2] for w in want], tokens
        assert [round(s.start, 6) for s in split.segments] == [round(w[0], 6) for w in want]
        assert [round(s.end, 6) for s in split.segments] == [round(w[1], 6) for w in want]


def test_compression_ratio_flags_repetition():
    assert compression_ratio("") == 0.0
    varied = "The quick brown fox jumps over the lazy dog near the river bank."
    looping = "I am here. " * 40
    assert compression_ratio(looping) > 2.4 > compression_ratio(varied)
