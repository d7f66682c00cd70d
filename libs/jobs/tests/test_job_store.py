"""JobStore against a real redis-server: every operation and transition, pagination,
expiry, atomicity under concurrent clients, and records surviving a Redis restart."""

from __future__ import annotations

import threading
import time

import pytest

from jacana_jobs import IllegalTransition, JobNotFound, JobRecord, JobStatus, JobStore
from jacana_jobs.records import ALLOWED_TRANSITIONS


@pytest.fixture
def store(redis_server) -> JobStore:
    return JobStore(redis_server.client())


def test_create_and_get_round_trip(store):
    rec = store.create("video", "wan-tiny-random", {"prompt": "a fox", "seconds": 4}, ttl_s=60)
    assert rec.id.startswith("video_") and len(rec.id) == len("video_") + 32
    assert rec.status is JobStatus.QUEUED and rec.progress == 0.0 and rec.attempts == 0
    assert rec.expires_at == pytest.approx(rec.created_at + 60)
    assert store.get(rec.id) == rec
    assert store.create("video", "m", {}, 60).id != rec.id


def test_record_mapping_round_trip_with_every_field():
    from jacana_jobs.records import ErrorInfo

    rec = JobRecord(
        id="video_x", kind="video", model="m", status=JobStatus.FAILED, created_at=1.5,
        expires_at=2.5, progress=42.25, started_at=1.75, completed_at=2.0,
        error=ErrorInfo("oom", "out of memory"), artifacts={"video": "v/x.mp4"},
        params={"a": [1, 2], "b": None}, attempts=2,
    )  # fmt: skip
    assert JobRecord.from_mapping(rec.to_mapping()) == rec
    as_bytes = {k.encode(): v.encode() for k, v in rec.to_mapping().items()}
    assert JobRecord.from_mapping(as_bytes) == rec


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "Video", "ttl_s": 60},
        {"kind": "video_x", "ttl_s": 60},
        {"kind": "video", "ttl_s": 0},
        {"kind": "video", "ttl_s": float("inf")},
    ],
)
def test_create_rejects_bad_input(store, kwargs):
    with pytest.raises(ValueError):
        store.create(model="m", params={}, **kwargs)


def test_create_rejects_params_that_are_not_json(store):
    with pytest.raises(TypeError):
        store.create("video", "m", {"x": object()}, 60)


def test_unknown_id_is_not_found(store):
    for op in (store.get, store.start, store.cancel, store.delete, store.request_cancel):
        with pytest.raises(JobNotFound):
            op("video_nope")


def test_happy_path_start_progress_complete(store):
    rec = store.create("video", "m", {}, 60)
    started = store.start(rec.id)
    assert started.status is JobStatus.IN_PROGRESS and started.attempts == 1
    assert started.started_at is not None and started.started_at >= rec.created_at
    assert store.set_progress(rec.id, 30).progress == 30
    assert store.set_progress(rec.id, 10).progress == 30  # monotone
    with pytest.raises(ValueError):
        store.set_progress(rec.id, 101)
    done = store.complete(rec.id, {"video": "video/x.mp4", "thumbnail": "video/x.jpg"})
    assert done.status is JobStatus.COMPLETED and done.progress == 100.0
    assert done.completed_at is not None and done.error is None
    assert store.get(rec.id) == done


def test_redelivered_start_counts_attempts_and_keeps_first_start_time(store):
    rec = store.create("video", "m", {}, 60)
    first = store.start(rec.id)
    store.set_progress(rec.id, 50)
    again = store.start(rec.id)
    assert again.status is JobStatus.IN_PROGRESS and again.attempts == 2
    assert again.started_at == first.started_at and again.progress == 50


def test_fail_records_the_error(store):
    rec = store.create("transcription", "whisper-tiny", {}, 60)
    failed = store.fail(rec.id, "decode_error", "bad audio")
    assert failed.status is JobStatus.FAILED
    assert (failed.error.code, failed.error.message) == ("decode_error", "bad audio")
    assert store.get(rec.id).error == failed.error


def _drive_to(store: JobStore, status: JobStatus) -> str:
    job_id = store.create("video", "m", {}, 60).id
    if status is JobStatus.QUEUED:
        return job_id
    store.start(job_id)
    {
        JobStatus.IN_PROGRESS: lambda: None,
        JobStatus.COMPLETED: lambda: store.complete(job_id, {}),
        JobStatus.FAILED: lambda: store.fail(job_id, "x", "y"),
        JobStatus.CANCELLED: lambda: store.cancel(job_id),
    }[status]()
    return job_id


@pytest.mark.parametrize("source", list(JobStatus), ids=str)
@pytest.mark.parametrize("target", [s for s in JobStatus if s is not JobStatus.QUEUED], ids=str)
def test_every_transition_is_allowed_or_refused_as_the_table_says(store, source, target):
    # Nothing moves a job back to queued: the table has no such edge and no method does it.
    assert all(JobStatus.QUEUED not in targets for targets in ALLOWED_TRANSITIONS.values())
    job_id = _drive_to(store, source)
    do = {
        JobStatus.IN_PROGRESS: lambda: store.start(job_id),
        JobStatus.COMPLETED: lambda: store.complete(job_id, {"a": "k"}),
        JobStatus.FAILED: lambda: store.fail(job_id, "c", "m"),
        JobStatus.CANCELLED: lambda: store.cancel(job_id),
    }[target]
    if target in ALLOWED_TRANSITIONS[source]:
        assert do().status is target
    else:
        with pytest.raises(IllegalTransition, match=f"from {source.value} to {target.value}"):
            do()
        assert store.get(job_id).status is source


