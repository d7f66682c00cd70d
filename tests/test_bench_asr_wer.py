"""``bench/asr_cpu``'s word error rate: the normalizer and the edit distance against
cases counted by hand."""

from __future__ import annotations

import pytest
from asr_cpu import edit_distance, normalize, spoken_number, word_error_rate


def test_normalize_lowers_drops_punctuation_and_spells_numbers():
    assert normalize("Turn LEFT, then right!") == ["turn", "left", "then", "right"]
    assert normalize("Platform 9 at 10:15.") == ["platform", "nine", "at", "ten", "fifteen"]
    assert normalize("1,200 well-known cats' toys") == [
        *("one", "thousand", "two", "hundred", "well", "known", "cats", "toys"),
    ]


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "zero"),
        (13, "thirteen"),
        (40, "forty"),
        (42, "forty two"),
        (101, "one hundred one"),
        (2026, "two thousand twenty six"),
        (3_000_000, "three million"),
    ],
)
def test_spoken_number(n, words):
    assert spoken_number(n) == words


def _w(text: str) -> list[str]:
    return text.split()


def test_edit_distance_counts_substitutions_deletions_insertions():
    assert edit_distance([], []) == 0
    assert edit_distance(["a"], []) == 1  # one deletion
    assert edit_distance([], ["a", "b"]) == 2  # two insertions
    assert edit_distance(_w("the cat sat"), _w("the cat sat")) == 0
    assert edit_distance(_w("the cat sat"), _w("the bat sat")) == 1  # substitution
    # "a b c d" -> "b c x d e": delete a, insert x, insert e
    assert edit_distance(_w("a b c d"), _w("b c x d e")) == 3


def test_word_error_rate_sums_edits_over_reference_words():
    refs = ["The cat sat on the mat.", "Seven ships sailed north."]
    # first: "a" for "the" and "mat" missing (2 edits); second: "7" is "seven" (0 edits)
    hyps = ["a cat sat on the", "7 ships sailed north"]
    assert word_error_rate(refs, hyps) == pytest.approx(2 / 10)
    assert word_error_rate(refs, refs) == 0.0
