from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VectorEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VECTOR_ENCODING_PACKED_FLOAT32: _ClassVar[VectorEncoding]
    VECTOR_ENCODING_FLOATS: _ClassVar[VectorEncoding]
VECTOR_ENCODING_PACKED_FLOAT32: VectorEncoding
VECTOR_ENCODING_FLOATS: VectorEncoding

class TextInputs(_message.Message):
    __slots__ = ("texts",)
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, texts: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TokenInputs(_message.Message):
    __slots__ = ("inputs",)
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[TokenIds]
    def __init__(self, inputs: _Optional[_Iterable[_Union[TokenIds, _Mapping]]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("request_id", "texts", "token_ids", "truncate", "dimensions", "encoding", "model")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    texts: TextInputs
    token_ids: TokenInputs
    truncate: bool
    dimensions: int
    encoding: VectorEncoding
    model: str
    def __init__(self, request_id: _Optional[str] = ..., texts: _Optional[_Union[TextInputs, _Mapping]] = ..., token_ids: _Optional[_Union[TokenInputs, _Mapping]] = ..., truncate: _Optional[bool] = ..., dimensions: _Optional[int] = ..., encoding: _Optional[_Union[VectorEncoding, str]] = ..., model: _Optional[str] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("packed", "values", "num_tokens", "truncated")
    PACKED_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    packed: bytes
    values: _containers.RepeatedScalarFieldContainer[float]
    num_tokens: int
    truncated: bool
    def __init__(self, packed: _Optional[bytes] = ..., values: _Optional[_Iterable[float]] = ..., num_tokens: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "total_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    total_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "dimension", "usage", "model_id")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    dimension: int
    usage: Usage
    model_id: str
    def __init__(self, embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., dimension: _Optional[int] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., model_id: _Optional[str] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_id", "architecture", "max_input_tokens", "dimension", "supports_matryoshka", "matryoshka_dimensions", "normalized", "pooling", "vocab_size", "dtype", "device", "max_inputs_per_request")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_MATRYOSHKA_FIELD_NUMBER: _ClassVar[int]
    MATRYOSHKA_DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUTS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    architecture: str
    max_input_tokens: int
    dimension: int
    supports_matryoshka: bool
    matryoshka_dimensions: _containers.RepeatedScalarFieldContainer[int]
    normalized: bool
    pooling: str
    vocab_size: int
    dtype: str
    device: str
    max_inputs_per_request: int
    def __init__(self, model_id: _Optional[str] = ..., architecture: _Optional[str] = ..., max_input_tokens: _Optional[int] = ..., dimension: _Optional[int] = ..., supports_matryoshka: _Optional[bool] = ..., matryoshka_dimensions: _Optional[_Iterable[int]] = ..., normalized: _Optional[bool] = ..., pooling: _Optional[str] = ..., vocab_size: _Optional[int] = ..., dtype: _Optional[str] = ..., device: _Optional[str] = ..., max_inputs_per_request: _Optional[int] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EmbeddingsStats(_message.Message):
    __slots__ = ("queued_inputs", "requests_total", "inputs_total", "batches_total", "tokens_total", "padded_tokens_total")
    QUEUED_INPUTS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BATCHES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PADDED_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    queued_inputs: int
    requests_total: int
    inputs_total: int
    batches_total: int
    tokens_total: int
    padded_tokens_total: int
    def __init__(self, queued_inputs: _Optional[int] = ..., requests_total: _Optional[int] = ..., inputs_total: _Optional[int] = ..., batches_total: _Optional[int] = ..., tokens_total: _Optional[int] = ..., padded_tokens_total: _Optional[int] = ...) -> None: ...