def test_progress_needs_a_running_job(store):
    job_id = store.create("video", "m", {}, 60).id
    with pytest.raises(IllegalTransition):
        store.set_progress(job_id, 5)


def test_cancel_flag(store):
    job_id = store.create("video", "m", {}, 60).id
    assert not store.cancel_requested(job_id)
    store.request_cancel(job_id)
    assert store.cancel_requested(job_id)
    assert store.get(job_id).status is JobStatus.QUEUED  # only the worker (or service) cancels
    assert store.cancel_requested("video_gone")  # nothing to run for


def test_delete_returns_artifact_keys_and_flags_a_running_worker(store):
    done = _drive_to(store, JobStatus.IN_PROGRESS)
    store.complete(done, {"video": "v/a.mp4", "thumbnail": "v/a.jpg"})
    assert store.delete(done) == ["v/a.jpg", "v/a.mp4"]
    with pytest.raises(JobNotFound):
        store.get(done)
    assert all(e.id != done for e in store.expired_artifacts(now=time.time() + 3600))
    running = _drive_to(store, JobStatus.IN_PROGRESS)
    assert store.delete(running) == []
    assert store.cancel_requested(running)
    assert [r.id for r in store.list("video", limit=100).records] == []


def test_list_paginates_in_both_orders(store):
    ids = [store.create("video", "m", {"i": i}, 60).id for i in range(7)]
    store.create("transcription", "m", {}, 60)  # another kind stays out of the listing
    for order, expected in (("asc", ids), ("desc", ids[::-1])):
        seen, after, pages = [], None, 0
        while True:
            page = store.list("video", after=after, limit=3, order=order)
            seen += [r.id for r in page.records]
            pages += 1
            if not page.has_more:
                break
            after = page.records[-1].id
        assert seen == expected and pages == 3
    assert store.list("video", limit=7).has_more is False
    with pytest.raises(JobNotFound):
        store.list("video", after="video_unknown")
    for bad in ({"limit": 0}, {"limit": 101}, {"order": "sideways"}):
        with pytest.raises(ValueError):
            store.list("video", **bad)


def test_expiry_removes_the_record_and_keeps_the_sweeper_index(store, redis_server, poll):
    short = store.create("video", "m", {}, ttl_s=0.3)
    store.start(short.id)
    store.complete(short.id, {"video": "video/s.mp4"})
    long = store.create("video", "m", {}, ttl_s=60)
    ttl_ms = redis_server.client().pttl(f"jacana:jobs:job:{short.id}")
    assert 0 < ttl_ms <= 300
    poll(lambda: not redis_server.client().exists(f"jacana:jobs:job:{short.id}"), 5, "expiry")
    with pytest.raises(JobNotFound):
        store.get(short.id)
    assert [r.id for r in store.list("video").records] == [long.id]
    expired = store.expired_artifacts()
    assert [(e.id, e.kind, e.artifacts) for e in expired] == [(short.id, "video", ("video/s.mp4",))]
    store.forget(expired[0])
    assert store.expired_artifacts() == []
    assert store.expired_artifacts(now=long.expires_at + 1)[0].id == long.id


def test_concurrent_clients_cannot_both_win_a_transition(store, redis_server):
    # Two clients race to finish each job, one completing and one cancelling: exactly one
    # wins every time, and the record holds the winner's outcome.
    stores = [JobStore(redis_server.client()), JobStore(redis_server.client())]
    job_ids = [_drive_to(store, JobStatus.IN_PROGRESS) for _ in range(40)]
    wins: list[list[str]] = [[], []]
    barrier = threading.Barrier(2)

    def racer(i: int) -> None:
        barrier.wait()
        for job_id in job_ids:
            try:
                if i == 0:
                    stores[0].complete(job_id, {"video": f"{job_id}.mp4"})
                else:
                    stores[1].cancel(job_id)
                wins[i].append(job_id)
            except IllegalTransition:
                pass

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(wins[0] + wins[1]) == sorted(job_ids)
    for job_id in job_ids:
        expected = JobStatus.COMPLETED if job_id in wins[0] else JobStatus.CANCELLED
        assert store.get(job_id).status is expected


def test_concurrent_progress_updates_are_not_lost(store, redis_server):
    job_id = _drive_to(store, JobStatus.IN_PROGRESS)
    values = {0: [i * 2.0 for i in range(50)], 1: [i * 2.0 + 1 for i in range(50)]}

    def writer(i: int) -> None:
        s = JobStore(redis_server.client())
        for v in values[i]:
            s.set_progress(job_id, v)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert store.get(job_id).progress == 99.0


def test_redis_restart_keeps_every_record(redis_server):
    store = JobStore(redis_server.client())
    queued = store.create("video", "m", {"prompt": "p"}, 60)
    running = _drive_to(store, JobStatus.IN_PROGRESS)
    store.set_progress(running, 40)
    done = _drive_to(store, JobStatus.IN_PROGRESS)
    store.complete(done, {"video": "v/d.mp4"})
    store.request_cancel(running)
    before = {j: store.get(j) for j in (queued.id, running, done)}

    proc = redis_server.proc
    redis_server.stop()  # SIGTERM
    assert proc.returncode == 0
    redis_server.start()

    store = JobStore(redis_server.client())
    assert {j: store.get(j) for j in before} == before
    assert store.cancel_requested(running)
    assert {r.id for r in store.list("video").records} == set(before)
    assert 0 < redis_server.client().pttl(f"jacana:jobs:job:{queued.id}") <= 60_000
