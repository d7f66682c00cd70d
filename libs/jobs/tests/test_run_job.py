"""run_job, the job-task lifecycle, in this process against a real redis-server: every
way a task can end, re-delivery, and idempotence per job id."""

from __future__ import annotations

import pytest

from jacana_jobs import JobCancelled, JobFailure, JobStatus, JobStore, LocalStorage, run_job


@pytest.fixture
def store(redis_server) -> JobStore:
    return JobStore(redis_server.client())


def test_completes_with_progress_and_is_idempotent(store):
    job = store.create("test", "m", {"n": 3}, 60)
    progress_seen = []

    def body(ctx):
        assert ctx.record.status is JobStatus.IN_PROGRESS and ctx.record.attempts == 1
        for i in range(ctx.record.params["n"]):
            ctx.check_cancelled()
            ctx.progress(100 * (i + 1) / 3)
            progress_seen.append(store.get(job.id).progress)
        return {"out": "k"}

    assert run_job(store, job.id, body) == "completed"
    assert progress_seen == pytest.approx([100 / 3, 200 / 3, 100])
    assert store.get(job.id).artifacts == {"out": "k"}
    assert run_job(store, job.id, lambda ctx: pytest.fail("ran twice")) == "skipped"
    assert run_job(store, "test_missing", lambda ctx: pytest.fail("ran")) == "skipped"


def test_failure_codes(store):
    def refuse(ctx):
        raise JobFailure("unsupported_size", "size 7x7 is not supported")

    def crash(ctx):
        raise ZeroDivisionError("boom")

    a, b = store.create("test", "m", {}, 60), store.create("test", "m", {}, 60)
    assert run_job(store, a.id, refuse) == "failed"
    assert run_job(store, b.id, crash) == "failed"
    assert store.get(a.id).error.code == "unsupported_size"
    assert store.get(b.id).error.code == "internal_error"
    assert "ZeroDivisionError: boom" in store.get(b.id).error.message


def test_cancel_before_start_and_during_run(store):
    early = store.create("test", "m", {}, 60)
    store.request_cancel(early.id)
    assert run_job(store, early.id, lambda ctx: pytest.fail("ran")) == "cancelled"
    assert store.get(early.id).status is JobStatus.CANCELLED

    job = store.create("test", "m", {}, 60)

    def body(ctx):
        ctx.progress(10)
        store.request_cancel(job.id)
        ctx.check_cancelled()
        pytest.fail("check_cancelled did not raise")

    assert run_job(store, job.id, body) == "cancelled"
    rec = store.get(job.id)
    assert rec.status is JobStatus.CANCELLED and rec.progress == 10
    with pytest.raises(JobCancelled):
        from jacana_jobs import JobContext

        JobContext(store, rec).check_cancelled()


def test_redelivery_restarts_and_gives_up_after_max_attempts(store):
    job = store.create("test", "m", {}, 60)
    store.start(job.id)  # a worker started it and died
    attempts = []
    assert run_job(store, job.id, lambda ctx: attempts.append(ctx.record.attempts) or {}) == (
        "completed"
    )
    assert attempts == [2]

    poison = store.create("test", "m", {}, 60)
    for _ in range(3):
        store.start(poison.id)  # three workers died on it
    assert run_job(store, poison.id, lambda ctx: pytest.fail("ran"), max_attempts=3) == "failed"
    assert store.get(poison.id).error.code == "too_many_attempts"


def test_artifacts_of_a_job_deleted_mid_run_are_removed(store, tmp_path):
    storage = LocalStorage(tmp_path)
    job = store.create("test", "m", {}, 60)

    def body(ctx):
        with storage.writer("test/out.bin") as f:
            f.write(b"x")
        store.delete(job.id)  # the user deleted it while the last step ran
        return {"out": "test/out.bin"}

    assert run_job(store, job.id, body, storage=storage) == "cancelled"
    assert not storage.exists("test/out.bin")
