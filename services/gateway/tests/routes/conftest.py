"""Fixtures of the route tests: the doubles of the embeddings and ASR services.

- ``make_fake()`` / ``fake``: a :class:`FakeEmbeddings` on a free loopback port; it answers
  with vectors derived from its inputs (:meth:`FakeEmbeddings.vectors_for`), so order and
  values are checkable;
- ``make_asr()`` / ``asr``: a :class:`RecordingAsr`, answering with its ``reply``.

Both record what they were asked, answer with a scripted ``error`` when one is set, and
with ``hang`` hold the call open until the gateway cancels it (:class:`RecordingService`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
import numpy as np
import pytest

from jacana_common.errors import grpc_details
from jacana_common.pb.jacana.asr.v1 import asr_pb2, asr_pb2_grpc
from jacana_common.pb.jacana.embeddings.v1 import embeddings_pb2, embeddings_pb2_grpc
from jacana_gateway.backends.asr import ASR_SERVICE
from jacana_gateway.backends.embeddings import EMBEDDINGS_SERVICE


class RecordingService:
    """The body of a unary test double: record the request, hang while ``hang`` (until
    cancelled), abort with ``error`` ``(code, message, param)`` when it is set."""

    def __init__(self) -> None:
        self.requests: list = []
        self.error: tuple[grpc.StatusCode, str, str | None] | None = None
        self.hang = False
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def record(self, request, context) -> None:
        self.requests.append(request)
        self.started.set()
        if self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if self.error is not None:
            code, message, param = self.error
            await context.abort(code, grpc_details(message, param))


class FakeEmbeddings(RecordingService, embeddings_pb2_grpc.EmbeddingsServicer):
    @staticmethod
    def vectors_for(request: embeddings_pb2.EmbedRequest) -> np.ndarray:
        """[N, 4] float32: (index, input length, 1/3, -0.25); 1/3 is not exact in float32."""
        if request.WhichOneof("input") == "texts":
            sizes = [len(t) for t in request.texts.texts]
        else:
            sizes = [len(t.ids) for t in request.token_ids.inputs]
        rows = [[i, n, 1 / 3, -0.25] for i, n in enumerate(sizes)]
        return np.array(rows, dtype="<f4")

    async def Embed(self, request, context):
        await self.record(request, context)
        vectors = self.vectors_for(request)
        tokens = int(vectors[:, 1].sum())
        return embeddings_pb2.EmbedResponse(
            embeddings=[
                embeddings_pb2.Embedding(packed=v.tobytes(), num_tokens=int(v[1])) for v in vectors
            ],
            dimension=vectors.shape[1],
            usage=embeddings_pb2.Usage(prompt_tokens=tokens, total_tokens=tokens),
        )


class RecordingAsr(RecordingService, asr_pb2_grpc.AsrServicer):
    def __init__(self) -> None:
        super().__init__()
        self.reply = asr_pb2.TranscribeResponse()

    async def Transcribe(self, request, context):
        await self.record(request, context)
        return self.reply


@pytest.fixture
def make_fake(start_service) -> Callable[[], Awaitable]:
    """Start fake embeddings services on demand; all are stopped after the test."""

    async def start():
        add = embeddings_pb2_grpc.add_EmbeddingsServicer_to_server
        return await start_service(FakeEmbeddings(), add, EMBEDDINGS_SERVICE)

    return start


@pytest.fixture
async def fake(make_fake):
    return await make_fake()


@pytest.fixture
def make_asr(start_service) -> Callable[[], Awaitable]:
    """Start recording ASR services on demand; all are stopped after the test."""

    async def start():
        return await start_service(
            RecordingAsr(), asr_pb2_grpc.add_AsrServicer_to_server, ASR_SERVICE
        )

    return start
