"""The special token ids Whisper decoding needs, read from a model directory (host side).

Whisper's vocabulary ends with its control tokens, in this order:

    text tokens..., <|endoftext|>, <|startoftranscript|>, <|en|> ... (one per language),
    <|translate|>, <|transcribe|>, <|startoflm|>, <|startofprev|>,
    <|nospeech|> (older vocabularies: <|nocaptions|>), <|notimestamps|>,
    <|0.00|> <|0.02|> ... <|30.00|>  (timestamps, one per 20 ms)

tokenizer.json names the control tokens (the timestamps are only in vocabulary.txt and the
embedding table, so they are located relative to <|notimestamps|>); config.json holds the
ids CTranslate2's converter chose to suppress. This module only reads; it holds no state.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# OpenAI's rule: the multilingual vocabularies have 51865+ entries, English-only 51864.
_MULTILINGUAL_MIN_VOCAB = 51865
_LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2,3}(?:_[a-z]+)?)\|>$")
_SPACE_TOKEN = "Ġ"  # byte-level BPE's spelling of " "


class WhisperTokensError(ValueError):
    """The model directory lacks a control token Whisper decoding cannot do without."""


@dataclass(frozen=True)
class WhisperTokens:
    """Control-token ids of one Whisper vocabulary.

    timestamp_begin is <|0.00|>; timestamp_end the last timestamp (vocab_size - 1).
    suppress_ids: suppressed at every step (config.json's ``suppress_ids``).
    suppress_ids_begin: suppressed at the first sampled step only (the space and <|endoftext|>).
    languages: ISO code -> language token id, in vocabulary order.
    """

    vocab_size: int
    eot: int
    sot: int
    sot_prev: int
    sot_lm: int
    translate: int
    transcribe: int
    no_speech: int
    no_timestamps: int
    timestamp_begin: int
    timestamp_end: int
    space: int
    languages: Mapping[str, int]
    suppress_ids: tuple[int, ...]
    suppress_ids_begin: tuple[int, ...]

    @property
    def is_multilingual(self) -> bool:
        return self.vocab_size >= _MULTILINGUAL_MIN_VOCAB

    def language_token(self, code: str) -> int:
        try:
            return self.languages[code]
        except KeyError:
            raise WhisperTokensError(f"unknown language {code!r}") from None

    def sot_sequence(self, language: str | None, task: str, timestamps: bool) -> list[int]:
        """The tokens that start a window: <|sot|> [<|lang|> <|task|>] [<|notimestamps|>].

        English-only models take no language or task token (they only transcribe English).
        """
        sequence = [self.sot]
        if self.is_multilingual:
            if task not in ("transcribe", "translate"):
                raise WhisperTokensError(f"unknown task {task!r}")
            sequence.append(self.language_token(language or "en"))
            sequence.append(self.transcribe if task == "transcribe" else self.translate)
        if not timestamps:
            sequence.append(self.no_timestamps)
        return sequence

    def is_timestamp(self, token: int) -> bool:
        return token >= self.timestamp_begin


def load_whisper_tokens(model_dir: str | Path, vocab_size: int) -> WhisperTokens:
    """Read tokenizer.json and config.json of a CTranslate2 Whisper directory.

    vocab_size: rows of the model's embedding table (the timestamps end there).
    """
    model_dir = Path(model_dir)
    tokenizer = _read_json(model_dir / "tokenizer.json")
    config = _read_json(model_dir / "config.json") if (model_dir / "config.json").is_file() else {}
    by_name = {t["content"]: int(t["id"]) for t in tokenizer.get("added_tokens", [])}
    vocab = tokenizer.get("model", {}).get("vocab", {})

    def required(*names: str) -> int:
        for name in names:
            if name in by_name:
                return by_name[name]
        raise WhisperTokensError(f"{model_dir}: tokenizer.json lacks {' or '.join(names)}")

    sot = required("<|startoftranscript|>")
    translate = required("<|translate|>")
    languages = {}
    for name, token_id in sorted(by_name.items(), key=lambda item: item[1]):
        match = _LANGUAGE_TOKEN.match(name)
        if match and sot < token_id < translate:
            languages[match.group(1)] = token_id
    no_timestamps = required("<|notimestamps|>")
    if no_timestamps + 1 >= vocab_size:
        raise WhisperTokensError(f"{model_dir}: no timestamp tokens after <|notimestamps|>")
    eot = required("<|endoftext|>")
    space = int(vocab.get(_SPACE_TOKEN, 220))
    return WhisperTokens(
        vocab_size=vocab_size,
        eot=eot,
        sot=sot,
        sot_prev=required("<|startofprev|>"),
        sot_lm=required("<|startoflm|>"),
        translate=translate,
        transcribe=required("<|transcribe|>"),
        no_speech=required("<|nospeech|>", "<|nocaptions|>"),
        no_timestamps=no_timestamps,
        timestamp_begin=no_timestamps + 1,
        timestamp_end=vocab_size - 1,
        space=space,
        languages=languages,
        suppress_ids=tuple(int(i) for i in config.get("suppress_ids", ())),
        suppress_ids_begin=tuple(int(i) for i in config.get("suppress_ids_begin", (space, eot))),
    )


@functools.cache
def _byte_of_char() -> dict[str, int]:
    """Byte-level BPE (GPT-2's, Whisper's) spells each byte as one printable character:
    the printable Latin-1 bytes as themselves, the others as U+0100 onwards, in order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(0x100 + n)
    return {c: b for b, c in chars.items()}


def token_bytes(spelling: str) -> bytes:
    """A byte-level vocabulary entry ("Ġhello") as the bytes it stands for (b" hello")."""
    byte_of = _byte_of_char()
    return bytes(byte_of[c] for c in spelling)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WhisperTokensError(f"{path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WhisperTokensError(f"{path}: not valid JSON ({exc})") from exc
