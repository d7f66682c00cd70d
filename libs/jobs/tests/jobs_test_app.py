"""The Celery app the worker subprocess in test_celery_jobs.py runs (``celery -A
jobs_test_app worker``). Configuration comes from the environment the test sets:
JACANA_JOBS_TEST_REDIS (the test's redis-server URL) and JACANA_JOBS_TEST_STORAGE (a
directory)."""

from __future__ import annotations

import os
import time

import redis

from jacana_jobs import JobContext, JobStore, LocalStorage, job_task, make_celery

app = make_celery(
    "jobs_test_app",
    os.environ["JACANA_JOBS_TEST_REDIS"],
    visibility_timeout_s=60,
    longest_task_s=30,
)


def _store() -> JobStore:
    return JobStore(redis.Redis.from_url(os.environ["JACANA_JOBS_TEST_REDIS"]))


def _storage() -> LocalStorage:
    return LocalStorage(os.environ["JACANA_JOBS_TEST_STORAGE"])


@job_task(app, "jobs_test_app.steps", store=_store, storage=_storage)
def steps(ctx: JobContext) -> dict[str, str]:
    """``params.steps`` steps of ``params.step_s`` seconds each, progress after each, the
    cancel flag checked before each; writes one artifact."""
    n, step_s = int(ctx.record.params["steps"]), float(ctx.record.params["step_s"])
    for i in range(n):
        ctx.check_cancelled()
        time.sleep(step_s)
        ctx.progress(100.0 * (i + 1) / n)
    key = f"test/{ctx.record.id}.txt"
    with _storage().writer(key) as f:
        f.write(f"{n} steps".encode())
    return {"result": key}
