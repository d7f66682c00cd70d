"""A streamed transcription between gRPC and OpenAI: the service's
``TranscribeStreamEvent`` messages as the server-sent events of OpenAI's
``stream=true`` transcriptions.

Pure, no I/O. Shapes follow the SDK's ``TranscriptionStreamEvent``:

- ``{"type": "transcript.text.delta", "delta"}`` per segment, as each window's segments
  arrive, with the segment's token ``logprobs`` (``[{token, logprob, bytes}]``) under
  ``include[]=logprobs``; the deltas concatenate exactly to the final ``text``
  (:class:`DeltaText` drops the leading whitespace and holds trailing whitespace back until
  more text follows, as the final text is stripped at both ends);
- one ``{"type": "transcript.text.done", "text", "usage"}`` last (and every token's
  ``logprobs`` under ``include[]=logprobs``). ``usage`` is OpenAI's token usage (the only
  kind the done event has): ``input_tokens`` are the audio's encoder states, 50 a second
  as Whisper encodes 30 s into 1500 (``input_token_details``: ``audio_tokens``),
  ``output_tokens`` the segments' decoded tokens, timestamps included.

The stream ends after the done event, without ``data: [DONE]`` (the SDK stops at either).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb
from jacana_gateway.translate.audio import logprobs_json

AUDIO_TOKENS_PER_SECOND = 50  # Whisper's encoder: 1500 states per 30 s window
DELTA = "transcript.text.delta"
DONE = "transcript.text.done"


class DeltaText:
    """Segment texts -> deltas whose concatenation is the segments' texts joined and
    stripped at both ends."""

    def __init__(self) -> None:
        self._started = False
        self._held = ""  # whitespace not sent yet: it may be the end of the text

    def delta(self, text: str) -> str:
        """The part of ``text`` to send now ("" when there is none)."""
        if not self._started:
            text = text.lstrip()
        body = text.rstrip()
        if not body:
            self._held += text if self._started else ""
            return ""
        out = self._held + body
        self._held = text[len(body) :]
        self._started = True
        return out


def usage(response: pb.TranscribeResponse) -> dict[str, Any]:
    audio_tokens = math.ceil(response.duration * AUDIO_TOKENS_PER_SECOND)
    output_tokens = sum(len(s.tokens) for s in response.segments)
    return {
        "type": "tokens",
        "input_tokens": audio_tokens,
        "output_tokens": output_tokens,
        "total_tokens": audio_tokens + output_tokens,
        "input_token_details": {"audio_tokens": audio_tokens},
    }


def events(event: pb.TranscribeStreamEvent, text: DeltaText) -> Iterator[dict[str, Any]]:
    """The OpenAI events of one service event: a delta per segment with text, or the done
    event."""
    if event.WhichOneof("event") == "done":
        done = event.done
        logprobs = logprobs_json(done.segments)
        yield {"type": DONE, "text": done.text, **logprobs, "usage": usage(done)}
        return
    for segment in event.segments.segments:
        delta = text.delta(segment.text)
        if delta:
            yield {"type": DELTA, "delta": delta, **logprobs_json([segment])}
