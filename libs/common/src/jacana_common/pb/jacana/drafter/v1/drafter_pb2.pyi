from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DraftStep(_message.Message):
    __slots__ = ("step_id", "proposer", "requests", "finished_request_ids", "finished")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    PROPOSER_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    proposer: str
    requests: _containers.RepeatedCompositeFieldContainer[RequestDelta]
    finished_request_ids: _containers.RepeatedScalarFieldContainer[str]
    finished: _containers.RepeatedCompositeFieldContainer[RequestDelta]
    def __init__(self, step_id: _Optional[int] = ..., proposer: _Optional[str] = ..., requests: _Optional[_Iterable[_Union[RequestDelta, _Mapping]]] = ..., finished_request_ids: _Optional[_Iterable[str]] = ..., finished: _Optional[_Iterable[_Union[RequestDelta, _Mapping]]] = ...) -> None: ...

class RequestDelta(_message.Message):
    __slots__ = ("request_id", "token_ids", "full_history", "num_prompt_tokens", "max_draft")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FULL_HISTORY_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    full_history: bool
    num_prompt_tokens: int
    max_draft: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., full_history: _Optional[bool] = ..., num_prompt_tokens: _Optional[int] = ..., max_draft: _Optional[int] = ...) -> None: ...

class DraftReply(_message.Message):
    __slots__ = ("step_id", "drafts")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    drafts: _containers.RepeatedCompositeFieldContainer[Draft]
    def __init__(self, step_id: _Optional[int] = ..., drafts: _Optional[_Iterable[_Union[Draft, _Mapping]]] = ...) -> None: ...

class Draft(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...
