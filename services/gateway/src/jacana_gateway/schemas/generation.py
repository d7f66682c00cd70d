"""Request bodies of the generation routes, as pydantic models: what /v1/chat/completions
and /v1/completions share (:class:`GenerationRequest`) and the completions body
(:class:`CompletionRequest`); the chat body is :mod:`jacana_gateway.schemas.chat`'s.

These models only check shapes, types and ranges; FastAPI turns their failures into 400s
whose ``param`` is the field path (see :mod:`jacana_gateway.errors`). Whether a
well-formed request asks for something Jacana does not do yet is decided afterwards by
:mod:`jacana_gateway.translate.unsupported`, and limits that depend on settings by
:mod:`jacana_gateway.translate.generation_request`.

Decisions:
- Scalars are strict: ``"temperature": "0.7"`` or ``true`` is a type error, not coerced.
  Integers are accepted where a number is expected. NaN and infinities are rejected.
- Unknown top-level fields are rejected ("Unrecognized request argument supplied"), so a
  typo never silently changes nothing. Known OpenAI fields that are harmless here
  (``user``, ``metadata``, ``store``, ``service_tier``, ``prompt_cache_key``,
  ``safety_identifier``, ``parallel_tool_calls``) are accepted and ignored.
- vLLM-style sampling extensions that the engine implements are accepted: ``top_k``
  (0 or -1 disables), ``min_p``, ``stop_token_ids``, ``ignore_eos`` and, for chat,
  ``add_generation_prompt``, ``repetition_penalty`` (HF semantics, in (0, 10]) and
  ``min_tokens``. So are the scheduling extensions ``priority`` (int32, lower
  is served first), ``cache_salt`` (prefix-cache namespace) and ``disable_speculation``
  (this request never drafts under speculative decoding).
- ``logit_bias`` keys are token ids as decimal strings (at most ``MAX_LOGIT_BIAS``
  entries), values in [-100, 100]; whether an id is in the vocabulary is the engine's
  call. Logprobs: chat ``top_logprobs`` and completions ``logprobs`` go up to 20.
- ``max_tokens`` on completions, unset or null, means OpenAI's default of 16
  (:data:`COMPLETION_MAX_TOKENS`, applied with the server's limit by
  :mod:`jacana_gateway.translate.generation_request`): a null never asks for more.
- A string (or object key) anywhere in the body holding an unpaired UTF-16 surrogate
  (a lone ``\\ud800`` escape) is a 400 naming its field (:mod:`.unicode`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic import StrictBool as Bool
from pydantic import StrictFloat as Float
from pydantic import StrictInt as Int
from pydantic import StrictStr as Str

from jacana_gateway.schemas.unicode import reject_lone_surrogates

MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1024
MAX_LOGPROBS = 20
UINT32_MAX = 2**32 - 1
MAX_CACHE_SALT_CHARS = 1024
# OpenAI's default max_tokens for /v1/completions, for an unset or null one alike.
COMPLETION_MAX_TOKENS = 16

STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)

_STOP_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP_SEQUENCES},
        {"type": "null"},
    ],
    "description": "Sequences where generation stops; the text never contains them.",
}
_PROMPT_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
        {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        {
            "type": "array",
            "items": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "minItems": 1,
            "maxItems": 1,
        },
    ],
    "description": "Text, or token ids. Batches (several prompts) are not supported yet.",
}

TokenId = Annotated[Int, Field(ge=0, le=UINT32_MAX)]


def _check_logit_bias(value: dict[str, float] | None) -> dict[str, float] | None:
    if value is None:
        return None
    if len(value) > MAX_LOGIT_BIAS:
        raise ValueError(f"at most {MAX_LOGIT_BIAS} token ids can be biased")
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit() and int(key) <= UINT32_MAX):
            raise ValueError(f"keys must be token ids (decimal integers), got {key!r}")
        if not -100.0 <= bias <= 100.0:
            raise ValueError(f"bias values must be in [-100, 100], got {bias} for {key}")
    return value


def _check_stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ValueError("must be a string or an array of strings")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
    if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise ValueError(f"stop sequences must have 1 to {MAX_STOP_CHARS} characters")
    return stops


class StreamOptions(BaseModel):
    """``stream_options``: only meaningful with ``stream: true``."""

    model_config = STRICT

    include_usage: Bool | None = Field(
        False, description="Send one last chunk with empty choices and the usage (null: no)."
    )
    include_obfuscation: Bool | None = Field(None, description="Accepted and ignored.")


class GenerationRequest(BaseModel):
    """What both endpoints accept: model, sampling, stopping, streaming, ignored extras."""

    model_config = STRICT

    _text_only = model_validator(mode="before")(reject_lone_surrogates)

    model: Str = Field(..., min_length=1, description="A model id from /v1/models.")
    stream: Bool | None = Field(False, description="Stream server-sent events (null: no).")
    stream_options: StreamOptions | None = None
    temperature: Annotated[Float, Field(ge=0.0, le=2.0)] | None = Field(
        None, description="0 is greedy. Default 1."
    )
    top_p: Annotated[Float, Field(gt=0.0, le=1.0)] | None = Field(
        None, description="Nucleus mass in (0, 1]. Default 1."
    )
    top_k: Annotated[Int, Field(ge=-1, le=UINT32_MAX)] | None = Field(
        None, description="Keep the k most likely tokens; 0 or -1 disables."
    )
    min_p: Annotated[Float, Field(ge=0.0, le=1.0)] | None = Field(
        None, description="Drop tokens below min_p times the top probability."
    )
    seed: Annotated[Int, Field(ge=-(2**63), le=2**64 - 1)] | None = Field(
        None, description="Same seed, same tokens, whatever else the engine is running."
    )
    max_tokens: Annotated[Int, Field(ge=1)] | None = Field(
        None, description="Most tokens to generate."
    )
    stop: Annotated[Any, WithJsonSchema(_STOP_SCHEMA)] = None
    stop_token_ids: list[TokenId] | None = Field(
        None, max_length=MAX_STOP_TOKEN_IDS, description="Token ids that end generation."
    )
    ignore_eos: Bool = Field(False, description="Keep generating past end-of-sequence.")
    priority: Annotated[Int, Field(ge=-(2**31), le=2**31 - 1)] | None = Field(
        None,
        description="Scheduling priority: lower values are served first; equal ones in "
        "arrival order. Waiting raises it, so no request starves. Default 0.",
    )
    cache_salt: Annotated[Str, Field(min_length=1, max_length=MAX_CACHE_SALT_CHARS)] | None = Field(
        None,
        description="Prefix-cache namespace: cached prompt blocks are shared only with "
        "requests that send the same salt.",
    )
    disable_speculation: Bool = Field(
        False,
        description="Opt out of speculative decoding: same output, steadier per-token "
        "latency, no speed-up.",
    )
    n: Annotated[Int, Field(ge=1, le=128)] | None = Field(
        None, description="Choices per prompt (each with its own index). Default 1."
    )
    presence_penalty: Annotated[Float, Field(ge=-2.0, le=2.0)] | None = Field(
        None, description="Subtracted once from the logit of every token already generated."
    )
    frequency_penalty: Annotated[Float, Field(ge=-2.0, le=2.0)] | None = Field(
        None, description="Subtracted from a token's logit once per time it was generated."
    )
    repetition_penalty: Annotated[Float, Field(gt=0.0, le=10.0)] | None = Field(
        None, description="HF repetition penalty over prompt and output tokens; 1 is off."
    )
    logit_bias: dict[str, Float] | None = Field(
        None, description="Token id (as a string) -> bias in [-100, 100] added to its logit."
    )
    min_tokens: Annotated[Int, Field(ge=0, le=UINT32_MAX)] | None = Field(
        None, description="End-of-sequence and stop token ids cannot end the output earlier."
    )
    guided_json: dict[str, Any] | None = Field(
        None, description="Structured output (vLLM's name): a JSON schema the output obeys."
    )
    guided_regex: Annotated[Str, Field(min_length=1)] | None = Field(
        None, description="Structured output: a regular expression the whole output matches."
    )
    guided_grammar: Annotated[Str, Field(min_length=1)] | None = Field(
        None, description="Structured output: a Lark grammar (llguidance's dialect)."
    )
    guided_choice: list[Annotated[Str, Field(min_length=1)]] | None = Field(
        None, min_length=1, description="Structured output: the output is one of these."
    )
    user: Str | None = Field(None, description="Accepted and ignored.")
    metadata: dict[str, Any] | None = Field(None, description="Accepted and ignored.")
    store: Bool | None = Field(None, description="Accepted and ignored.")
    service_tier: Str | None = Field(None, description="Accepted and ignored.")
    prompt_cache_key: Str | None = Field(None, description="Accepted and ignored.")
    safety_identifier: Str | None = Field(None, description="Accepted and ignored.")

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: Any) -> list[str]:
        return _check_stop(value)

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        return _check_logit_bias(value)


class CompletionRequest(GenerationRequest):
    """Body of POST /v1/completions."""

    prompt: Annotated[Any, WithJsonSchema(_PROMPT_SCHEMA)] = Field(...)
    max_tokens: Annotated[Int, Field(ge=1)] | None = Field(
        None,
        description="Most tokens to generate. Unset or null: OpenAI's default for "
        "completions, 16 (or the server's limit when that is lower).",
    )
    echo: Bool | None = Field(None, description="Prepend the prompt to each choice's text.")
    best_of: Annotated[Int, Field(ge=1, le=128)] | None = Field(
        None,
        description="Run this many choices and answer the n with the highest mean token "
        "logprob (not with stream).",
    )
    logprobs: Annotated[Int, Field(ge=0, le=MAX_LOGPROBS)] | None = Field(
        None,
        description="Each token's logprob and this many alternatives (with echo: the "
        "prompt's too).",
    )
    suffix: Str | None = Field(None, description="Only empty is supported yet.")

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, prompt: Any) -> str | list[int]:
        """A string, or a list of token ids; one-element batches are unwrapped."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt
        if not isinstance(prompt, list) or not prompt:
            raise ValueError("must be a string, or a non-empty array of token ids")
        if all(isinstance(p, str | list) for p in prompt):
            raise ValueError("batched prompts (several prompts) are not supported yet")
        if not all(type(t) is int and 0 <= t <= UINT32_MAX for t in prompt):
            raise ValueError("token ids must be integers in [0, 2^32)")
        return prompt

    def prompt_chars(self) -> int:
        return len(self.prompt)
