from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ContentVariant(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTENT_VARIANT_VIDEO: _ClassVar[ContentVariant]
    CONTENT_VARIANT_THUMBNAIL: _ClassVar[ContentVariant]
    CONTENT_VARIANT_SPRITESHEET: _ClassVar[ContentVariant]
CONTENT_VARIANT_VIDEO: ContentVariant
CONTENT_VARIANT_THUMBNAIL: ContentVariant
CONTENT_VARIANT_SPRITESHEET: ContentVariant

class CreateVideoRequest(_message.Message):
    __slots__ = ("model", "prompt", "seconds", "size", "input_reference", "input_reference_name", "seed", "num_inference_steps", "guidance_scale", "fps", "negative_prompt", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    INPUT_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    INPUT_REFERENCE_NAME_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    NUM_INFERENCE_STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    seconds: str
    size: str
    input_reference: bytes
    input_reference_name: str
    seed: int
    num_inference_steps: int
    guidance_scale: float
    fps: int
    negative_prompt: str
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., seconds: _Optional[str] = ..., size: _Optional[str] = ..., input_reference: _Optional[bytes] = ..., input_reference_name: _Optional[str] = ..., seed: _Optional[int] = ..., num_inference_steps: _Optional[int] = ..., guidance_scale: _Optional[float] = ..., fps: _Optional[int] = ..., negative_prompt: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class VideoError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Video(_message.Message):
    __slots__ = ("id", "model", "status", "progress", "created_at", "completed_at", "expires_at", "seconds", "size", "prompt", "remixed_from_video_id", "error", "seed", "num_inference_steps", "guidance_scale", "fps", "negative_prompt", "notice")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    REMIXED_FROM_VIDEO_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    NUM_INFERENCE_STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    NOTICE_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    status: str
    progress: int
    created_at: int
    completed_at: int
    expires_at: int
    seconds: str
    size: str
    prompt: str
    remixed_from_video_id: str
    error: VideoError
    seed: int
    num_inference_steps: int
    guidance_scale: float
    fps: int
    negative_prompt: str
    notice: str
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., status: _Optional[str] = ..., progress: _Optional[int] = ..., created_at: _Optional[int] = ..., completed_at: _Optional[int] = ..., expires_at: _Optional[int] = ..., seconds: _Optional[str] = ..., size: _Optional[str] = ..., prompt: _Optional[str] = ..., remixed_from_video_id: _Optional[str] = ..., error: _Optional[_Union[VideoError, _Mapping]] = ..., seed: _Optional[int] = ..., num_inference_steps: _Optional[int] = ..., guidance_scale: _Optional[float] = ..., fps: _Optional[int] = ..., negative_prompt: _Optional[str] = ..., notice: _Optional[str] = ...) -> None: ...

class GetVideoRequest(_message.Message):
    __slots__ = ("video_id",)
    VIDEO_ID_FIELD_NUMBER: _ClassVar[int]
    video_id: str
    def __init__(self, video_id: _Optional[str] = ...) -> None: ...

class ListVideosRequest(_message.Message):
    __slots__ = ("after", "limit", "order")
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    after: str
    limit: int
    order: str
    def __init__(self, after: _Optional[str] = ..., limit: _Optional[int] = ..., order: _Optional[str] = ...) -> None: ...

class ListVideosResponse(_message.Message):
    __slots__ = ("data", "has_more")
    DATA_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedCompositeFieldContainer[Video]
    has_more: bool
    def __init__(self, data: _Optional[_Iterable[_Union[Video, _Mapping]]] = ..., has_more: _Optional[bool] = ...) -> None: ...

class DeleteVideoRequest(_message.Message):
    __slots__ = ("video_id",)
    VIDEO_ID_FIELD_NUMBER: _ClassVar[int]
    video_id: str
    def __init__(self, video_id: _Optional[str] = ...) -> None: ...

class DeleteVideoResponse(_message.Message):
    __slots__ = ("id", "deleted")
    ID_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    id: str
    deleted: bool
    def __init__(self, id: _Optional[str] = ..., deleted: _Optional[bool] = ...) -> None: ...

class RemixVideoRequest(_message.Message):
    __slots__ = ("video_id", "prompt", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VIDEO_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    video_id: str
    prompt: str
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, video_id: _Optional[str] = ..., prompt: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GetVideoContentRequest(_message.Message):
    __slots__ = ("video_id", "variant")
    VIDEO_ID_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    video_id: str
    variant: ContentVariant
    def __init__(self, video_id: _Optional[str] = ..., variant: _Optional[_Union[ContentVariant, str]] = ...) -> None: ...

class ContentChunk(_message.Message):
    __slots__ = ("data", "content_type", "total_bytes")
    DATA_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    content_type: str
    total_bytes: int
    def __init__(self, data: _Optional[bytes] = ..., content_type: _Optional[str] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class ModelCard(_message.Message):
    __slots__ = ("id", "architecture", "sizes", "seconds", "default_size", "default_seconds", "default_fps", "image_to_video", "random_weights", "description")
    ID_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_SIZE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FPS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_TO_VIDEO_FIELD_NUMBER: _ClassVar[int]
    RANDOM_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    id: str
    architecture: str
    sizes: _containers.RepeatedScalarFieldContainer[str]
    seconds: _containers.RepeatedScalarFieldContainer[str]
    default_size: str
    default_seconds: str
    default_fps: int
    image_to_video: bool
    random_weights: bool
    description: str
    def __init__(self, id: _Optional[str] = ..., architecture: _Optional[str] = ..., sizes: _Optional[_Iterable[str]] = ..., seconds: _Optional[_Iterable[str]] = ..., default_size: _Optional[str] = ..., default_seconds: _Optional[str] = ..., default_fps: _Optional[int] = ..., image_to_video: _Optional[bool] = ..., random_weights: _Optional[bool] = ..., description: _Optional[str] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelCard]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelCard, _Mapping]]] = ...) -> None: ...
