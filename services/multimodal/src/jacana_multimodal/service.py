"""The video job API, independent of gRPC: create, read, list, delete, remix, content,
and the sweep of expired files.

``VideoJobs`` owns no render state: job records live in Redis (``jacana_jobs.JobStore``,
kind "video"), files in the artifact storage (keys from ``artifacts``), queued renders in
the Celery broker. So any number of service replicas may serve the same Redis, and a
restarted service loses nothing. Every method blocks on Redis; the gRPC front calls them
on threads.

Invariants: a job is queued on the broker only after its record (and its reference image)
exist; a create that is refused leaves nothing behind; deleting a job removes its record
at once (a running render notices at its next step) and then its files.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import redis
from celery import Celery

from jacana_jobs import ArtifactStorage, JobNotFound, JobRecord, JobStatus, JobStore, enqueue_job
from jacana_jobs.celery_app import queue_length
from jacana_jobs.metrics import JobMetricsCollector
from jacana_multimodal.artifacts import VARIANTS, artifact_key, input_key
from jacana_multimodal.errors import InvalidVideoRequest, NotFound, NotReady, QueueFull
from jacana_multimodal.pipelines.base import InvalidRenderRequest, ModelCard
from jacana_multimodal.requests import VideoParams, resolve

log = logging.getLogger(__name__)

JOB_KIND = "video"
RENDER_TASK = "jacana.video.render"
RENDER_QUEUE = "jacana.video"
CHUNK_BYTES = 256 * 1024
RANDOM_WEIGHTS_NOTICE = (
    "{model} has random weights: its frames are noise. Point JACANA_MULTIMODAL_MODELS at "
    "real Wan 2.1 weights for real videos."
)


@dataclass(frozen=True)
class CreateRequest:
    """A create as the service receives it (the gRPC message, decoded)."""

    model: str
    prompt: str
    seconds: str = ""
    size: str = ""
    input_reference: bytes = b""
    negative_prompt: str = ""
    seed: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    fps: int | None = None
    trace_context: dict[str, str] | None = None


@dataclass(frozen=True)
class VideoView:
    """A job as the API shows it: the record and its parameters."""

    record: JobRecord
    params: VideoParams
    notice: str

    @property
    def progress(self) -> int:
        return int(self.record.progress)


def _no_video(video_id: str) -> NotFound:
    return NotFound(f"No video found with id '{video_id}'.", "video_id", "not_found")


def encode_png(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


class VideoJobs:
    """The job API over one Redis and one artifact storage."""

    def __init__(
        self,
        client: redis.Redis,
        storage: ArtifactStorage,
        celery: Celery,
        cards: list[ModelCard],
        *,
        ttl_s: float,
        max_queued: int,
        retry_after_s: int,
    ) -> None:
        if not cards:
            raise ValueError("at least one video model is needed")
        self._redis = client
        self.store = JobStore(client)
        self.storage = storage
        self._celery = celery
        self.cards = {card.id: card for card in cards}
        self.default_model = cards[0].id
        self._ttl_s = ttl_s
        self._max_queued = max_queued
        self._retry_after_s = retry_after_s

    def metrics(self) -> JobMetricsCollector:
        """The render queue's metrics (``jacana_multimodal_queue_length``, ``…_jobs``,
        ``…_job_duration_seconds``), read from Redis at scrape time."""
        return JobMetricsCollector(
            self._redis, self.store, JOB_KIND, RENDER_QUEUE, "jacana_multimodal"
        )

    # -- reads -------------------------------------------------------------------------

    def card(self, model: str) -> ModelCard:
        try:
            return self.cards[model or self.default_model]
        except KeyError:
            raise NotFound(
                f"The model '{model}' does not exist.", "model", "model_not_found"
            ) from None

    def _view(self, record: JobRecord) -> VideoView:
        card = self.cards.get(record.model)
        notice = ""
        if card is not None and card.random_weights:
            notice = RANDOM_WEIGHTS_NOTICE.format(model=card.id)
        return VideoView(record, VideoParams.from_json(record.params), notice)

    def _record(self, video_id: str) -> JobRecord:
        try:
            record = self.store.get(video_id)
        except JobNotFound:
            record = None
        if record is None or record.kind != JOB_KIND:
            raise _no_video(video_id)
        return record

    def get(self, video_id: str) -> VideoView:
        return self._view(self._record(video_id))

    def list(self, after: str, limit: int, order: str) -> tuple[list[VideoView], bool]:
        if order not in ("asc", "desc"):
            raise InvalidVideoRequest("'order' must be 'asc' or 'desc'.", "order")
        if not 1 <= limit <= 100:
            raise InvalidVideoRequest("'limit' must be in [1, 100].", "limit")
        try:
            page = self.store.list(JOB_KIND, after or None, limit, order)  # type: ignore[arg-type]
        except JobNotFound:
            raise NotFound(f"No video found with id '{after}'.", "after", "not_found") from None
        return [self._view(r) for r in page.records], page.has_more

    # -- writes ------------------------------------------------------------------------

    def create(self, request: CreateRequest) -> VideoView:
        card = self.card(request.model)
        params = resolve(
            card,
            prompt=request.prompt,
            seconds=request.seconds,
            size=request.size,
            negative_prompt=request.negative_prompt,
            seed=request.seed,
            num_inference_steps=request.num_inference_steps,
            guidance_scale=request.guidance_scale,
            fps=request.fps,
            has_input=bool(request.input_reference),
        )
        reference = None
        if request.input_reference:
            from jacana_multimodal.media.images import decode_reference_image

            try:
                image = decode_reference_image(request.input_reference, params.width, params.height)
            except InvalidRenderRequest as exc:
                raise InvalidVideoRequest(exc.message, exc.param) from None
            reference = encode_png(image)
        return self._submit(card, params, reference, request.trace_context)

    def remix(self, video_id: str, prompt: str, trace_context: dict[str, str] | None) -> VideoView:
        source = self._record(video_id)
        if source.status != JobStatus.COMPLETED:
            raise NotReady(
                f"Video '{video_id}' is {source.status.value}; only a completed video can be "
                "remixed.",
                "video_id",
                "video_not_ready",
            )
        card = self.card(source.model)
        params = VideoParams.from_json(source.params).remixed(video_id, prompt, card)
        reference = None
        if params.has_input:
            try:
                with self.storage.open(input_key(video_id)) as f:
                    reference = f.read()
            except FileNotFoundError:
                raise NotFound(
                    f"The reference image of video '{video_id}' has expired.", "video_id"
                ) from None
        return self._submit(card, params, reference, trace_context)

    def _submit(
        self,
        card: ModelCard,
        params: VideoParams,
        reference: bytes | None,
        trace_context: dict[str, str] | None,
    ) -> VideoView:
        waiting = queue_length(self._redis, RENDER_QUEUE)
        if waiting >= self._max_queued:
            raise QueueFull(
                f"{waiting} renders are waiting already; try again later.", self._retry_after_s
            )
        record = self.store.create(JOB_KIND, card.id, params.to_json(), self._ttl_s)
        if reference is not None:
            with self.storage.writer(input_key(record.id)) as f:
                f.write(reference)
        enqueue_job(self._celery, RENDER_TASK, record.id, headers=trace_context, queue=RENDER_QUEUE)
        log.info("video %s queued (%s, %s, %ss)", record.id, card.id, params.size, params.seconds)
        return self._view(record)

    def delete(self, video_id: str) -> str:
        """Remove the job (a running render stops at its next step) and its files."""
        self._record(video_id)  # 404 for ids of other kinds
        try:
            keys = self.store.delete(video_id)
        except JobNotFound:
            raise _no_video(video_id) from None
        for key in [*keys, input_key(video_id)]:
            self.storage.delete(key)
        return video_id

    # -- content -----------------------------------------------------------------------

    def content(self, video_id: str, variant: str) -> tuple[str, int, Iterator[bytes]]:
        """(content type, size, chunks) of one artifact of a completed video."""
        if variant not in VARIANTS:
            raise InvalidVideoRequest(f"'variant' must be one of {', '.join(VARIANTS)}.", "variant")
        record = self._record(video_id)
        if record.status != JobStatus.COMPLETED:
            raise NotReady(
                f"Video '{video_id}' is {record.status.value}; its content is available once "
                "it is completed.",
                "video_id",
                "video_not_ready",
            )
        key = record.artifacts.get(variant, artifact_key(video_id, variant))
        try:
            f = self.storage.open(key)
        except FileNotFoundError:
            raise NotFound(f"The {variant} of video '{video_id}' is gone.", "video_id") from None
        size = f.seek(0, io.SEEK_END)
        f.seek(0)

        def chunks() -> Iterator[bytes]:
            with f:
                while block := f.read(CHUNK_BYTES):
                    yield block

        return VARIANTS[variant][1], size, chunks()

    # -- expiry ------------------------------------------------------------------------

    def sweep(self, limit: int = 100) -> int:
        """Delete the files of expired videos; return how many videos were swept."""
        expired = self.store.expired_artifacts(limit=limit)
        for job in expired:
            for key in [*job.artifacts, input_key(job.id)]:
                self.storage.delete(key)
            self.store.forget(job)
        if expired:
            log.info("swept %d expired videos", len(expired))
        return len(expired)
