"""Engine logprobs as proto messages: token ids become the bytes each token stands for.

Clients (the gateway) have no tokenizer, so every token in a logprob message carries its
bytes: for byte-level BPE the exact bytes (a token may hold part of a UTF-8 character);
for other tokenizers ``<0xNN>`` byte tokens map to their byte, ``▁`` to a space, and
anything else to the UTF-8 of its decoded text. Special tokens are spelled out.

State: :class:`TokenBytes` memoizes per token id (host, one per servicer).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from jacana_common.pb.jacana.engine.v1 import engine_pb2
from jacana_engine.core.outputs import TokenLogprob
from jacana_engine.text.tokenizer import Tokenizer

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_METASPACE = "\u2581"


class TokenBytes:
    """``token_bytes[id] -> bytes``; empty bytes without a tokenizer or past the vocabulary."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self._tokenizer = tokenizer
        self._table = tokenizer.token_bytes if tokenizer is not None else None
        self._memo: dict[int, bytes] = {}

    def __getitem__(self, token_id: int) -> bytes:
        if self._table is not None:
            return self._table[token_id] if 0 <= token_id < len(self._table) else b""
        found = self._memo.get(token_id)
        if found is None:
            found = self._memo[token_id] = self._spell(token_id)
        return found

    def _spell(self, token_id: int) -> bytes:
        if self._tokenizer is None:
            return b""
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:
            return b""
        byte = _BYTE_TOKEN.fullmatch(piece)
        if byte is not None:
            return bytes([int(byte.group(1), 16)])
        if _METASPACE in piece:
            return piece.replace(_METASPACE, " ").encode("utf-8")
        return self._tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")


def to_pb(entries: Iterable[TokenLogprob], token_bytes: TokenBytes) -> list:
    """Engine :class:`TokenLogprob` entries -> ``engine_pb2.TokenLogprob`` messages."""
    messages = []
    for entry in entries:
        message = engine_pb2.TokenLogprob(
            token_id=entry.token_id,
            token=token_bytes[entry.token_id],
            top_logprobs=[
                engine_pb2.TopLogprob(token_id=t, token=token_bytes[t], logprob=lp)
                for t, lp in entry.top
            ],
        )
        if entry.logprob is not None:
            message.logprob = entry.logprob
        messages.append(message)
    return messages
