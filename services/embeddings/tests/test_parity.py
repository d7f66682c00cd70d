"""Our vectors against sentence-transformers on the same all-MiniLM-L6-v2 weights."""

from __future__ import annotations

import numpy as np

# Varied on purpose: lengths from one token to past the 256-token limit, casing,
# accents, CJK, emoji, code, numbers, whitespace, punctuation-only, repeated words.
TEXTS = [
    "Hello world",
    "hello world",
    "HELLO WORLD!!!",
    "a",
    "?",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\nmixed",
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "Café crème brûlée à la française, s'il vous plaît.",
    "Ünïcödé façade naïve coöperate résumé",
    "Straße, Größe, Fußgängerübergänge",
    "東京は日本の首都です。",
    "北京欢迎你",
    "서울은 한국의 수도입니다.",
    "Москва — столица России.",
    "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "القاهرة هي عاصمة مصر",
    "Emoji test 🙂🚀🔥 with words",
    "🙂",
    "def add(a, b):\n    return a + b  # simple function",
    "SELECT name, count(*) FROM users WHERE age > 30 GROUP BY name;",
    '{"key": "value", "list": [1, 2, 3], "nested": {"x": null}}',
    "https://example.com/path?query=1&other=two#fragment",
    "user@example.com wrote on 2024-03-15 at 10:45:00 UTC",
    "3.14159 2.71828 1.41421 1.73205",
    "1234567890",
    "The year 1969 saw the first humans on the Moon.",
    "!!! ??? ... ;;; ---",
    "don't can't won't shouldn't y'all'd've",
    "e.g. i.e. etc. vs. Mr. Mrs. Dr.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "How do I bake sourdough bread at home?",
    "Machine learning models map text to dense vectors.",
    "Embeddings capture semantic similarity between sentences.",
    "The stock market fell sharply on Tuesday amid inflation fears.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "word " * 50,
    "repeat repeat repeat repeat repeat repeat repeat repeat",
    " ".join(f"token{i}" for i in range(120)),
    ("This is a long paragraph about nothing in particular. " * 12).strip(),
    "lorem ipsum dolor sit amet " * 80,  # far beyond 256 tokens: truncated
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "[CLS] [SEP] [PAD] [MASK] special-looking strings",
    "zero\u200bwidth\u00a0nbsp and\u3000ideographic space",
    "Mixed 中文 and English in 一句话 sentence",
]


def _ours(embedder, texts: list[str]) -> np.ndarray:
    encoded = embedder.tokenize(texts, truncate=True)
    return embedder.embed([ids for ids, _ in encoded])


def test_at_least_fifty_varied_inputs():
    assert len(set(TEXTS)) >= 50


def test_vectors_match_sentence_transformers(embedder, reference):
    ours = _ours(embedder, TEXTS)
    ref = reference.encode(TEXTS, batch_size=16, convert_to_numpy=True)
    assert ours.shape == ref.shape == (len(TEXTS), 384)
    cosine = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    worst = int(cosine.argmin())
    assert cosine.min() >= 0.99999, (TEXTS[worst], cosine[worst])
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(ours, ref, atol=1e-5)


def test_token_ids_match_reference_tokenizer(embedder, reference):
    tok = reference.tokenizer
    for text in TEXTS:
        expected = tok(text, truncation=True, max_length=reference.max_seq_length)["input_ids"]
        ((ids, truncated),) = embedder.tokenize([text], truncate=True)
        assert ids == expected, text
        assert truncated == (len(tok(text)["input_ids"]) > 256)


def test_vector_does_not_depend_on_batch_company(embedder):
    """Padding next to longer inputs must not change an input's vector."""
    alone = _ours(embedder, ["A man is eating food."])
    mixed = _ours(embedder, ["lorem ipsum " * 100, "A man is eating food.", "x"])
    np.testing.assert_allclose(alone[0], mixed[1], atol=1e-5)


def test_similar_sentences_score_higher(embedder):
    v = _ours(
        embedder,
        [
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "A monkey is playing drums.",
        ],
    )
    assert v[0] @ v[1] > v[0] @ v[2] + 0.3
