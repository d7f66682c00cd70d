"""Text <-> token ids for one model, built from a GGUF file or a Hugging Face directory.

Owns the HF ``tokenizers`` backend (the Rust library, not ``transformers``) and the facts the
engine needs around it: BOS, the end-of-generation ids, the special ids and the chat template
source. Everything lives on the CPU; a ``Tokenizer`` is immutable after construction and safe
to share between threads.

Sources are a registry keyed by the kind of path (``_SOURCES``); inside GGUF, builders are a
registry keyed by ``tokenizer.ggml.model`` and pre-tokenizers by ``tokenizer.ggml.pre``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from jacana_engine.loader.gguf_metadata import read_gguf_metadata

# Token types written by llama.cpp's converters (gguf.TokenType).
_CONTROL = 3
_USER_DEFINED = 4

# Tokens that end a turn or a document. GGUF files have no generation_config, so like
# llama.cpp we recognise them by text; HF's generation_config lists the same ones
# (e.g. Qwen2.5-Instruct stops on both <|im_end|> and <|endoftext|>).
_END_OF_GENERATION = frozenset(
    {
        "<|endoftext|>",
        "<|im_end|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|end_of_text|>",
        "<end_of_turn>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<EOT>",
        "<end_of_utterance>",
    }
)
# In the o200k "harmony" vocabulary <|end|> closes a channel, not the reply.
_NOT_END_WHEN_PRESENT = {"<|end|>": "<|return|>"}

_SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


class Tokenizer:
    """One model's tokenizer: ``encode``/``decode`` plus the ids the engine stops on.

    bos_token_id: the BOS id, or None when the vocabulary has none.
    eos_token_ids: every id that ends generation: the declared EOS, the ids a generation
        config lists, and the vocabulary's end-of-turn/end-of-text markers.
    all_special_ids: ids of added tokens marked special (skipped by ``decode`` by default).
    special_tokens: {"bos_token": text, "eos_token": text, ...}, the variables a chat
        template sees.
    chat_template: the model's own Jinja chat template source, or None.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        special_tokens: Mapping[str, str],
        extra_eos_token_ids: Iterable[int] = (),
        chat_template: str | None = None,
    ) -> None:
        self._backend = backend
        self.special_tokens = dict(special_tokens)
        self.chat_template = chat_template
        self.bos_token_id = self._id_of(self.special_tokens.get("bos_token"))
        self.eos_token_id = self._id_of(self.special_tokens.get("eos_token"))
        eos = {*extra_eos_token_ids, *self._end_of_generation_ids()}
        if self.eos_token_id is not None:
            eos.add(self.eos_token_id)
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        added = backend.get_added_tokens_decoder()
        self.all_special_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        self._added_text = {i: t.content for i, t in added.items()}

    @classmethod
    def from_path(cls, path: str | Path) -> Tokenizer:
        """Load from a ``.gguf`` file or an HF directory holding ``tokenizer.json``."""
        path = Path(path)
        for matches, load in _SOURCES:
            if matches(path):
                return load(path)
        raise ValueError(f"{path}: expected a .gguf file or a directory with tokenizer.json")

    # -- text <-> ids -------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special-token texts inside it (e.g. ``<|im_start|>``) map to
        their ids. ``add_special_tokens`` adds what the model adds around a sequence (BOS)."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[list[int]]:
        encodings = self._backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [e.ids for e in encodings]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry (byte-level spelling for BPE), or None when out of range."""
        return self._backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def backend(self) -> Backend:
        """The underlying ``tokenizers.Tokenizer`` (read it, do not mutate it)."""
        return self._backend

    @cached_property
    def token_bytes(self) -> tuple[bytes, ...] | None:
        """Bytes each id decodes to, when decoding is plain byte concatenation (byte-level BPE);
        None otherwise. Lets the detokenizer stream in O(1) per token."""
        if not isinstance(self._backend.decoder, decoders.ByteLevel):
            return None
        to_byte = {c: b for b, c in _byte_alphabet().items()}
        table = []
        for token_id in range(self.vocab_size):
            text = self._added_text.get(token_id)
            if text is not None:
                table.append(text.encode("utf-8"))
                continue
            token = self._backend.id_to_token(token_id) or ""
            try:
                table.append(bytes(to_byte[c] for c in token))
            except KeyError:
                return None
        return tuple(table)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render ``messages`` with the model's template (``text.chat_template``)."""
        return self._compiled_template.render(
            messages, add_generation_prompt=add_generation_prompt, **kwargs
        )

    @cached_property
    def _compiled_template(self):
        from jacana_engine.text.chat_template import ChatTemplate

        return ChatTemplate.from_tokenizer(self)

    # -- helpers -----------------------------------------------------------------------------

    def _id_of(self, text: str | None) -> int | None:
        return None if text is None else self._backend.token_to_id(text)

    def _end_of_generation_ids(self) -> set[int]:
        present = {t for t in _END_OF_GENERATION if self._backend.token_to_id(t) is not None}
        for text, unless in _NOT_END_WHEN_PRESENT.items():
            if unless in present:
                present.discard(text)
        return {self._backend.token_to_id(t) for t in present}


