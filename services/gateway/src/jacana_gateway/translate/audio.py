"""/v1/audio/* between OpenAI and gRPC: the service's ``TranscribeRequest`` for a checked
upload (:func:`transcribe_request`), and the reply as each ``response_format`` of OpenAI's
audio API shows it: ``json``, ``text``, ``srt``, ``verbose_json``, ``vtt``.

Pure functions, no I/O. The renderers take the service's :class:`TranscribeResponse`, the
task and the asked timestamp granularities, and are registered by format name in
:data:`RENDERERS`. Shapes follow OpenAI's:

- json: ``{"text"}``, with ``usage`` (``{"type": "duration", "seconds"}``, whole seconds
  rounded up) for transcriptions, and ``logprobs`` (``[{token, logprob, bytes}]``, the
  text tokens in order) with ``include[]=logprobs``;
- verbose_json: ``{"task", "language", "duration", "text", "segments", "usage"}``, the
  language as its lowercase English name ("english"; always "english" for translations,
  which have no ``usage``), each segment ``{id, seek, start, end, text, tokens,
  temperature, avg_logprob, compression_ratio, no_speech_prob}``; with the "word"
  granularity a top-level ``words`` list of ``{word, start, end}`` (the word stripped of
  its leading space), and ``segments`` only when "segment" was asked for too;
- text: the text and a newline;
- srt / vtt: one cue per segment, ``HH:MM:SS,mmm`` / ``HH:MM:SS.mmm`` times, the segment's
  text stripped and with ``-->`` written ``->`` so that it cannot end a cue's timing line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb
from jacana_gateway.schemas.audio import AudioRequest

_TASKS = {"transcribe": pb.TASK_TRANSCRIBE, "translate": pb.TASK_TRANSLATE}


def transcribe_request(body: AudioRequest, request_id: str) -> pb.TranscribeRequest:
    """``body`` as the service's TranscribeRequest. No ``model``: the gateway's name for
    the model may differ from the service's."""
    request = pb.TranscribeRequest(
        request_id=request_id,
        audio=body.audio,
        filename=body.filename,
        language=body.language or "",
        task=_TASKS[body.task],
        prompt=body.prompt or "",
        temperature=body.temperature,
        word_timestamps="word" in body.timestamp_granularities,
        logprobs=body.logprobs,
    )
    if body.beam_size is not None:
        request.beam_size = body.beam_size
    if body.seed is not None:
        request.seed = body.seed
    if body.vad_filter is not None:
        request.vad_filter = body.vad_filter
    return request


@dataclass(frozen=True)
class Rendered:
    content: str
    media_type: str


# (response, task, the timestamp granularities asked for: "segment", "word"; none: segment)
Renderer = Callable[[pb.TranscribeResponse, str, tuple[str, ...]], Rendered]


def timestamp(seconds: float, decimal_marker: str) -> str:
    """``3725.5`` -> ``"01:02:05,500"`` (SRT, marker ",") or ``"01:02:05.500"`` (VTT, ".")."""
    millis = max(round(seconds * 1000), 0)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{millis:03d}"


def _cue_text(segment: pb.Segment) -> str:
    return segment.text.strip().replace("-->", "->")


def _usage(response: pb.TranscribeResponse, task: str) -> dict[str, Any]:
    if task != "transcribe":
        return {}
    return {"usage": {"type": "duration", "seconds": math.ceil(response.duration)}}


def _json(payload: dict[str, Any]) -> Rendered:
    return Rendered(json.dumps(payload, ensure_ascii=False), "application/json")


def segment_json(segment: pb.Segment) -> dict[str, Any]:
    """One entry of verbose_json's ``segments``."""
    return {
        "id": segment.id,
        "seek": segment.seek,
        "start": segment.start,
        "end": segment.end,
        "text": segment.text,
        "tokens": list(segment.tokens),
        "temperature": segment.temperature,
        "avg_logprob": segment.avg_logprob,
        "compression_ratio": segment.compression_ratio,
        "no_speech_prob": segment.no_speech_prob,
    }


def word_json(word: pb.Word) -> dict[str, Any]:
    """One entry of verbose_json's ``words``."""
    return {"word": word.word.strip(), "start": word.start, "end": word.end}


def logprob_json(token: pb.TokenLogprob) -> dict[str, Any]:
    """One entry of OpenAI's ``logprobs``: the token, its log-probability, its bytes."""
    return {"token": token.token, "logprob": token.logprob, "bytes": list(token.bytes)}


def logprobs_json(segments) -> dict[str, Any]:
    """``{"logprobs": [...]}`` over ``segments``' tokens, or nothing when the service sent
    none (it sends them only when asked)."""
    tokens = [logprob_json(t) for s in segments for t in s.logprobs]
    return {"logprobs": tokens} if tokens else {}


def render_json(
    response: pb.TranscribeResponse, task: str, granularities: tuple[str, ...] = ()
) -> Rendered:
    body = {"text": response.text, **logprobs_json(response.segments)}
    return _json({**body, **_usage(response, task)})


def render_verbose_json(
    response: pb.TranscribeResponse, task: str, granularities: tuple[str, ...] = ()
) -> Rendered:
    # A translation reports its output's language, as OpenAI does.
    spoken = response.language_name or response.language
    language = "english" if task == "translate" else spoken
    body: dict[str, Any] = {
        "task": task,
        "language": language,
        "duration": response.duration,
        "text": response.text,
    }
    if "word" in granularities:
        body["words"] = [word_json(w) for s in response.segments for w in s.words]
    if "segment" in granularities or not granularities:
        body["segments"] = [segment_json(s) for s in response.segments]
    return _json({**body, **_usage(response, task)})


def render_text(
    response: pb.TranscribeResponse, task: str, granularities: tuple[str, ...] = ()
) -> Rendered:
    return Rendered(response.text + "\n", "text/plain; charset=utf-8")


def render_srt(
    response: pb.TranscribeResponse, task: str, granularities: tuple[str, ...] = ()
) -> Rendered:
    cues = [
        f"{n}\n{timestamp(s.start, ',')} --> {timestamp(s.end, ',')}\n{_cue_text(s)}\n"
        for n, s in enumerate(response.segments, start=1)
    ]
    return Rendered("\n".join(cues), "text/plain; charset=utf-8")


def render_vtt(
    response: pb.TranscribeResponse, task: str, granularities: tuple[str, ...] = ()
) -> Rendered:
    cues = [
        f"{timestamp(s.start, '.')} --> {timestamp(s.end, '.')}\n{_cue_text(s)}\n\n"
        for s in response.segments
    ]
    return Rendered("WEBVTT\n\n" + "".join(cues), "text/vtt; charset=utf-8")


RENDERERS: dict[str, Renderer] = {
    "json": render_json,
    "text": render_text,
    "srt": render_srt,
    "verbose_json": render_verbose_json,
    "vtt": render_vtt,
}
