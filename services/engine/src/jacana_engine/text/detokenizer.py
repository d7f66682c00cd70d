"""Incremental detokenization of one request's output, with stop strings.

The engine keeps one ``Detokenizer`` per running request (CPU, plain Python state) and feeds
it each sampled token id. Text comes back only once it is final: complete UTF-8 characters,
never a stop string nor the start of one. The pieces concatenate to
``tokenizer.decode(output_ids)`` cut before the first stop string.

Two strategies behind one interface, picked by what the tokenizer can do:
- ``ByteStreamDecoder``: byte-level BPE, where decoding is byte concatenation. O(1) per token:
  a table lookup and an incremental UTF-8 decoder that holds an unfinished character.
- ``WindowDecoder``: any other tokenizer. Decodes a short window of recent tokens and emits
  the growth, holding back while the window ends in a partial character (U+FFFD).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

from jacana_engine.text.stop_checker import StopStringMatcher
from jacana_engine.text.tokenizer import Tokenizer


class Delta(NamedTuple):
    """Text released by one call, and the stop string that ended the request, if any."""

    text: str
    stop: str | None = None


class IncrementalDecoder(Protocol):
    """Token ids in, finished text out."""

    def push(self, token_id: int) -> str:
        """Append one id; return the text it completes (possibly "")."""
        ...

    def flush(self) -> str:
        """Return whatever is held back; an unfinished character becomes U+FFFD."""
        ...


class ByteStreamDecoder:
    """For tokenizers whose decoding is byte concatenation (``tokenizer.token_bytes``)."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        table = tokenizer.token_bytes
        if table is None:
            raise ValueError("tokenizer does not decode by byte concatenation")
        self._table = table
        self._skip = tokenizer.all_special_ids if skip_special_tokens else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        # Ids past the vocabulary (padded embedding rows) decode to nothing, as in the backend.
        if token_id in self._skip or not 0 <= token_id < len(self._table):
            return ""
        return self._utf8.decode(self._table[token_id])

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class WindowDecoder:
    """For any tokenizer: re-decodes only the tokens since the last released character
    boundary (plus the one window before it, for context-dependent spacing)."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # window start: first id of the last released piece
        self._read = 0  # ids before this are released

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        self._compact()
        return after[len(before) :]

    def flush(self) -> str:
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :]

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special) if ids else ""

    def _compact(self) -> None:
        # Ids before the window are never read again.
        if self._prefix > 64:
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0


def make_incremental_decoder(
    tokenizer: Tokenizer, skip_special_tokens: bool = True
) -> IncrementalDecoder:
    """The fastest exact strategy this tokenizer allows."""
    kind = ByteStreamDecoder if tokenizer.token_bytes is not None else WindowDecoder
    return kind(tokenizer, skip_special_tokens)


class Detokenizer:
    """One request's streaming text: ``push`` each sampled id, ``flush`` when it finishes.

    stop: stop strings; the released text ends right before the first one to complete.
    skip_special_tokens: leave special tokens (e.g. ``<|im_end|>``) out of the text.
    num_tokens: ids consumed so far; after a stop string, later ids are not consumed.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
        decoder: IncrementalDecoder | None = None,
    ) -> None:
        self._decoder = decoder or make_incremental_decoder(tokenizer, skip_special_tokens)
        self._stops = StopStringMatcher(stop)
        self.num_tokens = 0

    @property
    def stopped(self) -> str | None:
        """The stop string that ended the request, or None."""
        return self._stops.matched

    def push(self, token_id: int) -> Delta:
        """Feed one id; return the newly final text and the stop string it completed, if any."""
        if self._stops.matched is not None:
            return Delta("")
        self.num_tokens += 1
        text, stop = self._stops.feed(self._decoder.push(token_id))
        return Delta(text, stop)

    def extend(self, token_ids: Iterable[int]) -> Delta:
        """Feed several ids (e.g. accepted draft tokens); stops consuming at a stop string."""
        pieces = []
        for token_id in token_ids:
            text, stop = self.push(token_id)
            pieces.append(text)
            if stop is not None:
                return Delta("".join(pieces), stop)
        return Delta("".join(pieces))

    def flush(self) -> Delta:
        """Release everything held back (call once, when the request ends without a stop
        string); an unfinished character becomes U+FFFD."""
        if self._stops.matched is not None:
            return Delta("")
        text, stop = self._stops.feed(self._decoder.flush())
        if stop is not None:
            return Delta(text, stop)
        return Delta(text + self._stops.flush())
