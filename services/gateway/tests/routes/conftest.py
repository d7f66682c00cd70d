"""Fixtures of the route tests: the doubles of the embeddings, ASR and multimodal services.

- ``make_fake()`` / ``fake``: a :class:`FakeEmbeddings` on a free loopback port; it answers
  with vectors derived from its inputs (:meth:`FakeEmbeddings.vectors_for`), so order and
  values are checkable;
- ``make_asr()`` / ``asr``: a :class:`RecordingAsr`, answering with its ``reply`` (and
  ``job``), and streaming its ``events``;
- ``make_multimodal()``: a :class:`FakeMultimodal`, a video job store in memory.

All record what they were asked, answer with a scripted ``error`` when one is set, and
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
from jacana_common.pb.jacana.multimodal.v1 import multimodal_pb2, multimodal_pb2_grpc
from jacana_gateway.backends.asr import ASR_SERVICE
from jacana_gateway.backends.embeddings import EMBEDDINGS_SERVICE
from jacana_gateway.backends.videos import MULTIMODAL_SERVICE


class RecordingService:
    """The body of a unary test double: record the request, hang while ``hang`` (until
    cancelled), abort with ``error`` ``(code, message, param)`` when it is set."""

    def __init__(self) -> None:
        self.requests: list = []
        self.error: tuple[grpc.StatusCode, str, str | None] | None = None
        self.error_code: str | None = None  # OpenAI's code, sent with ``error``
        self.trailing_metadata: tuple[tuple[str, str], ...] = ()  # sent with ``error``
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
            details = grpc_details(message, param, self.error_code)
            await context.abort(code, details, self.trailing_metadata)


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
    """Answers Transcribe and GetTranscriptionJobResult with ``reply``, the other job
    calls with ``job``; TranscribeStream sends ``events``, then hangs until cancelled
    (``hang_after_events``) or aborts with ``error_after_events`` ``(code, message)``."""

    def __init__(self) -> None:
        super().__init__()
        self.reply = asr_pb2.TranscribeResponse()
        self.job = asr_pb2.TranscriptionJob()
        self.events: list[asr_pb2.TranscribeStreamEvent] = []
        self.hang_after_events = False
        self.error_after_events: tuple[grpc.StatusCode, str] | None = None

    async def Transcribe(self, request, context):
        await self.record(request, context)
        return self.reply

    async def TranscribeStream(self, request, context):
        await self.record(request, context)
        try:
            for event in self.events:
                yield event
            if self.hang_after_events:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        if self.error_after_events is not None:
            await context.abort(*self.error_after_events)

    async def CreateTranscriptionJob(self, request, context):
        await self.record(request, context)
        return self.job

    async def GetTranscriptionJob(self, request, context):
        await self.record(request, context)
        return self.job

    async def GetTranscriptionJobResult(self, request, context):
        await self.record(request, context)
        return self.reply

    async def DeleteTranscriptionJob(self, request, context):
        await self.record(request, context)
        return asr_pb2.DeleteTranscriptionJobResponse(job_id=request.job_id, deleted=True)


class FakeMultimodal(RecordingService, multimodal_pb2_grpc.MultimodalServicer):
    """Videos in memory, in creation order. A created video is ``queued`` with id
    ``video_<n>`` (or ``<id_prefix><n>``) and the extensions the request set (defaults
    otherwise); tests move it along by editing ``videos``. ``content`` holds each
    ``(video_id, variant)``'s ``(content_type, bytes)``, streamed in ``chunk_bytes``
    chunks; content of a video that is not completed is FAILED_PRECONDITION
    ``video_not_ready``. ``cards`` answer ListModels."""

    pb = multimodal_pb2

    def __init__(self, id_prefix: str = "video_") -> None:
        super().__init__()
        self.id_prefix = id_prefix
        self.videos: dict[str, multimodal_pb2.Video] = {}
        self.content: dict[tuple[str, int], tuple[str, bytes]] = {}
        self.chunk_bytes = 1000
        self.cards: list[multimodal_pb2.ModelCard] = []

    def add(self, **fields) -> multimodal_pb2.Video:
        video_id = fields.pop("id", f"{self.id_prefix}{len(self.videos) + 1}")
        defaults = {"status": "queued", "created_at": 1_700_000_000 + len(self.videos)}
        video = multimodal_pb2.Video(id=video_id, **(defaults | fields))
        self.videos[video_id] = video
        return video

    async def _video(self, video_id: str, context) -> multimodal_pb2.Video:
        if video_id not in self.videos:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, grpc_details(f"no video {video_id}", "video_id")
            )
        return self.videos[video_id]

    async def CreateVideo(self, request, context):
        await self.record(request, context)
        return self.add(
            model=request.model or "default-model",
            prompt=request.prompt,
            seconds=request.seconds or "4",
            size=request.size or "832x480",
            expires_at=1_700_086_400,
            seed=request.seed if request.HasField("seed") else 42,
            num_inference_steps=request.num_inference_steps or 30,
            guidance_scale=request.guidance_scale if request.HasField("guidance_scale") else 5,
            fps=request.fps or 16,
            negative_prompt=request.negative_prompt,
        )

    async def GetVideo(self, request, context):
        await self.record(request, context)
        return await self._video(request.video_id, context)

    async def ListVideos(self, request, context):
        await self.record(request, context)
        videos = list(self.videos.values())
        if request.order != "asc":
            videos.reverse()
        ids = [v.id for v in videos]
        start = ids.index(request.after) + 1 if request.after in ids else 0
        limit = request.limit or 20
        page = videos[start : start + limit]
        return multimodal_pb2.ListVideosResponse(data=page, has_more=start + limit < len(videos))

    async def DeleteVideo(self, request, context):
        await self.record(request, context)
        await self._video(request.video_id, context)
        del self.videos[request.video_id]
        return multimodal_pb2.DeleteVideoResponse(id=request.video_id, deleted=True)

    async def RemixVideo(self, request, context):
        await self.record(request, context)
        source = await self._video(request.video_id, context)
        if source.status != "completed":
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc_details("only a completed video can be remixed", None, "video_not_ready"),
            )
        remix = multimodal_pb2.Video()
        remix.CopyFrom(source)
        remix.ClearField("completed_at")
        remix.id = f"{self.id_prefix}{len(self.videos) + 1}"
        remix.status, remix.progress = "queued", 0
        remix.prompt, remix.remixed_from_video_id = request.prompt, source.id
        self.videos[remix.id] = remix
        return remix

    async def GetVideoContent(self, request, context):
        await self.record(request, context)
        video = await self._video(request.video_id, context)
        if video.status != "completed":
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc_details(f"video {video.id} is {video.status}", None, "video_not_ready"),
            )
        content_type, data = self.content[(video.id, request.variant)]
        step = self.chunk_bytes
        for offset in range(0, len(data), step):
            chunk = multimodal_pb2.ContentChunk(data=data[offset : offset + step])
            if offset == 0:
                chunk.content_type, chunk.total_bytes = content_type, len(data)
            yield chunk

    async def ListModels(self, request, context):
        await self.record(request, context)
        return multimodal_pb2.ListModelsResponse(models=self.cards)


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


@pytest.fixture
def make_multimodal(start_service) -> Callable[..., Awaitable]:
    """Start fake multimodal services on demand; all are stopped after the test."""

    async def start(id_prefix: str = "video_"):
        add = multimodal_pb2_grpc.add_MultimodalServicer_to_server
        return await start_service(FakeMultimodal(id_prefix), add, MULTIMODAL_SERVICE)

    return start