# --------------------------------------------------------------------------------------------
# Hugging Face directory: tokenizer.json + tokenizer_config.json (+ generation_config.json)
# --------------------------------------------------------------------------------------------


def _load_hf_dir(path: Path) -> Tokenizer:
    backend = Backend.from_file(str(path / "tokenizer.json"))
    config = _read_json(path / "tokenizer_config.json")
    generation = _read_json(path / "generation_config.json")
    special = {name: _token_text(config.get(name)) for name in _SPECIAL_TOKEN_NAMES}
    eos = generation.get("eos_token_id")
    extra_eos = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    return Tokenizer(
        backend,
        special_tokens={k: v for k, v in special.items() if v is not None},
        extra_eos_token_ids=extra_eos,
        chat_template=_hf_chat_template(path, config),
    )


def _hf_chat_template(path: Path, config: Mapping[str, Any]) -> str | None:
    """transformers keeps the template in tokenizer_config.json, chat_template.jinja or
    chat_template.json; a list of named templates picks "default"."""
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template") or _read_json(path / "chat_template.json").get(
        "chat_template"
    )
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


# --------------------------------------------------------------------------------------------
# GGUF: the vocabulary, merges and special ids stored as metadata under llama.cpp's keys
# --------------------------------------------------------------------------------------------


def _load_gguf(path: Path) -> Tokenizer:
    meta = read_gguf_metadata(path)
    model = meta.get("tokenizer.ggml.model")
    build = _GGUF_BUILDERS.get(model)
    if build is None:
        raise NotImplementedError(
            f"{path.name}: GGUF tokenizer model {model!r} is not supported "
            f"(supported: {sorted(_GGUF_BUILDERS)}; 'llama' is sentencepiece-style)"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]

    def text_at(key: str) -> str | None:
        token_id = meta.get(key)
        return tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None

    special = {
        "bos_token": text_at("tokenizer.ggml.bos_token_id"),
        "eos_token": text_at("tokenizer.ggml.eos_token_id"),
        "unk_token": text_at("tokenizer.ggml.unknown_token_id"),
        "pad_token": text_at("tokenizer.ggml.padding_token_id"),
    }
    special = {k: v for k, v in special.items() if v is not None}
    extra_eos = [
        meta[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if k in meta
    ]
    backend = build(meta, special)
    return Tokenizer(
        backend,
        special_tokens=special,
        extra_eos_token_ids=extra_eos,
        chat_template=meta.get("tokenizer.chat_template"),
    )


@dataclass(frozen=True)
class _PreTokenizerRecipe:
    """How one ``tokenizer.ggml.pre`` family splits text before BPE (mirrors llama.cpp)."""

    steps: tuple[Callable[[], Any], ...]
    ignore_merges: bool = False  # a piece that is itself a token is not merged up
    add_bos: bool = False  # llama.cpp's default when the file has no add_bos_token key

    def build(self) -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence([step() for step in self.steps])


def _split(pattern: str) -> Callable[[], Any]:
    return lambda: pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)


def _bytes() -> Any:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)


def _bytes_gpt2_regex() -> Any:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits() -> Any:
    return pre_tokenizers.Digits(individual_digits=True)


_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_PRE_TOKENIZERS: dict[str, _PreTokenizerRecipe] = {}


def _register_pre(names: Iterable[str], recipe: _PreTokenizerRecipe) -> None:
    for name in names:
        _PRE_TOKENIZERS[name] = recipe


