"""Incremental detokenization and stop strings."""

from __future__ import annotations

import random

import pytest

from jacana_engine.text.detokenizer import (
    ByteStreamDecoder,
    Detokenizer,
    WindowDecoder,
    make_incremental_decoder,
)
from jacana_engine.text.stop_checker import StopStringMatcher
from jacana_engine.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer) -> Tokenizer:
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def spm_tok() -> Tokenizer:
    """A sentencepiece-style tokenizer (metaspace, byte fallback): not byte-concatenative."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, normalizers

    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    pieces += ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "▁he", "▁hel", "▁hell", "▁hello"]
    pieces += ["▁w", "▁wo", "▁wor", "▁worl", "▁world", "ll", "!"]
    merges = [("▁", "h"), ("▁h", "e"), ("▁he", "l"), ("▁hel", "l"), ("▁hell", "o")]
    merges += [("▁", "w"), ("▁w", "o"), ("▁wo", "r"), ("▁wor", "l"), ("▁worl", "d"), ("l", "l")]
    backend = Backend(
        models.BPE(
            vocab={p: i for i, p in enumerate(pieces)},
            merges=merges,
            unk_token="<unk>",
            byte_fallback=True,
            fuse_unk=True,
        )
    )
    backend.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    backend.add_special_tokens(["<s>", "</s>"])
    return Tokenizer(backend, special_tokens={"bos_token": "<s>", "eos_token": "</s>"})


TEXTS = [
    "Hello world! This is a test.",
    "emoji 🎉👍🏽👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "你好，世界！这是一个测试。日本語のテキスト",
    "mixed: naïve 数学 ∑ ∫ √ π ≈ 3.14 — done",
    "code:\n    def f(x):\n        return x**2\n",
    "<|im_start|>assistant\nsure<|im_end|> after",
]


def stream(detok: Detokenizer, ids: list[int]) -> tuple[list[str], str | None]:
    pieces, stop = [], None
    for token_id in ids:
        text, stop = detok.push(token_id)
        pieces.append(text)
        if stop is not None:
            return pieces, stop
    tail = detok.flush()
    pieces.append(tail.text)
    return pieces, tail.stop


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("kind", [ByteStreamDecoder, WindowDecoder])
def test_stream_concatenates_to_decode(tok, text, skip, kind):
    ids = tok.encode(text)
    detok = Detokenizer(tok, skip_special_tokens=skip, decoder=kind(tok, skip))
    pieces, stop = stream(detok, ids)
    assert stop is None
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)
    assert not any("\ufffd" in p for p in pieces)  # never a broken character


def test_byte_level_tokenizers_get_the_byte_stream(tok, spm_tok):
    assert isinstance(make_incremental_decoder(tok), ByteStreamDecoder)
    assert spm_tok.token_bytes is None
    assert isinstance(make_incremental_decoder(spm_tok), WindowDecoder)


def test_split_characters_are_held_until_complete(tok):
    # Each emoji is 4 bytes; the byte-level vocabulary spells rare ones over several tokens.
    ids = tok.encode("🦜🪿")
    assert len(ids) > 2
    detok = Detokenizer(tok)
    pieces = [detok.push(i).text for i in ids]
    assert "" in pieces  # something was held back
    assert [p for p in pieces if p] == ["🦜", "🪿"]


@pytest.mark.parametrize("text", ["hello world!", "hello 你好 🎉 world", " hello"])
def test_window_decoder_on_sentencepiece_style(spm_tok, text):
    ids = spm_tok.encode(text)
    pieces, _ = stream(Detokenizer(spm_tok), ids)
    assert "".join(pieces) == spm_tok.decode(ids)
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("kind", [ByteStreamDecoder, WindowDecoder])
def test_random_ids_including_invalid_utf8(tok, kind):
    rng = random.Random(0)
    for _ in range(100):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 30))]
        # lone continuation / lead bytes make invalid UTF-8 that must decode like the backend
        ids += [tok.token_to_id(c) for c in rng.sample(["Ģ", "ł", "ĥ", "Ġ", "ð"], 2)]
        detok = Detokenizer(tok, decoder=kind(tok))
        pieces, _ = stream(detok, ids)
        assert "".join(pieces) == tok.decode(ids)


@pytest.mark.parametrize("kind", [ByteStreamDecoder, WindowDecoder])
def test_ids_past_the_vocabulary_decode_to_nothing(tok, kind):
    # Models pad their embedding rows past the tokenizer's vocabulary; a sampled padding id
    # must not break the stream.
    ids = [*tok.encode("Hello"), tok.vocab_size + 5, *tok.encode(" world")]
    pieces, _ = stream(Detokenizer(tok, decoder=kind(tok)), ids)
    assert "".join(pieces) == tok.decode(ids) == "Hello world"


def test_window_decoder_keeps_a_bounded_window(tok):
    decoder = WindowDecoder(tok)
    ids = tok.encode("word " * 500)
    text = "".join(decoder.push(i) for i in ids) + decoder.flush()
    assert text == tok.decode(ids)
    assert len(decoder._ids) < 200


# --------------------------------------------------------------------------------------------
# stop strings
# --------------------------------------------------------------------------------------------


def test_stop_string_across_tokens(tok):
    text = "The answer is 42.\n\nUser: next question"
    ids = tok.encode(text)
    detok = Detokenizer(tok, stop=["\n\nUser:"])
    pieces, stop = stream(detok, ids)
    assert stop == "\n\nUser:"
    assert "".join(pieces) == "The answer is 42."
    assert detok.stopped == "\n\nUser:"
    assert detok.num_tokens < len(ids)
    assert detok.push(ids[-1]) == ("", None)  # finished: nothing more


def test_partial_stop_is_held_then_released(tok):
    ids = tok.encode("one two END")
    detok = Detokenizer(tok, stop=["END OF TEXT"])
    released = "".join(detok.push(i).text for i in ids)
    assert released == "one two "  # "END" may still grow into the stop string
    assert detok.flush() == ("END", None)  # finished for another reason (e.g. length)


def test_stop_inside_one_token(tok):
    ids = tok.encode("alpha beta gamma")
    detok = Detokenizer(tok, stop=["et"])
    pieces, stop = stream(detok, ids)
    assert (stop, "".join(pieces)) == ("et", "alpha b")


def test_extend_stops_consuming_at_the_stop(tok):
    ids = tok.encode("a b STOP c d e")
    detok = Detokenizer(tok, stop=["STOP"])
    delta = detok.extend(ids)
    assert delta == ("a b ", "STOP")
    assert detok.num_tokens == len(tok.encode("a b STOP"))


def test_earliest_completing_stop_wins():
    matcher = StopStringMatcher(["abcd", "c"])
    assert matcher.feed("xabcd") == ("xab", "c")
    matcher = StopStringMatcher(["bc", "abc"])  # both end at the same place: the longer one
    assert matcher.feed("xabc") == ("x", "abc")


def reference_stop(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Brute force: scan ends left to right; first completed stop (longest on a tie)."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            stop = max(done, key=len)
            return text[: end - len(stop)], stop
    return text, None


def longest_partial_stop(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    lengths = [
        k
        for k in range(1, len(text) + 1)
        if any(len(s) > k and s.startswith(text[-k:]) for s in stops)
    ]
    return max(lengths, default=0)


def test_matcher_against_brute_force():
    rng = random.Random(1)
    for _ in range(2000):
        stops = ["".join(rng.choices("ab", k=rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choices("abc", k=rng.randint(0, 16)))
        matcher = StopStringMatcher(stops)
        released, stop, fed = "", None, ""
        while text[len(fed) :] and stop is None:
            piece = text[len(fed) : len(fed) + rng.randint(1, 4)]
            fed += piece
            out, stop = matcher.feed(piece)
            released += out
            if stop is None:
                # released + held == all text so far; the held part is the longest suffix
                # that may still become a stop string
                assert released + matcher.pending == fed
                assert not any(s in released for s in stops)
                assert len(matcher.pending) == longest_partial_stop(fed, stops)
        if stop is None:
            released += matcher.flush()
        assert (released, stop) == reference_stop(text, stops)


def test_no_stops_releases_everything():
    matcher = StopStringMatcher([])
    assert matcher.feed("abc") == ("abc", None)
    assert matcher.flush() == ""
