"""Engine logprob messages in the two OpenAI shapes. Pure functions, no I/O.

The engine sends, per token, its id, its bytes and its logprob under the model's raw
distribution, with the most likely alternatives (``pb.TokenLogprob``). From those:

- chat (``choices[].logprobs``): ``{"content": [{token, logprob, bytes, top_logprobs:
  [{token, logprob, bytes}, ...]}, ...]}``; ``top_logprobs`` holds exactly the requested
  number of alternatives, most likely first;
- completions (legacy): ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``,
  where each ``top_logprobs`` item is a ``{token: logprob}`` dict of the alternatives plus
  the chosen token (up to ``logprobs + 1`` keys, as OpenAI documents), and ``null`` for
  the prompt's first token under ``echo`` (nothing predicts it).

Token strings are the token's bytes as UTF-8; bytes that do not form a character on their
own (a token holding part of one) are written as ``\\xNN`` escapes, and ``bytes`` carries
the exact values. ``text_offset`` counts characters of those token strings from the start
of the choice's ``text`` (so it starts at the prompt under ``echo``). A logprob of -inf
is written as -9999.0 (JSON has no infinities).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb

MIN_LOGPROB = -9999.0


def token_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="backslashreplace")


def _finite(logprob: float) -> float:
    return logprob if logprob >= MIN_LOGPROB else MIN_LOGPROB


def chat_content(entries: Iterable[pb.TokenLogprob], top: int) -> list[dict[str, Any]]:
    """``logprobs.content`` items of chat for ``entries``, with ``top`` alternatives each."""
    return [
        {
            "token": token_text(e.token),
            "logprob": _finite(e.logprob),
            "bytes": list(e.token),
            "top_logprobs": [
                {
                    "token": token_text(t.token),
                    "logprob": _finite(t.logprob),
                    "bytes": list(t.token),
                }
                for t in e.top_logprobs[:top]
            ],
        }
        for e in entries
    ]


def completion_logprobs(entries: Sequence[pb.TokenLogprob], offset: int) -> dict[str, Any]:
    """The legacy ``logprobs`` object of ``entries``, their text offsets starting at
    ``offset`` (the characters of the choice's text before them)."""
    tokens, values, tops, offsets = [], [], [], []
    for e in entries:
        text = token_text(e.token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if not e.HasField("logprob"):
            values.append(None)
            tops.append(None)
            continue
        values.append(_finite(e.logprob))
        top = {token_text(t.token): _finite(t.logprob) for t in e.top_logprobs}
        top.setdefault(text, _finite(e.logprob))
        tops.append(top)
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def text_length(entries: Iterable[pb.TokenLogprob]) -> int:
    """Characters the token strings of ``entries`` add to ``text_offset``."""
    return sum(len(token_text(e.token)) for e in entries)


def mean_logprob(entries: Sequence[pb.TokenLogprob]) -> float:
    """Average logprob per generated token, for ``best_of`` ranking; -inf when empty."""
    if not entries:
        return -math.inf
    return sum(e.logprob for e in entries) / len(entries)
