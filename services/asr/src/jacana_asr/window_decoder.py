"""Decoding one 30 s window: prompt + encoder output -> tokens, log-probability, no-speech.

Owns the decoding policy of a window, CTranslate2's Whisper ``generate`` step for step, so
that output is token-identical to it on the same weights:

- the search: beam search (temperature 0, beam_size > 1; beam_search.py), greedy
  (temperature 0, beam_size 1) or best-of-n sampling (temperature > 0; sampling.py);
- the no-speech probability: softmax of the *raw* logits at <|startoftranscript|>'s position;
- the logit rules (logit_rules.py), in CTranslate2's order: suppress ``suppress_ids`` at
  every step; suppress blank (space, <|endoftext|>) at the first step; Whisper's timestamp
  grammar unless the prompt ends in <|notimestamps|>.

``WindowDecoding`` is one window in progress, host side (token ids, scores); its decoder
rows live in a ``DecoderBatch`` that whoever drives it owns: ``decode_window`` below for one
window alone, the decode loop of batching.py for many windows at once. Either way the
window's tokens are the same.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from jacana_asr.beam_search import BeamSearch
from jacana_asr.decoder_batch import DecoderBatch
from jacana_asr.logit_rules import (
    LogitRule,
    SuppressAtBegin,
    SuppressTokens,
    TimestampRules,
)
from jacana_asr.sampling import Draws, SamplingSearch
from jacana_asr.whisper_model import WhisperModel
from jacana_asr.whisper_tokens import WhisperTokens

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "LogitRule",
    "SuppressAtBegin",
    "SuppressTokens",
    "TimestampRules",
    "WindowDecoding",
    "WindowOptions",
    "WindowResult",
    "decode_window",
    "logit_rules",
    "split_prompt",
]

DEFAULT_MAX_LENGTH = 448  # prompt + generated tokens, as faster-whisper asks CTranslate2


@dataclass(frozen=True)
class WindowOptions:
    """How to decode one window (CTranslate2's ``generate`` arguments of the same names).

    max_length: budget of prompt + generated tokens. As in CTranslate2, at most
      min(max_length // 2, max_length - (prompt tokens before the last one)) tokens are
      sampled, <|endoftext|> included.
    temperature: 0 searches (greedy or beam); > 0 samples from softmax(log_probs / T).
    beam_size: beams at temperature 0 (1: greedy). patience: the beam search stops once
      round(beam_size * patience) hypotheses have finished.
    best_of: independent samples at temperature > 0; the best-scoring one is kept.
    length_penalty: hypotheses are ranked by summed log-prob / length ** length_penalty.
    seed: seeds the samples when ``decode_window`` is not handed a ``Draws`` stream; None
      draws a fresh seed.
    suppress_tokens: ids banned at every step; None uses the model config's suppress_ids.
    suppress_blank: ban the space and <|endoftext|> as the first sampled token.
    max_initial_timestamp_index: the first timestamp is at most this many 20 ms steps.
    """

    max_length: int = DEFAULT_MAX_LENGTH
    temperature: float = 0.0
    beam_size: int = 1
    patience: float = 1.0
    best_of: int = 1
    length_penalty: float = 1.0
    seed: int | None = None
    suppress_tokens: tuple[int, ...] | None = None
    suppress_blank: bool = True
    max_initial_timestamp_index: int = 50

    def __post_init__(self) -> None:
        if self.max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {self.max_length}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.beam_size < 1 or self.best_of < 1:
            raise ValueError("beam_size and best_of must be >= 1")
        if not self.patience > 0.0:
            raise ValueError(f"patience must be > 0, got {self.patience}")
        if self.max_initial_timestamp_index < 0:
            raise ValueError("max_initial_timestamp_index must be >= 0")


@dataclass(frozen=True)
class WindowResult:
    """What one window decoded to.

    tokens: the chosen hypothesis, <|endoftext|> excluded.
    sum_logprob: log-probabilities (after the logit rules) of its tokens, the final
      <|endoftext|> included. avg_logprob: sum_logprob / (len(tokens) + 1), faster-whisper's
      measure (CTranslate2's ``score`` is sum_logprob / len(tokens) ** length_penalty).
    no_speech_prob: probability of <|nospeech|> at the <|startoftranscript|> position.
    token_logprobs: each token's log-probability (after the logit rules), beside ``tokens``.
    """

    tokens: tuple[int, ...]
    sum_logprob: float
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    token_logprobs: tuple[float, ...] = ()


def logit_rules(tokens: WhisperTokens, options: WindowOptions, timestamps: bool) -> list[LogitRule]:
    """The rules one window applies, in CTranslate2's order."""
    suppress = tokens.suppress_ids if options.suppress_tokens is None else options.suppress_tokens
    rules: list[LogitRule] = [SuppressTokens(tuple(suppress))]
    if options.suppress_blank:
        rules.append(SuppressAtBegin(tokens.suppress_ids_begin))
    if timestamps:
        rules.append(
            TimestampRules(
                eot=tokens.eot,
                no_timestamps=tokens.no_timestamps,
                timestamp_begin=tokens.timestamp_begin,
                timestamp_end=tokens.timestamp_end,
                max_initial_timestamp=tokens.timestamp_begin + options.max_initial_timestamp_index,
            )
        )
    return rules


def split_prompt(prompt: Sequence[int], tokens: WhisperTokens) -> tuple[int, int]:
    """(index of <|sot|>, index just past the sot sequence) of a window prompt.

    The sot sequence is <|sot|> followed by control tokens up to <|notimestamps|> (language,
    task, no-timestamps); it must end the prompt (forced text prefixes are not supported).
    """
    try:
        sot_index = list(prompt).index(tokens.sot)
    except ValueError:
        raise ValueError("the prompt has no <|startoftranscript|> token") from None
    end = sot_index
    while end < len(prompt) and tokens.sot <= prompt[end] <= tokens.no_timestamps:
        end += 1
    if end != len(prompt):
        raise ValueError("the prompt must end with the <|startoftranscript|> sequence")
    return sot_index, end


class WindowDecoding:
    """One window being decoded: what to feed its decoder rows and what they chose.

    Drive it as ``decode_window`` does: add ``rows`` rows fed ``context`` to a DecoderBatch
    (asking for the logits at ``no_speech_at``, handed to ``start``), then step the batch
    with ``inputs()`` and hand each step's logits to ``advance``, whose answer says which
    rows the next step continues, until ``done``.
    """

    def __init__(
        self,
        prompt: Sequence[int],
        tokens: WhisperTokens,
        options: WindowOptions,
        draws: Draws | None = None,
    ) -> None:
        sot_index, prompt_end = split_prompt(prompt, tokens)
        n_context = prompt_end - 1  # tokens fed before the first decoding step
        max_new = min(options.max_length // 2, options.max_length - n_context)
        if max_new <= 0:
            raise ValueError(f"a prompt of {len(prompt)} tokens leaves no room in max_length")
        self.tokens, self.options = tokens, options
        self.context = list(prompt[:n_context])
        self.no_speech_at = sot_index if sot_index < n_context else None
        rules = logit_rules(tokens, options, timestamps=prompt[-1] != tokens.no_timestamps)
        common = dict(rules=rules, eot=tokens.eot, first_input=prompt[-1], max_new=max_new)
        if options.temperature == 0.0 and options.beam_size > 1:
            self.search: BeamSearch | SamplingSearch = BeamSearch(
                **common,
                beam_size=options.beam_size,
                patience=options.patience,
                length_penalty=options.length_penalty,
            )
        else:
            sampled = options.temperature > 0.0
            if sampled and draws is None:
                seed = secrets.randbits(32) if options.seed is None else options.seed
                draws = Draws(seed)
            self.search = SamplingSearch(
                **common,
                temperature=options.temperature,
                rows=options.best_of if sampled else 1,
                length_penalty=options.length_penalty,
                draws=draws,
            )
        self.no_speech_prob: float | None = None
        self._step = 0

    @property
    def rows(self) -> int:
        """Decoder rows the next step runs."""
        return self.search.rows

    @property
    def done(self) -> bool:
        return self.search.done

    def start(self, context_logits: torch.Tensor | None) -> None:
        """context_logits: raw [vocab] logits at ``no_speech_at`` (None when it is None)."""
        if self.no_speech_at is not None:
            self.no_speech_prob = _no_speech(context_logits, self.tokens)

    def inputs(self) -> list[int]:
        return self.search.inputs()

    def advance(self, logits: torch.Tensor) -> list[int]:
        """logits: [rows, vocab] raw. Returns the rows (of this step) the next step's rows
        continue, in order; empty when the window is done."""
        if self.no_speech_prob is None:  # <|sot|> was the last prompt token: this is its row
            self.no_speech_prob = _no_speech(logits[0], self.tokens)
        sources = self.search.advance(self._step, logits)
        self._step += 1
        return sources

    def result(self) -> WindowResult:
        best = self.search.result()
        sum_logprob = float(best.sum_logprob)
        return WindowResult(
            tokens=tuple(best.tokens),
            sum_logprob=sum_logprob,
            avg_logprob=sum_logprob / (len(best.tokens) + 1),
            no_speech_prob=float(self.no_speech_prob),
            temperature=self.options.temperature,
            token_logprobs=tuple(best.logprobs),
        )


@torch.inference_mode()
def decode_window(
    model: WhisperModel,
    audio: torch.Tensor,
    prompt: Sequence[int],
    tokens: WhisperTokens,
    options: WindowOptions = WindowOptions(),
    draws: Draws | None = None,
) -> WindowResult:
    """Decode one window on its own.

    audio: encoder output [1, n_audio_ctx, d_model] (or [n_audio_ctx, d_model]).
    prompt: [<|startofprev|> previous text...] <|sot|> [<|lang|> <|task|>] [<|notimestamps|>].
    draws: the sampling stream (temperature > 0); None seeds one from ``options.seed``.
    """
    if audio.dim() == 2:
        audio = audio[None]
    if audio.dim() != 3 or audio.shape[0] != 1:
        raise ValueError(f"expected audio [1, n_audio_ctx, d_model], got {tuple(audio.shape)}")
    decoding = WindowDecoding(prompt, tokens, options, draws)
    batch = DecoderBatch(model)
    context_logits = batch.add(
        "window", audio, decoding.context, decoding.rows, decoding.no_speech_at
    )
    decoding.start(context_logits)
    while not decoding.done:
        logits = batch.step(decoding.inputs())
        batch.continue_rows("window", decoding.advance(logits))
    return decoding.result()


def _no_speech(logits: torch.Tensor, tokens: WhisperTokens) -> float:
    return float(logits.float().softmax(dim=-1)[tokens.no_speech])
