"""The durable Celery app and the lifecycle of one job task.

``make_celery`` builds a Celery 5 app on Redis configured so that no accepted job is lost:
late acknowledgement, re-queue when the worker process dies, one task prefetched per worker
process, and a broker visibility timeout longer than the longest task (a shorter one would
hand a still-running task to a second worker).

``run_job`` is the job-task lifecycle, independent of Celery: it owns the status transitions
a worker makes (start → progress … → completed | failed | cancelled) and is idempotent per
job id: a re-delivered task for a finished job does nothing, one for a running job (its
worker died) starts it again. ``job_task`` registers a body as a Celery task that runs it.
The task body owns nothing in Redis; it reports through its ``JobContext``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable
from typing import Any, Literal

import redis
from celery import Celery
from celery.result import AsyncResult

from jacana_jobs.records import IllegalTransition, JobNotFound, JobRecord
from jacana_jobs.settings import JobQueueSettings
from jacana_jobs.storage import ArtifactStorage
from jacana_jobs.store import JobStore

log = logging.getLogger(__name__)

DEFAULT_MAX_ATTEMPTS = 3


def make_celery(
    name: str,
    broker_url: str,
    *,
    visibility_timeout_s: float,
    longest_task_s: float,
    result_backend_url: str | None = None,
    result_expires_s: float = 86400.0,
    restore_interval_s: float = 10.0,
    include: list[str] | None = None,
) -> Celery:
    """A Celery app on the Redis at ``broker_url`` (results there too unless
    ``result_backend_url``). ``visibility_timeout_s`` must exceed ``longest_task_s``:
    Redis re-delivers an unacknowledged task after the visibility timeout, and a worker
    looks for such tasks every ``restore_interval_s``."""
    for label, value in (
        ("visibility_timeout_s", visibility_timeout_s),
        ("longest_task_s", longest_task_s),
        ("result_expires_s", result_expires_s),
        ("restore_interval_s", restore_interval_s),
    ):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{label} must be a positive finite number, got {value!r}")
    if visibility_timeout_s <= longest_task_s:
        raise ValueError(
            f"visibility_timeout_s ({visibility_timeout_s}) must exceed longest_task_s "
            f"({longest_task_s}), or a running task is handed to a second worker"
        )
    app = Celery(name, broker=broker_url, backend=result_backend_url or broker_url)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={
            "visibility_timeout": visibility_timeout_s,
            # Scan for abandoned tasks on every sweep (kombu's default scans every tenth).
            "unacked_restore_interval": restore_interval_s,
            "unacked_restore_throttle": 1,
        },
        result_backend_transport_options={"visibility_timeout": visibility_timeout_s},
        result_expires=result_expires_s,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        include=include or [],
    )
    return app


def enqueue_job(
    app: Celery,
    task_name: str,
    job_id: str,
    *,
    headers: dict[str, str] | None = None,
    queue: str | None = None,
) -> AsyncResult:
    """Send the task for ``job_id`` (its only argument; idempotence is per job id, so a
    second send is harmless). ``headers`` travel with the message unchanged: the hook for
    trace context."""
    return app.send_task(task_name, args=(job_id,), headers=headers or {}, queue=queue)


def queue_length(client: redis.Redis, queue: str = "celery") -> int:
    """Messages waiting in a Celery queue on the Redis broker (every priority list)."""
    names = [queue, *(f"{queue}\x06\x16{p}" for p in range(1, 10))]
    pipe = client.pipeline(transaction=False)
    for n in names:
        pipe.llen(n)
    return sum(pipe.execute())


class JobCancelled(Exception):
    """Raised by ``JobContext.check_cancelled`` when the job's cancel flag is up."""


