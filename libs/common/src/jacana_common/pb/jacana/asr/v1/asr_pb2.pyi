from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Task(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_TRANSCRIBE: _ClassVar[Task]
    TASK_TRANSLATE: _ClassVar[Task]
TASK_TRANSCRIBE: Task
TASK_TRANSLATE: Task

class TranscribeRequest(_message.Message):
    __slots__ = ("request_id", "audio", "filename", "model", "language", "task", "prompt", "temperature", "beam_size", "seed", "vad_filter", "word_timestamps", "logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    BEAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    VAD_FILTER_FIELD_NUMBER: _ClassVar[int]
    WORD_TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    audio: bytes
    filename: str
    model: str
    language: str
    task: Task
    prompt: str
    temperature: float
    beam_size: int
    seed: int
    vad_filter: bool
    word_timestamps: bool
    logprobs: bool
    def __init__(self, request_id: _Optional[str] = ..., audio: _Optional[bytes] = ..., filename: _Optional[str] = ..., model: _Optional[str] = ..., language: _Optional[str] = ..., task: _Optional[_Union[Task, str]] = ..., prompt: _Optional[str] = ..., temperature: _Optional[float] = ..., beam_size: _Optional[int] = ..., seed: _Optional[int] = ..., vad_filter: _Optional[bool] = ..., word_timestamps: _Optional[bool] = ..., logprobs: _Optional[bool] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("id", "seek", "start", "end", "text", "tokens", "avg_logprob", "compression_ratio", "no_speech_prob", "temperature", "words", "logprobs")
    ID_FIELD_NUMBER: _ClassVar[int]
    SEEK_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    AVG_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_RATIO_FIELD_NUMBER: _ClassVar[int]
    NO_SPEECH_PROB_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    temperature: float
    words: _containers.RepeatedCompositeFieldContainer[Word]
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, id: _Optional[int] = ..., seek: _Optional[int] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., text: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., avg_logprob: _Optional[float] = ..., compression_ratio: _Optional[float] = ..., no_speech_prob: _Optional[float] = ..., temperature: _Optional[float] = ..., words: _Optional[_Iterable[_Union[Word, _Mapping]]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token", "bytes", "logprob")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token: str
    bytes: bytes
    logprob: float
    def __init__(self, token: _Optional[str] = ..., bytes: _Optional[bytes] = ..., logprob: _Optional[float] = ...) -> None: ...

class Word(_message.Message):
    __slots__ = ("word", "start", "end", "probability")
    WORD_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    word: str
    start: float
    end: float
    probability: float
    def __init__(self, word: _Optional[str] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., probability: _Optional[float] = ...) -> None: ...

class TranscribeResponse(_message.Message):
    __slots__ = ("text", "language", "language_name", "duration", "segments", "model_id")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_NAME_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    text: str
    language: str
    language_name: str
    duration: float
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    model_id: str
    def __init__(self, text: _Optional[str] = ..., language: _Optional[str] = ..., language_name: _Optional[str] = ..., duration: _Optional[float] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., model_id: _Optional[str] = ...) -> None: ...

class TranscribeStreamEvent(_message.Message):
    __slots__ = ("segments", "done", "seconds_done")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_DONE_FIELD_NUMBER: _ClassVar[int]
    segments: SegmentBatch
    done: TranscribeResponse
    seconds_done: float
    def __init__(self, segments: _Optional[_Union[SegmentBatch, _Mapping]] = ..., done: _Optional[_Union[TranscribeResponse, _Mapping]] = ..., seconds_done: _Optional[float] = ...) -> None: ...

class SegmentBatch(_message.Message):
    __slots__ = ("segments",)
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    def __init__(self, segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_id", "device", "max_audio_seconds", "max_concurrent", "max_queued", "max_job_audio_seconds")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MAX_AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_FIELD_NUMBER: _ClassVar[int]
    MAX_JOB_AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    device: str
    max_audio_seconds: float
    max_concurrent: int
    max_queued: int
    max_job_audio_seconds: float
    def __init__(self, model_id: _Optional[str] = ..., device: _Optional[str] = ..., max_audio_seconds: _Optional[float] = ..., max_concurrent: _Optional[int] = ..., max_queued: _Optional[int] = ..., max_job_audio_seconds: _Optional[float] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AsrStats(_message.Message):
    __slots__ = ("running", "waiting", "requests_total", "rejected_total", "audio_seconds_total", "cancelled_total")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    REJECTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    AUDIO_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    running: int
    waiting: int
    requests_total: int
    rejected_total: int
    audio_seconds_total: float
    cancelled_total: int
    def __init__(self, running: _Optional[int] = ..., waiting: _Optional[int] = ..., requests_total: _Optional[int] = ..., rejected_total: _Optional[int] = ..., audio_seconds_total: _Optional[float] = ..., cancelled_total: _Optional[int] = ...) -> None: ...

class CreateTranscriptionJobRequest(_message.Message):
    __slots__ = ("request", "response_format", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    request: TranscribeRequest
    response_format: str
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, request: _Optional[_Union[TranscribeRequest, _Mapping]] = ..., response_format: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GetTranscriptionJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class TranscriptionJobError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class TranscriptionJob(_message.Message):
    __slots__ = ("id", "model", "status", "progress_seconds", "duration", "created_at", "completed_at", "expires_at", "error", "response_format", "language")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    status: str
    progress_seconds: float
    duration: float
    created_at: int
    completed_at: int
    expires_at: int
    error: TranscriptionJobError
    response_format: str
    language: str
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., status: _Optional[str] = ..., progress_seconds: _Optional[float] = ..., duration: _Optional[float] = ..., created_at: _Optional[int] = ..., completed_at: _Optional[int] = ..., expires_at: _Optional[int] = ..., error: _Optional[_Union[TranscriptionJobError, _Mapping]] = ..., response_format: _Optional[str] = ..., language: _Optional[str] = ...) -> None: ...

class DeleteTranscriptionJobResponse(_message.Message):
    __slots__ = ("job_id", "deleted")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    deleted: bool
    def __init__(self, job_id: _Optional[str] = ..., deleted: _Optional[bool] = ...) -> None: ...
