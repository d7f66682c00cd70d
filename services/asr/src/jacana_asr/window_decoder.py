"""Decoding one 30 s window: prompt + encoder output -> tokens, log-probability, no-speech.

Owns the decoding policy (greedy or seeded temperature sampling) and Whisper's logit rules,
applied in the order CTranslate2's Whisper ``generate`` applies them, so that greedy output
is token-identical to it on the same weights:

1. no-speech probability: softmax of the *raw* logits at <|startoftranscript|>'s position;
2. suppress ``suppress_ids`` at every step;
3. suppress blank (space, <|endoftext|>) at the first sampled step;
4. timestamp rules (unless the prompt ends in <|notimestamps|>): never <|notimestamps|>;
   the first token is a timestamp no later than ``max_initial_timestamp_index``; timestamps
   come in pairs (after a lone timestamp: text is not allowed, only <|endoftext|> or a
   timestamp not earlier than it; after a pair: no timestamp); timestamps never decrease; and
   if the total probability of the timestamps beats every single text token, a timestamp is
   forced.

State (the decoder cache) lives for one call, on the model's device; the rules work on one
[vocab] row of float32 logits at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from jacana_asr.whisper_model import WhisperModel
from jacana_asr.whisper_tokens import WhisperTokens

DEFAULT_MAX_LENGTH = 448  # prompt + generated tokens, as faster-whisper asks CTranslate2


@dataclass(frozen=True)
class WindowOptions:
    """How to decode one window.

    max_length: budget of prompt + generated tokens. As in CTranslate2, at most
      min(max_length // 2, max_length - (prompt tokens before the last one)) tokens are
      sampled, <|endoftext|> included.
    temperature: 0 picks the most likely token; > 0 samples from softmax(logits / T).
    seed: seeds the sampler (ignored when greedy); None draws from torch's global RNG.
    suppress_tokens: ids banned at every step; None uses the model config's suppress_ids.
    suppress_blank: ban the space and <|endoftext|> as the first sampled token.
    max_initial_timestamp_index: the first timestamp is at most this many 20 ms steps.
    """

    max_length: int = DEFAULT_MAX_LENGTH
    temperature: float = 0.0
    seed: int | None = None
    suppress_tokens: tuple[int, ...] | None = None
    suppress_blank: bool = True
    max_initial_timestamp_index: int = 50

    def __post_init__(self) -> None:
        if self.max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {self.max_length}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_initial_timestamp_index < 0:
            raise ValueError("max_initial_timestamp_index must be >= 0")


@dataclass(frozen=True)
class WindowResult:
    """What one window decoded to.

    tokens: the sampled tokens, <|endoftext|> excluded.
    sum_logprob: log-probabilities (after the logit rules) of every sampled token, the final
      <|endoftext|> included. avg_logprob: sum_logprob / (len(tokens) + 1), faster-whisper's
      measure (CTranslate2's ``score`` is sum_logprob / len(tokens)).
    no_speech_prob: probability of <|nospeech|> at the <|startoftranscript|> position.
    """

    tokens: tuple[int, ...]
    sum_logprob: float
    avg_logprob: float
    no_speech_prob: float
    temperature: float


class LogitRule(Protocol):
    """Bans tokens for the next step by setting their logits to -inf, in place."""

    def apply(self, step: int, logits: torch.Tensor, generated: Sequence[int]) -> None:
        """step: index of the token being chosen (0 = first); logits: [vocab] float32."""
        ...


@dataclass(frozen=True)
class SuppressTokens:
    ids: tuple[int, ...]

    def apply(self, step: int, logits: torch.Tensor, generated: Sequence[int]) -> None:
        if self.ids:
            logits[list(self.ids)] = float("-inf")


@dataclass(frozen=True)
class SuppressAtBegin:
    ids: tuple[int, ...]

    def apply(self, step: int, logits: torch.Tensor, generated: Sequence[int]) -> None:
        if step == 0 and self.ids:
            logits[list(self.ids)] = float("-inf")


@dataclass(frozen=True)
class TimestampRules:
    """Whisper's timestamp grammar (see the module docstring); ids from WhisperTokens."""

    eot: int
    no_timestamps: int
    timestamp_begin: int
    timestamp_end: int
    max_initial_timestamp: int  # an id, not an index

    def apply(self, step: int, logits: torch.Tensor, generated: Sequence[int]) -> None:
        logits[self.no_timestamps] = float("-inf")
        check_probability = False
        if step == 0:
            logits[: self.timestamp_begin] = float("-inf")
            logits[self.max_initial_timestamp + 1 : self.timestamp_end + 1] = float("-inf")
        else:
            last = generated[-1]
            if last >= self.timestamp_begin:
                penultimate = generated[-2] if step > 1 else last
                if penultimate >= self.timestamp_begin:  # a closed pair: text must follow
                    logits[self.timestamp_begin : self.timestamp_end + 1] = float("-inf")
                else:  # an open timestamp: close it (or end)
                    logits[: self.eot] = float("-inf")
                    logits[self.timestamp_begin : last] = float("-inf")
                    check_probability = True
            else:
                check_probability = True
                previous = next((t for t in reversed(generated) if t >= self.timestamp_begin), None)
                if previous is not None:  # timestamps must not go backwards
                    logits[self.timestamp_begin : previous + 1] = float("-inf")
        if check_probability:
            log_probs = logits.log_softmax(dim=-1)
            timestamp_mass = log_probs[self.timestamp_begin : self.timestamp_end + 1].logsumexp(0)
            if timestamp_mass > log_probs[: self.timestamp_begin].max():
                logits[: self.timestamp_begin] = float("-inf")


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


@torch.inference_mode()
def decode_window(
    model: WhisperModel,
    audio: torch.Tensor,
    prompt: Sequence[int],
    tokens: WhisperTokens,
    options: WindowOptions = WindowOptions(),
) -> WindowResult:
    """Decode one window.

    audio: encoder output [1, n_audio_ctx, d_model] (or [n_audio_ctx, d_model]).
    prompt: [<|startofprev|> previous text...] <|sot|> [<|lang|> <|task|>] [<|notimestamps|>].
    """
    if audio.dim() == 2:
        audio = audio[None]
    if audio.dim() != 3 or audio.shape[0] != 1:
        raise ValueError(f"expected audio [1, n_audio_ctx, d_model], got {tuple(audio.shape)}")
    sot_index, prompt_end = split_prompt(prompt, tokens)
    n_context = prompt_end - 1  # tokens fed before the first decoding step
    max_new = min(options.max_length // 2, options.max_length - n_context)
    if max_new <= 0:
        raise ValueError(f"a prompt of {len(prompt)} tokens leaves no room in max_length")
    timestamps = prompt[-1] != tokens.no_timestamps
    rules = logit_rules(tokens, options, timestamps)
    generator = _generator(options, model.device)

    cache = model.new_cache(audio)
    no_speech_prob = None
    if n_context > 0:
        context = torch.tensor([list(prompt[:n_context])], dtype=torch.long)
        context_logits = model.decode(context, cache)  # [1, n_context, vocab]
        if sot_index < n_context:
            no_speech_prob = _no_speech(context_logits[0, sot_index], tokens)

    generated: list[int] = []
    sum_logprob = 0.0
    next_input = prompt[-1]
    for step in range(max_new):
        logits = model.decode(torch.tensor([[next_input]]), cache)[0, -1].clone()  # [vocab]
        if no_speech_prob is None:  # <|sot|> was the last prompt token: this is its position
            no_speech_prob = _no_speech(logits, tokens)
        for rule in rules:
            rule.apply(step, logits, generated)
        log_probs = logits.log_softmax(dim=-1)
        token = _pick(log_probs, options.temperature, generator)
        sum_logprob += float(log_probs[token])
        if token == tokens.eot:
            break
        generated.append(token)
        next_input = token

    return WindowResult(
        tokens=tuple(generated),
        sum_logprob=sum_logprob,
        avg_logprob=sum_logprob / (len(generated) + 1),
        no_speech_prob=float(no_speech_prob),
        temperature=options.temperature,
    )


def _no_speech(logits: torch.Tensor, tokens: WhisperTokens) -> float:
    return float(logits.softmax(dim=-1)[tokens.no_speech])


def _generator(options: WindowOptions, device: torch.device) -> torch.Generator | None:
    if options.temperature == 0.0 or options.seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(options.seed)
    return generator


def _pick(log_probs: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    # log_probs: [vocab]
    if temperature == 0.0:
        return int(log_probs.argmax())
    probs = (log_probs / temperature).softmax(dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