# llama.cpp's fallback for BPE files that name no pre-tokenizer.
_register_pre(
    ["default"],
    _PreTokenizerRecipe(
        (
            _split(r"[\p{P}\$\+<=>\^~\|]+"),
            _split(_GPT2_SPLIT),
            _split(r"\p{N}+"),
            _split(r"[0-9][0-9][0-9]"),
            _bytes,
        )
    ),
)
_register_pre(["gpt-2", "phi-2", "mpt", "olmo", "jais"], _PreTokenizerRecipe((_bytes_gpt2_regex,)))
# StarCoder-style vocabularies (SmolLM, SmolLM2): every digit on its own, then GPT-2 splits;
# this is the Digits + ByteLevel pre-tokenizer of their tokenizer.json.
_register_pre(
    ["starcoder", "smollm", "refact", "codeshell", "command-r", "exaone"],
    _PreTokenizerRecipe((_digits, _bytes_gpt2_regex)),
)
_register_pre(
    ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"],
    _PreTokenizerRecipe((_split(_LLAMA3_SPLIT), _bytes), ignore_merges=True, add_bos=True),
)
_register_pre(["dbrx", "smaug-bpe"], _PreTokenizerRecipe((_split(_LLAMA3_SPLIT), _bytes)))
_register_pre(
    ["qwen2", "deepseek-r1-qwen", "kormo", "stablelm2", "megrez"],
    _PreTokenizerRecipe((_split(_QWEN2_SPLIT), _bytes)),
)


def _build_byte_level_bpe(meta: Mapping[str, Any], special: Mapping[str, str]) -> Backend:
    """``tokenizer.ggml.model == "gpt2"``: byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM...)."""
    pre = meta.get("tokenizer.ggml.pre", "default")
    recipe = _PRE_TOKENIZERS.get(pre)
    if recipe is None:
        raise NotImplementedError(
            f"GGUF pre-tokenizer {pre!r} is not supported (supported: {sorted(_PRE_TOKENIZERS)})"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    alphabet = frozenset(_byte_alphabet().values())
    vocab: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        spelled = token if set(token) <= alphabet else _byte_spelling(token)
        vocab.setdefault(spelled if spelled not in vocab else token, token_id)
    merges = [_split_merge(m) for m in meta.get("tokenizer.ggml.merges", [])]
    backend = Backend(
        models.BPE(vocab=vocab, merges=merges, ignore_merges=recipe.ignore_merges, fuse_unk=False)
    )
    backend.pre_tokenizer = recipe.build()
    backend.decoder = decoders.ByteLevel()
    # Control tokens match whole and are special; user-defined ones (e.g. <think>) match whole
    # but are ordinary text. A token written outside the byte alphabet cannot be one of them.
    backend.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, types, strict=False)
            if kind == _CONTROL and set(t) <= alphabet
        ]
    )
    backend.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, types, strict=False)
            if kind == _USER_DEFINED and t in vocab
        ]
    )
    backend.post_processor = _bos_eos_processor(
        special,
        vocab,
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", recipe.add_bos)),
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    )
    return backend


def _bos_eos_processor(
    special: Mapping[str, str], vocab: Mapping[str, int], *, add_bos: bool, add_eos: bool
) -> Any:
    around = [(special.get("bos_token"), add_bos), (special.get("eos_token"), add_eos)]
    bos, eos = (t if wanted and t in vocab else None for t, wanted in around)
    single = " ".join(p for p in (bos, "$A", eos) if p)
    pair = " ".join(p for p in (bos, "$A", eos, bos, "$B:1", eos) if p)
    used = {t for t in (bos, eos) if t}
    return processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(t, vocab[t]) for t in used]
    )


def _split_merge(merge: str) -> tuple[str, str]:
    # The first piece is never empty, so the separator is the first space after position 0.
    cut = merge.index(" ", 1)
    return merge[:cut], merge[cut + 1 :]


@cache
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


def _byte_spelling(text: str) -> str:
    alphabet = _byte_alphabet()
    # GGUF strings that are not valid UTF-8 arrive surrogate-escaped; recover their bytes.
    return "".join(alphabet[b] for b in text.encode("utf-8", "surrogateescape"))


_GGUF_BUILDERS: dict[str, Callable[[Mapping[str, Any], Mapping[str, str]], Backend]] = {
    "gpt2": _build_byte_level_bpe,
}

_SOURCES: tuple[tuple[Callable[[Path], bool], Callable[[Path], Tokenizer]], ...] = (
    (lambda p: p.is_file() and p.suffix.lower() == ".gguf", _load_gguf),
    (lambda p: p.is_dir() and (p / "tokenizer.json").is_file(), _load_hf_dir),
)
