"""An ``Embed`` call's inputs as token id lists: validation, tokenization, truncation.

Texts are tokenized the way ``transformers`` does by default (``add_special_tokens``):
the tokenizer's post-processor adds what the model puts around a sequence (BOS for
Llama-style GGUFs, the trailing ``<|endoftext|>`` of Qwen3-Embedding). Truncation cuts the
text's own tokens and keeps those special tokens, as a transformers tokenizer called with
``truncation=True, max_length=...`` does, so last-token pooling still reads the token the
model was trained to pool. Token id inputs are used as given and cut at the end.

Pure functions of their arguments; the servicer calls them on a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.pooling.requests import MAX_EMBED_INPUTS


@dataclass(frozen=True)
class EmbedInput:
    """One input ready for the engine: ``ids``, and whether it was cut to fit."""

    ids: list[int]
    truncated: bool = False


def prepare_texts(
    texts: list[str], tokenizer, max_tokens: int, *, truncate: bool
) -> list[EmbedInput]:
    """Tokenize ``texts`` (with special tokens); raises :class:`InvalidRequestError`."""
    _check_count(len(texts))
    for i, text in enumerate(texts):
        if not text:
            raise InvalidRequestError(f"input[{i}] is an empty string", "input")
    if tokenizer is None:
        raise InvalidRequestError("this model has no tokenizer: send token ids", "input")
    backend = tokenizer.backend
    encodings = backend.encode_batch(texts, add_special_tokens=True)
    out = []
    for i, enc in enumerate(encodings):
        if len(enc.ids) <= max_tokens:
            out.append(EmbedInput(enc.ids))
            continue
        if not truncate:
            raise _too_long(i, len(enc.ids), max_tokens)
        plain = backend.encode(texts[i], add_special_tokens=False)
        keep = max_tokens - backend.num_special_tokens_to_add(False)
        if keep < 1:
            raise _too_long(i, len(enc.ids), max_tokens)
        plain.truncate(keep)
        out.append(EmbedInput(backend.post_process(plain).ids, truncated=True))
    return out


def prepare_token_ids(
    inputs: list[list[int]], vocab_size: int, max_tokens: int, *, truncate: bool
) -> list[EmbedInput]:
    """Check token id inputs and cut over-long ones when asked; raises
    :class:`InvalidRequestError`."""
    _check_count(len(inputs))
    out = []
    for i, ids in enumerate(inputs):
        if not ids:
            raise InvalidRequestError(f"input[{i}] is an empty token list", "input")
        if any(t >= vocab_size for t in ids):
            raise InvalidRequestError(
                f"input[{i}]: token ids must be below the vocabulary size {vocab_size}", "input"
            )
        if len(ids) <= max_tokens:
            out.append(EmbedInput(list(ids)))
        elif truncate:
            out.append(EmbedInput(list(ids[:max_tokens]), truncated=True))
        else:
            raise _too_long(i, len(ids), max_tokens)
    return out


def _check_count(n: int) -> None:
    if not 1 <= n <= MAX_EMBED_INPUTS:
        raise InvalidRequestError(
            f"send between 1 and {MAX_EMBED_INPUTS} inputs per request (got {n})", "input"
        )


def _too_long(index: int, n: int, limit: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"input[{index}] has {n} tokens, more than this model's maximum of {limit}; shorten "
        "it or send truncate: true",
        "input",
    )
