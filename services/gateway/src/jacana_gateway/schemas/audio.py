"""The multipart/form-data body of POST /v1/audio/transcriptions and /translations, read
and checked as OpenAI's API defines it.

:func:`read_audio_request` reads the form (the file part spools to disk past 1 MiB, as
Starlette does) and returns an :class:`AudioRequest`, or raises a 400 :class:`ApiError`
naming the field: a missing ``file`` or ``model`` (``missing_required_parameter``), a value
out of range (``invalid_value``), a field OpenAI has that Jacana does not serve
(``unsupported_parameter``), a field neither has (``unknown_parameter``). List fields are
accepted as the SDK sends them (``timestamp_granularities[]``, repeated) and without the
brackets. An empty text field counts as not sent. ``stream=true`` (transcriptions) and
``include[]=logprobs`` need response_format json, as OpenAI's do. Whether the language is
one the model knows, and whether the file holds decodable audio, is the service's to say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastapi import Request
from starlette.datastructures import FormData, UploadFile

from jacana_common.errors import ApiError, invalid_value
from jacana_gateway.errors import missing_parameter, unknown_parameter, unsupported_parameter

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
GRANULARITIES = ("segment", "word")
# The name OpenAI's reference gives the field (a list, sent as repeated ``name[]`` parts).
GRANULARITIES_PARAM = "timestamp_granularities[]"
MAX_PROMPT_CHARS = 10_000  # Whisper conditions on the last 223 tokens of it anyway
MAX_FIELDS = 64

# Per task: the fields served, and the ones OpenAI defines that Jacana refuses.
_COMMON = frozenset({"file", "model", "language", "prompt", "response_format", "temperature"})
# Jacana's extensions: faster-whisper's beam width (1: greedy), the sampling seed, and its
# voice-activity filter (true/false; unset: the service's default for the audio's length).
_COMMON |= {"beam_size", "seed", "vad_filter"}
MAX_BEAM_SIZE = 16
MAX_SEED = 2**32 - 1
_SERVED = {
    "transcribe": _COMMON | {"timestamp_granularities", "stream", "include"},
    # ``language`` (the spoken language, to skip detection) is a Jacana extension here.
    "translate": _COMMON,
}
_NOT_SERVED = {
    "transcribe": frozenset(
        {
            "chunking_strategy",
            "keywords",
            "known_speaker_names",
            "known_speaker_references",
            "languages",
        }
    ),
    "translate": frozenset(),
}
_LISTS = frozenset({"timestamp_granularities", "include", "keywords", "languages"})
_LISTS |= {"known_speaker_names", "known_speaker_references"}


@dataclass(frozen=True)
class AudioRequest:
    """One checked upload. task: "transcribe" or "translate"; language: as sent (the
    service checks it), None when unset; timestamp_granularities: "segment" and/or "word",
    each once, as asked (only with verbose_json)."""

    task: str
    audio: bytes
    filename: str
    model: str
    language: str | None
    prompt: str | None
    response_format: str
    temperature: float
    timestamp_granularities: tuple[str, ...]
    beam_size: int | None = None  # None: the service's default (5)
    seed: int | None = None  # None: a fresh seed per request
    vad_filter: bool | None = None  # None: the service's default
    stream: bool = False  # answer with server-sent events (transcriptions, json only)
    logprobs: bool = False  # include[]=logprobs: token log-probabilities (json only)


def _fields(form: FormData, task: str) -> dict[str, list[str | UploadFile]]:
    """Form items by name (list names without their ``[]``); unknown and refused names
    raise."""
    fields: dict[str, list[str | UploadFile]] = {}
    for key, value in form.multi_items():
        name = key.removesuffix("[]")
        if name in _NOT_SERVED[task]:
            raise unsupported_parameter(
                name, "this parameter is not supported by Jacana's Whisper models"
            )
        if name not in _SERVED[task]:
            raise unknown_parameter(key)
        if isinstance(value, str) and not value and name != "file":
            continue  # an empty text field is an unset one
        fields.setdefault(name, []).append(value)
    for name, values in fields.items():
        if len(values) > 1 and name not in _LISTS:
            raise invalid_value(f"'{name}' was given more than once.", name)
    return fields


def _text(fields: dict[str, list[str | UploadFile]], name: str) -> str | None:
    values = fields.get(name)
    if not values:
        return None
    if not isinstance(values[0], str):
        raise invalid_value(f"'{name}' must be a text field, not a file.", name)
    return values[0]


def _temperature(text: str | None) -> float:
    if text is None:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise invalid_value(
            f"'temperature' must be a number (got {text!r}).", "temperature"
        ) from None
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise invalid_value(f"'temperature' must be between 0 and 1 (got {text}).", "temperature")
    return value


def _bounded_int(text: str | None, name: str, low: int, high: int) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise invalid_value(f"'{name}' must be an integer (got {text!r}).", name) from None
    if not low <= value <= high:
        raise invalid_value(f"'{name}' must be between {low} and {high} (got {value}).", name)
    return value


def _bool(text: str | None, name: str) -> bool | None:
    if text is None:
        return None
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise invalid_value(f"'{name}' must be true or false (got {text!r}).", name)
    return value == "true"


def _granularities(
    fields: dict[str, list[str | UploadFile]], response_format: str
) -> tuple[str, ...]:
    values = fields.get("timestamp_granularities", [])
    param = GRANULARITIES_PARAM
    for value in values:
        if value not in GRANULARITIES:
            raise invalid_value(
                f"'{param}' entries must be one of {', '.join(GRANULARITIES)} (got {value!r}).",
                param,
            )
    if values and response_format != "verbose_json":
        raise invalid_value(f"'{param}' needs response_format 'verbose_json'.", param)
    return tuple(dict.fromkeys(str(v) for v in values))


def _stream(text: str | None, response_format: str) -> bool:
    """Whether to stream; the SDK sends ``true`` / ``false``. Streamed events carry text,
    so a format with timestamps (verbose_json, srt, vtt) or plain text cannot stream."""
    stream = bool(_bool(text, "stream"))
    if stream and response_format != "json":
        raise invalid_value(
            f"'stream' needs response_format 'json' (got {response_format!r}).", "stream"
        )
    return stream


def _logprobs(fields: dict[str, list[str | UploadFile]], response_format: str) -> bool:
    """``include[]``: only "logprobs", which OpenAI returns with response_format json."""
    values = fields.get("include", [])
    for value in values:
        if value != "logprobs":
            raise invalid_value(f"'include[]' entries must be logprobs (got {value!r}).", "include")
    if values and response_format != "json":
        raise invalid_value("'include[]' needs response_format 'json'.", "include")
    return bool(values)


def check_form(fields: dict[str, list[str | UploadFile]]) -> tuple[UploadFile, dict[str, object]]:
    """The upload and the checked text fields (everything but the file's bytes)."""
    uploads = fields.get("file")
    if not uploads:
        raise missing_parameter("file")
    upload = uploads[0]
    if not isinstance(upload, UploadFile):
        raise invalid_value("'file' must be a file (a part with a filename).", "file")
    model = _text(fields, "model")
    if model is None:
        raise missing_parameter("model")
    response_format = _text(fields, "response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise invalid_value(
            f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)} "
            f"(got {response_format!r}).",
            "response_format",
        )
    prompt = _text(fields, "prompt")
    if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
        raise invalid_value(f"'prompt' is longer than {MAX_PROMPT_CHARS} characters.", "prompt")
    checked = {
        "model": model,
        "language": _text(fields, "language"),
        "prompt": prompt,
        "response_format": response_format,
        "temperature": _temperature(_text(fields, "temperature")),
        "timestamp_granularities": _granularities(fields, response_format),
        "beam_size": _bounded_int(_text(fields, "beam_size"), "beam_size", 1, MAX_BEAM_SIZE),
        "seed": _bounded_int(_text(fields, "seed"), "seed", 0, MAX_SEED),
        "vad_filter": _bool(_text(fields, "vad_filter"), "vad_filter"),
        "stream": _stream(_text(fields, "stream"), response_format),
        "logprobs": _logprobs(fields, response_format),
    }
    return upload, checked


async def read_audio_request(request: Request, task: str) -> AudioRequest:
    """Read and check the form of one audio request. Raises a 400 :class:`ApiError` (or,
    through the body limit, a 413) for every problem; reads the file only once the other
    fields passed."""
    content_type = request.headers.get("content-type", "").lower()
    # A url-encoded form cannot carry a file, but is read, to name what is missing.
    if not content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise ApiError(
            400,
            "Send the request as multipart/form-data, with the audio in a 'file' part.",
            None,
            "invalid_content_type",
        )
    form = await request.form(max_files=1, max_fields=MAX_FIELDS)
    try:
        upload, checked = check_form(_fields(form, task))
        audio = await upload.read()
    finally:
        await form.close()
    return AudioRequest(task=task, audio=audio, filename=upload.filename or "", **checked)
