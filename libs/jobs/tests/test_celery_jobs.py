"""A real Celery worker process on a real redis-server runs job tasks end to end:
progress per step and completion, and cooperative cancellation within one step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from jacana_jobs import JobStatus, JobStore, make_celery
from jacana_jobs.celery_app import enqueue_job, queue_length

HERE = Path(__file__).resolve().parent
TASK = "jobs_test_app.steps"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, make_redis_server, poll):
    """redis-server plus one ``celery worker --pool solo`` subprocess, shared by the module."""
    tmp = tmp_path_factory.mktemp("celery")
    server = make_redis_server(tmp / "redis")
    worker = None
    try:
        server.start()
        env = {
            **os.environ,
            "JACANA_JOBS_TEST_REDIS": server.url,
            "JACANA_JOBS_TEST_STORAGE": str(tmp / "artifacts"),
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        }
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "jobs_test_app", "worker", "--pool", "solo",
             "--concurrency", "1", "--loglevel", "WARNING", "--without-gossip",
             "--without-mingle", "--without-heartbeat", "-n", f"test{os.getpid()}@%h"],
            env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        app = make_celery("client", server.url, visibility_timeout_s=60, longest_task_s=30)
        # The worker is ready when it answers a ping over the broker.
        poll(
            lambda: worker.poll() is not None or app.control.ping(timeout=0.5),
            30, "the celery worker to answer a ping",
        )  # fmt: skip
        if worker.poll() is not None:
            pytest.fail(f"celery worker exited: {worker.stdout.read().decode()[-3000:]}")
        yield server, app, tmp / "artifacts"
    finally:
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(5)
        server.stop()


def test_a_worker_runs_a_job_with_progress_to_completion(stack, poll):
    server, app, artifacts = stack
    store = JobStore(redis.Redis.from_url(server.url))
    job = store.create("test", "tiny", {"steps": 4, "step_s": 0.15}, ttl_s=120)
    traceparent = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    sent = enqueue_job(app, TASK, job.id, headers={"traceparent": traceparent})
    seen: set[float] = set()

    def finished() -> bool:
        rec = store.get(job.id)
        seen.add(rec.progress)
        return rec.status.terminal

    poll(finished, 20, "the job to finish")
    rec = store.get(job.id)
    assert rec.status is JobStatus.COMPLETED, rec
    assert rec.progress == 100.0 and rec.attempts == 1 and rec.error is None
    assert rec.artifacts == {"result": f"test/{job.id}.txt"}
    assert (artifacts / "test" / f"{job.id}.txt").read_bytes() == b"4 steps"
    assert seen & {25.0, 50.0, 75.0}, f"no intermediate progress seen: {sorted(seen)}"
    assert sent.get(timeout=10) == "completed"
    # A second delivery of the task for a completed job does nothing.
    assert enqueue_job(app, TASK, job.id).get(timeout=10) == "skipped"
    assert store.get(job.id) == rec


def test_a_running_job_is_cancelled_within_one_step(stack, poll):
    server, app, artifacts = stack
    store = JobStore(redis.Redis.from_url(server.url))
    step_s = 0.5
    job = store.create("test", "tiny", {"steps": 40, "step_s": step_s}, ttl_s=120)
    enqueue_job(app, TASK, job.id)
    poll(lambda: store.get(job.id).progress > 0, 20, "the job to make progress")
    store.request_cancel(job.id)
    asked = time.monotonic()
    poll(lambda: store.get(job.id).status.terminal, 10, "the job to stop")
    stopped_after = time.monotonic() - asked
    rec = store.get(job.id)
    assert rec.status is JobStatus.CANCELLED and rec.artifacts == {}
    assert rec.progress < 100.0
    assert stopped_after < 2 * step_s + 0.5, f"took {stopped_after:.2f}s to stop"
    assert not (artifacts / "test" / f"{job.id}.txt").exists()


def test_queue_length_counts_waiting_messages(stack, poll):
    server, app, _ = stack
    for i in range(3):
        enqueue_job(app, "nobody.consumes", f"test_{i}", queue="idle")
    assert queue_length(server.client(), "idle") == 3


def test_visibility_timeout_must_exceed_the_longest_task():
    with pytest.raises(ValueError, match="must exceed longest_task_s"):
        make_celery("x", "redis://127.0.0.1:1/0", visibility_timeout_s=60, longest_task_s=60)
    app = make_celery("x", "redis://127.0.0.1:1/0", visibility_timeout_s=90, longest_task_s=60)
    conf = app.conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    assert conf.broker_transport_options["visibility_timeout"] == 90
    assert conf.result_backend == "redis://127.0.0.1:1/0"