class JobFailure(Exception):
    """Raise from a task body to fail the job with a chosen ``code`` and ``message``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class JobContext:
    """What a task body gets: the record as started, ``progress(p)`` and
    ``check_cancelled()`` (call it between steps; it raises ``JobCancelled``)."""

    def __init__(self, store: JobStore, record: JobRecord) -> None:
        self._store = store
        self.record = record

    def progress(self, percent: float) -> None:
        self._store.set_progress(self.record.id, percent)

    def check_cancelled(self) -> None:
        if self._store.cancel_requested(self.record.id):
            raise JobCancelled(self.record.id)


Outcome = Literal["completed", "failed", "cancelled", "skipped"]
JobBody = Callable[[JobContext], dict[str, str]]


def run_job(
    store: JobStore,
    job_id: str,
    body: JobBody,
    *,
    storage: ArtifactStorage | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> Outcome:
    """Run ``body`` for ``job_id`` and record how it ended.

    - A missing or finished job: "skipped", the body does not run.
    - The cancel flag up before the start, or ``JobCancelled`` from the body: "cancelled".
    - The ``max_attempts``-th re-delivery (a task that keeps killing its worker): "failed".
    - ``JobFailure`` → failed with its code; any other exception → failed, code
      "internal_error" (logged with its traceback; not re-raised, the record holds it).
    - ``body`` returns artifacts (name → key): "completed". If the job was deleted or
      cancelled meanwhile, the artifacts are deleted from ``storage`` (when given).
    """
    try:
        record = store.get(job_id)
        if record.status.terminal:
            return "skipped"
        if store.cancel_requested(job_id):
            store.cancel(job_id)
            return "cancelled"
        record = store.start(job_id)
        if record.attempts > max_attempts:
            store.fail(job_id, "too_many_attempts", f"gave up after {max_attempts} attempts")
            return "failed"
    except (JobNotFound, IllegalTransition):
        return "skipped"  # deleted, expired, or finished by someone else meanwhile

    try:
        artifacts = body(JobContext(store, record))
    except JobCancelled:
        with contextlib.suppress(JobNotFound, IllegalTransition):  # deleted meanwhile
            store.cancel(job_id)
        return "cancelled"
    except (JobNotFound, IllegalTransition):
        return "cancelled"  # deleted or cancelled while progress was reported
    except Exception as exc:
        if isinstance(exc, JobFailure):
            code, message = exc.code, exc.message
        else:
            log.exception("job %s failed", job_id)
            code, message = "internal_error", f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(JobNotFound, IllegalTransition):  # deleted meanwhile
            store.fail(job_id, code, message)
        return "failed"

    try:
        store.complete(job_id, artifacts)
    except (JobNotFound, IllegalTransition):
        if storage is not None:
            for key in artifacts.values():
                storage.delete(key)
        return "cancelled"
    return "completed"


def job_task(
    app: Celery,
    name: str,
    *,
    store: Callable[[], JobStore],
    storage: Callable[[], ArtifactStorage] | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> Callable[[JobBody], Any]:
    """Decorator: register ``body(ctx) -> artifacts`` as the Celery task ``name`` taking a
    job id. ``store`` and ``storage`` are factories called in the worker at run time (so
    nothing connects at import)."""

    def register(body: JobBody) -> Any:
        @app.task(name=name)
        def task(job_id: str) -> str:
            log.info("%s %s: started", name, job_id)
            outcome = run_job(
                store(),
                job_id,
                body,
                storage=storage() if storage is not None else None,
                max_attempts=max_attempts,
            )
            log.info("%s %s: %s", name, job_id, outcome)
            return outcome

        return task

    return register


def job_worker_app(
    name: str,
    broker_url: str,
    queue: str,
    settings: JobQueueSettings,
    task_name: str,
    body: JobBody,
    *,
    store: Callable[[], JobStore],
    storage: Callable[[], ArtifactStorage],
) -> Celery:
    """A worker's Celery app: ``make_celery`` with the timeouts of ``settings``, tasks sent
    to ``queue`` by default, and ``body`` registered as the job task ``task_name``."""
    app = make_celery(
        name,
        broker_url,
        visibility_timeout_s=settings.visibility_timeout_s,
        longest_task_s=settings.longest_job_s,
        restore_interval_s=settings.restore_interval_s,
    )
    app.conf.task_default_queue = queue
    job_task(app, task_name, store=store, storage=storage, max_attempts=settings.max_attempts)(body)
    return app


def lazy_app(factory: Callable[[], Celery]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that builds the worker's Celery app on the first access of
    ``app`` (what ``celery -A <module>`` looks up) and returns the same app after, so that
    importing a worker module reads no settings and connects nowhere."""
    build = functools.cache(factory)

    def module_getattr(name: str) -> Any:
        if name == "app":
            return build()
        raise AttributeError(f"module has no attribute {name!r}")

    return module_getattr
