"""Shared job machinery for long work (video renders, long-audio transcriptions).

``records`` (the job record and its states), ``store`` (records in Redis), ``storage``
(artifact storage behind one interface), ``celery_app`` (the durable Celery app and the
job-task lifecycle), ``settings`` (the queue settings every job service shares) and
``service_loop`` (the sweep of expired files). Importing this package has no side effects.
"""

from jacana_jobs.celery_app import (
    JobCancelled,
    JobContext,
    JobFailure,
    enqueue_job,
    job_task,
    job_worker_app,
    lazy_app,
    make_celery,
    run_job,
)
from jacana_jobs.records import (
    ErrorInfo,
    IllegalTransition,
    JobError,
    JobNotFound,
    JobRecord,
    JobStatus,
)
from jacana_jobs.service_loop import sweep_forever
from jacana_jobs.settings import JobQueueSettings
from jacana_jobs.storage import (
    ArtifactStorage,
    InvalidKey,
    LocalStorage,
    make_storage,
    register_storage,
)
from jacana_jobs.store import ExpiredJob, JobPage, JobStore

__all__ = [
    "ArtifactStorage",
    "ErrorInfo",
    "ExpiredJob",
    "IllegalTransition",
    "InvalidKey",
    "JobCancelled",
    "JobContext",
    "JobError",
    "JobFailure",
    "JobNotFound",
    "JobPage",
    "JobQueueSettings",
    "JobRecord",
    "JobStatus",
    "JobStore",
    "LocalStorage",
    "enqueue_job",
    "job_task",
    "job_worker_app",
    "lazy_app",
    "make_celery",
    "make_storage",
    "register_storage",
    "run_job",
    "sweep_forever",
]
