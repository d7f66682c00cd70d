"""gRPC front of the speech-to-text service: proto messages <-> :class:`TranscriptionService`.

Owns no state beyond a reference to the service. Errors become status codes with the
blamed field (and OpenAI's code, where one fits) in the details
(``jacana_common.errors.grpc_details``), which the gateway turns into OpenAI-shaped HTTP
errors.
"""

from __future__ import annotations

import grpc

from jacana_asr.errors import (
    AsrError,
    DecoderUnavailableError,
    DecodeTimeoutError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    TranscriptionFailedError,
)
from jacana_asr.languages import language_name
from jacana_asr.service import TranscriptionService, WindowDone
from jacana_asr.transcription import DEFAULT_BEAM_SIZE, Segment, TranscribeOptions, Transcription
from jacana_common.errors import grpc_details
from jacana_common.pb.jacana.asr.v1 import asr_pb2, asr_pb2_grpc

_STATUS = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    ModelNotFoundError: grpc.StatusCode.NOT_FOUND,
    OverloadedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DecoderUnavailableError: grpc.StatusCode.UNAVAILABLE,
    DecodeTimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    TranscriptionFailedError: grpc.StatusCode.INTERNAL,
}
_TASKS = {asr_pb2.TASK_TRANSCRIBE: "transcribe", asr_pb2.TASK_TRANSLATE: "translate"}


def decode_options(request: asr_pb2.TranscribeRequest) -> TranscribeOptions:
    """The request's decoding choices; an unknown task value raises InvalidRequestError."""
    task = _TASKS.get(request.task)
    if task is None:
        raise InvalidRequestError(f"unknown task {request.task}", "task")
    return TranscribeOptions(
        language=request.language or None,
        task=task,
        prompt=request.prompt or None,
        temperature=request.temperature,
        beam_size=request.beam_size if request.HasField("beam_size") else DEFAULT_BEAM_SIZE,
        seed=request.seed if request.HasField("seed") else None,
        vad_filter=request.vad_filter if request.HasField("vad_filter") else None,
        word_timestamps=request.word_timestamps,
    )


def encode_segment(s: Segment, logprobs: bool = False) -> asr_pb2.Segment:
    """Segment -> proto; its token log-probabilities only with ``logprobs``."""
    return asr_pb2.Segment(
        id=s.id,
        seek=s.seek,
        start=s.start,
        end=s.end,
        text=s.text,
        tokens=list(s.tokens),
        avg_logprob=s.avg_logprob,
        compression_ratio=s.compression_ratio,
        no_speech_prob=s.no_speech_prob,
        temperature=s.temperature,
        words=[
            asr_pb2.Word(word=w.word, start=w.start, end=w.end, probability=w.probability)
            for w in s.words
        ],
        logprobs=[
            asr_pb2.TokenLogprob(token=t.token, bytes=t.bytes, logprob=t.logprob)
            for t in (s.logprobs if logprobs else ())
        ],
    )


def encode_response(
    result: Transcription, model_id: str, logprobs: bool = False
) -> asr_pb2.TranscribeResponse:
    """Transcription -> TranscribeResponse (with token log-probabilities: ``logprobs``)."""
    return asr_pb2.TranscribeResponse(
        text=result.text,
        language=result.language,
        language_name=language_name(result.language),
        duration=result.duration,
        segments=[encode_segment(s, logprobs) for s in result.segments],
        model_id=model_id,
    )


def encode_event(
    event: WindowDone | Transcription, model_id: str, logprobs: bool = False
) -> asr_pb2.TranscribeStreamEvent:
    """One streamed window, or the final transcription -> TranscribeStreamEvent."""
    if isinstance(event, Transcription):
        done = encode_response(event, model_id, logprobs)
        return asr_pb2.TranscribeStreamEvent(done=done, seconds_done=event.duration)
    batch = asr_pb2.SegmentBatch(segments=[encode_segment(s, logprobs) for s in event.segments])
    return asr_pb2.TranscribeStreamEvent(segments=batch, seconds_done=event.seconds_done)


class AsrServicer(asr_pb2_grpc.AsrServicer):
    """Implements ``jacana.asr.v1.Asr`` over one :class:`TranscriptionService`."""

    def __init__(self, service: TranscriptionService) -> None:
        self.service = service

    async def Transcribe(self, request, context):
        try:
            result = await self.service.transcribe(
                request.audio,
                decode_options(request),
                model=request.model,
                request_id=request.request_id,
                filename=request.filename,
            )
        except AsrError as exc:
            await context.abort(_STATUS[type(exc)], grpc_details(exc.message, exc.param, exc.code))
        return encode_response(result, self.service.model_id, request.logprobs)

    async def TranscribeStream(self, request, context):
        try:
            events = self.service.transcribe_stream(
                request.audio,
                decode_options(request),
                model=request.model,
                request_id=request.request_id,
                filename=request.filename,
            )
            try:
                async for event in events:
                    yield encode_event(event, self.service.model_id, request.logprobs)
            finally:
                await events.aclose()  # a cancelled call stops the transcription
        except AsrError as exc:
            await context.abort(_STATUS[type(exc)], grpc_details(exc.message, exc.param, exc.code))

    async def GetModelInfo(self, request, context):
        limits = self.service.limits
        return asr_pb2.ModelInfo(
            model_id=self.service.model_id,
            device=self.service.device,
            max_audio_seconds=limits.max_audio_seconds,
            max_concurrent=limits.max_concurrent,
            max_queued=limits.max_queued,
        )

    async def GetStats(self, request, context):
        s = self.service.stats()
        return asr_pb2.AsrStats(
            running=s.running,
            waiting=s.waiting,
            requests_total=s.requests_total,
            rejected_total=s.rejected_total,
            audio_seconds_total=s.audio_seconds_total,
            cancelled_total=s.cancelled_total,
        )
