"""The render worker: ``celery -A jacana_multimodal.worker worker -Q jacana.video
--concurrency 1`` (one worker per GPU; the queue name is ``service.RENDER_QUEUE``).

``app`` is built on first access (module ``__getattr__``), from ``MultimodalSettings``, so
importing this module reads no settings and connects nowhere. Celery's prefork pool runs
the render in a child process: when that child dies mid-render (SIGKILL, out of memory)
the parent rejects the message and the broker re-queues it (``task_reject_on_worker_lost``
with late acknowledgement); when the whole worker dies, the broker re-delivers the message
after its visibility timeout. Either way ``jacana_jobs.run_job`` starts the job again from
its record: the same parameters, the same seed, the same artifact keys.

Per-process state: ``_models`` caches each loaded model (model id -> ``VideoModel``) for
the life of the pool process; nothing else outlives a task.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

import numpy as np
import redis
from celery import Celery

from jacana_jobs import (
    ArtifactStorage,
    JobContext,
    JobFailure,
    JobStore,
    LocalStorage,
    job_worker_app,
    lazy_app,
)
from jacana_multimodal.artifacts import artifact_key, input_key
from jacana_multimodal.requests import VideoParams
from jacana_multimodal.service import RENDER_QUEUE, RENDER_TASK
from jacana_multimodal.settings import MultimodalSettings

log = logging.getLogger(__name__)

# Denoising moves progress up to this; encoding the files takes it to 100 on completion.
DENOISING_SHARE = 95.0

_models: dict[str, Any] = {}


@cache
def _settings() -> MultimodalSettings:
    return MultimodalSettings.load()


@cache
def _store() -> JobStore:
    return JobStore(redis.Redis.from_url(_settings().redis_url))


@cache
def _storage() -> ArtifactStorage:
    return LocalStorage(_settings().storage_dir)


def _model(model_id: str):
    """The loaded model for ``model_id`` (loaded on first use in this process)."""
    if model_id not in _models:
        from jacana_multimodal.pipelines.registry import load_model
        from jacana_multimodal.pipelines.wan import default_device_and_dtype

        settings = _settings()
        specs = {spec.id: spec for spec in settings.model_specs()}
        if model_id not in specs:
            raise JobFailure("model_not_found", f"this worker does not serve {model_id!r}")
        device, dtype = default_device_and_dtype()
        if settings.device == "cpu":
            import torch

            device, dtype = "cpu", torch.float32
        log.info("loading %s on %s", model_id, device)
        cache_dir = settings.cache_dir.expanduser()
        _models[model_id] = load_model(
            specs[model_id], cache_dir, device, dtype, cuda_compile=settings.cuda_compile
        )
    return _models[model_id]


def _reference_image(storage: ArtifactStorage, job_id: str) -> np.ndarray:
    from PIL import Image

    with storage.open(input_key(job_id)) as f:
        return np.asarray(Image.open(f).convert("RGB"))


def render_video(ctx: JobContext) -> dict[str, str]:
    """The task body: render the job's request, write its three files, return their keys.
    Progress is reported after every denoising step, where a deleted job stops the render
    (``set_progress`` raises once the record is gone)."""
    from jacana_multimodal.media.encode import encode_mp4, encode_spritesheet, encode_thumbnail

    job_id = ctx.record.id
    params = VideoParams.from_json(ctx.record.params)
    storage = _storage()
    model = _model(ctx.record.model)
    reference = _reference_image(storage, job_id) if params.has_input else None

    def on_step(done: int, total: int) -> None:
        ctx.progress(DENOISING_SHARE * done / total)
        ctx.check_cancelled()

    frames = model.render(params.render_request(reference), on_step)
    keys = {variant: artifact_key(job_id, variant) for variant in ("video", "thumbnail")}
    keys["spritesheet"] = artifact_key(job_id, "spritesheet")
    with storage.writer(keys["video"]) as f:
        encode_mp4(frames, params.fps, f)
    with storage.writer(keys["thumbnail"]) as f:
        f.write(encode_thumbnail(frames))
    with storage.writer(keys["spritesheet"]) as f:
        f.write(encode_spritesheet(frames))
    return keys


def create_app(settings: MultimodalSettings | None = None) -> Celery:
    """The Celery app with the render task registered on ``RENDER_QUEUE``."""
    settings = settings or _settings()
    return job_worker_app(
        "jacana_multimodal",
        settings.redis_url,
        RENDER_QUEUE,
        settings,
        RENDER_TASK,
        render_video,
        store=_store,
        storage=_storage,
    )


# ``celery -A jacana_multimodal.worker`` finds ``app`` here, built on first use.
__getattr__ = lazy_app(create_app)
