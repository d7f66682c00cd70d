"""Job records in Redis: create, read, list, and every status transition, atomically.

``JobStore`` owns these Redis keys under its namespace ``ns``:

- ``ns:job:<id>``      hash, the record (``JobRecord.to_mapping``); expires at ``expires_at``
- ``ns:cancel:<id>``   string, the cancel flag a worker polls; same expiry as the record
- ``ns:index:<kind>``  sorted set, id scored by ``created_at`` (listing and pagination)
- ``ns:expiry``        sorted set, id scored by ``expires_at``; outlives the record
- ``ns:tombstones``    hash, id → ``{"kind", "artifacts"}``; outlives the record

The last two are the sweeper's index: once Redis has expired a record, ``expired_artifacts``
still names its artifact keys, and ``forget`` drops the entry after the sweeper deleted them.

Every transition reads the record under WATCH and writes it in MULTI/EXEC (retried when
another client wrote in between), so two clients never both win a transition. Illegal
transitions raise ``IllegalTransition``; a missing record raises ``JobNotFound``.
Times are this host's wall clock (Unix seconds); Redis expires the hash at the same instant.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import redis

from jacana_jobs.records import (
    ErrorInfo,
    IllegalTransition,
    JobNotFound,
    JobRecord,
    JobStatus,
)

_KIND = re.compile(r"^[a-z][a-z0-9]{0,31}$")
_LIST_BATCH = 64
MAX_LIST_LIMIT = 100


@dataclass(frozen=True)
class JobPage:
    """One page of ``JobStore.list``: ``records`` in the requested order, ``has_more`` when
    a later page exists (pass the last record's id as ``after``)."""

    records: list[JobRecord]
    has_more: bool


@dataclass(frozen=True)
class ExpiredJob:
    """A job whose ``expires_at`` has passed: its artifact keys are the sweeper's to delete."""

    id: str
    kind: str
    artifacts: tuple[str, ...]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class JobStore:
    """Job records in one Redis database. Thread-safe as ``redis.Redis`` is (a pool)."""

    def __init__(self, client: redis.Redis, namespace: str = "jacana:jobs") -> None:
        self._r = client
        self._ns = namespace

    # -- keys --------------------------------------------------------------------------

    def _job_key(self, job_id: str) -> str:
        return f"{self._ns}:job:{job_id}"

    def _cancel_key(self, job_id: str) -> str:
        return f"{self._ns}:cancel:{job_id}"

    def _index_key(self, kind: str) -> str:
        return f"{self._ns}:index:{kind}"

    @property
    def _expiry_key(self) -> str:
        return f"{self._ns}:expiry"

    @property
    def _tombstones_key(self) -> str:
        return f"{self._ns}:tombstones"

    # -- create and read ---------------------------------------------------------------

    def create(self, kind: str, model: str, params: dict[str, Any], ttl_s: float) -> JobRecord:
        """A new queued job with id ``<kind>_<uuid hex>`` that expires ``ttl_s`` from now.

        ``kind`` is lower-case letters and digits (it prefixes the id); ``params`` must be
        JSON-serialisable; ``ttl_s`` is positive and finite."""
        if not _KIND.match(kind):
            raise ValueError(f"job kind must match {_KIND.pattern}, got {kind!r}")
        if not (isinstance(ttl_s, int | float) and math.isfinite(ttl_s) and ttl_s > 0):
            raise ValueError(f"ttl_s must be a positive finite number, got {ttl_s!r}")
        json.dumps(params)  # raises TypeError now rather than in a worker later
        now = time.time()
        record = JobRecord(
            id=f"{kind}_{uuid.uuid4().hex}",
            kind=kind,
            model=model,
            status=JobStatus.QUEUED,
            created_at=now,
            expires_at=now + float(ttl_s),
            params=dict(params),
        )
        key = self._job_key(record.id)
        pipe = self._r.pipeline(transaction=True)
        pipe.hset(key, mapping=record.to_mapping())
        pipe.pexpireat(key, int(record.expires_at * 1000))
        pipe.zadd(self._index_key(kind), {record.id: record.created_at})
        pipe.zadd(self._expiry_key, {record.id: record.expires_at})
        pipe.hset(self._tombstones_key, record.id, json.dumps({"kind": kind, "artifacts": []}))
        pipe.execute()
        return record

    def get(self, job_id: str) -> JobRecord:
        """The record, or ``JobNotFound`` when it never existed, was deleted or expired."""
        raw = self._r.hgetall(self._job_key(job_id))
        if not raw:
            raise JobNotFound(job_id)
        return JobRecord.from_mapping(raw)

    def list(
        self,
        kind: str,
        after: str | None = None,
        limit: int = 20,
        order: Literal["asc", "desc"] = "desc",
    ) -> JobPage:
        """Jobs of ``kind`` by creation time, OpenAI-style: ``after`` is the id the previous
        page ended with (``JobNotFound`` if it is not in the index), ``limit`` in
        [1, 100], ``order`` "asc" or "desc". Expired records are skipped."""
        if order not in ("asc", "desc"):
            raise ValueError(f"order must be 'asc' or 'desc', got {order!r}")
        if not (isinstance(limit, int) and 1 <= limit <= MAX_LIST_LIMIT):
            raise ValueError(f"limit must be an integer in [1, {MAX_LIST_LIMIT}], got {limit!r}")
        desc = order == "desc"
        key = self._index_key(kind)
        start = 0
        if after is not None:
            rank = self._r.zrevrank(key, after) if desc else self._r.zrank(key, after)
            if rank is None:
                raise JobNotFound(after)
            start = rank + 1
        records: list[JobRecord] = []
        while len(records) <= limit:
            ids = self._r.zrange(key, start, start + _LIST_BATCH - 1, desc=desc)
            if not ids:
                break
            start += len(ids)
            pipe = self._r.pipeline(transaction=False)
            for job_id in ids:
                pipe.hgetall(self._job_key(_text(job_id)))
            records.extend(JobRecord.from_mapping(raw) for raw in pipe.execute() if raw)
        return JobPage(records=records[:limit], has_more=len(records) > limit)

    # -- transitions -------------------------------------------------------------------

    def _update(
        self,
        job_id: str,
        wanted: JobStatus,
        change: Callable[[JobRecord], dict[str, Any]],
        only_from: JobStatus | None = None,
    ) -> JobRecord:
        """Atomically: read the record, check ``status → wanted`` is allowed (and that
        ``status`` is ``only_from`` when given), apply ``change`` (the fields to replace)
        and write it back."""
        key = self._job_key(job_id)

        def txn(pipe: redis.client.Pipeline) -> JobRecord:
            raw = pipe.hgetall(key)
            if not raw:
                raise JobNotFound(job_id)
            old = JobRecord.from_mapping(raw)
            if not old.status.can_become(wanted) or only_from not in (None, old.status):
                raise IllegalTransition(job_id, old.status, wanted)
            new = replace(old, status=wanted, **change(old))
            pipe.multi()
            pipe.hset(key, mapping=new.to_mapping())
            if new.artifacts != old.artifacts:
                tomb = {"kind": new.kind, "artifacts": sorted(new.artifacts.values())}
                pipe.hset(self._tombstones_key, job_id, json.dumps(tomb))
            return new

        return self._r.transaction(txn, key, value_from_callable=True)

    def start(self, job_id: str) -> JobRecord:
        """queued → in_progress, or in_progress → in_progress for a re-delivered task;
        ``attempts`` += 1; ``started_at`` is the first start's time."""
        return self._update(
            job_id,
            JobStatus.IN_PROGRESS,
            lambda r: {"attempts": r.attempts + 1, "started_at": r.started_at or time.time()},
        )

    def set_progress(self, job_id: str, progress: float) -> JobRecord:
        """Progress of a running job, in [0, 100]; a lower value than the stored one is
        ignored (progress never goes back, even when a re-delivered task starts over)."""
        if not (isinstance(progress, int | float) and 0.0 <= progress <= 100.0):
            raise ValueError(f"progress must be in [0, 100], got {progress!r}")
        return self._update(
            job_id,
            JobStatus.IN_PROGRESS,
            lambda r: {"progress": max(r.progress, progress)},
            only_from=JobStatus.IN_PROGRESS,
        )

    def complete(self, job_id: str, artifacts: dict[str, str]) -> JobRecord:
        """in_progress → completed with ``artifacts`` (variant name → storage key)."""
        artifacts = {str(k): str(v) for k, v in artifacts.items()}
        return self._update(
            job_id,
            JobStatus.COMPLETED,
            lambda r: {"progress": 100.0, "completed_at": time.time(), "artifacts": artifacts},
        )

    def fail(self, job_id: str, code: str, message: str) -> JobRecord:
        """queued | in_progress → failed with ``error = {code, message}``."""
        return self._update(
            job_id,
            JobStatus.FAILED,
            lambda r: {"completed_at": time.time(), "error": ErrorInfo(code, message)},
        )

    def cancel(self, job_id: str) -> JobRecord:
        """queued | in_progress → cancelled. The worker calls it when it stops on the flag;
        the service calls it directly for a job still queued."""
        return self._update(job_id, JobStatus.CANCELLED, lambda r: {"completed_at": time.time()})

    # -- cooperative cancellation ------------------------------------------------------

    def request_cancel(self, job_id: str) -> JobRecord:
        """Raise the cancel flag that the worker polls between steps. The record's status
        is unchanged; the worker moves it to cancelled when it stops."""
        record = self.get(job_id)
        self._r.set(self._cancel_key(job_id), "1", pxat=int(record.expires_at * 1000))
        return record

    def cancel_requested(self, job_id: str) -> bool:
        """True when the flag is up or the record is gone (deleted or expired): in both
        cases a worker has nothing left to run for."""
        pipe = self._r.pipeline(transaction=False)
        pipe.exists(self._cancel_key(job_id))
        pipe.exists(self._job_key(job_id))
        flag, record = pipe.execute()
        return bool(flag) or not record

    # -- delete and expiry -------------------------------------------------------------

    def delete(self, job_id: str) -> list[str]:
        """Remove the record and its index entries; return its artifact keys for the
        caller to delete from storage. A running job's worker sees ``cancel_requested``
        and stops at its next step."""
        key = self._job_key(job_id)

        def txn(pipe: redis.client.Pipeline) -> list[str]:
            raw = pipe.hgetall(key)
            if not raw:
                raise JobNotFound(job_id)
            record = JobRecord.from_mapping(raw)
            pipe.multi()
            pipe.delete(key)
            pipe.zrem(self._index_key(record.kind), job_id)
            pipe.zrem(self._expiry_key, job_id)
            pipe.hdel(self._tombstones_key, job_id)
            if not record.status.terminal:
                flag_until = max(record.expires_at, time.time() + 60.0)
                pipe.set(self._cancel_key(job_id), "1", pxat=int(flag_until * 1000))
            return sorted(record.artifacts.values())

        return self._r.transaction(txn, key, value_from_callable=True)

    def expired_artifacts(self, now: float | None = None, limit: int = 100) -> list[ExpiredJob]:
        """Up to ``limit`` jobs whose ``expires_at`` <= ``now`` (default: the clock), with
        the artifact keys they held. Call ``forget(id)`` once those are deleted."""
        now = time.time() if now is None else now
        ids = [_text(i) for i in self._r.zrangebyscore(self._expiry_key, "-inf", now, 0, limit)]
        if not ids:
            return []
        tombs = self._r.hmget(self._tombstones_key, ids)
        out = []
        for job_id, tomb in zip(ids, tombs, strict=True):
            info = json.loads(tomb) if tomb else {"kind": "", "artifacts": []}
            out.append(ExpiredJob(job_id, info["kind"], tuple(info["artifacts"])))
        return out

    def forget(self, expired: ExpiredJob) -> None:
        """Drop an expired job from the sweeper's index and the listing index."""
        pipe = self._r.pipeline(transaction=True)
        pipe.zrem(self._expiry_key, expired.id)
        pipe.hdel(self._tombstones_key, expired.id)
        if expired.kind:
            pipe.zrem(self._index_key(expired.kind), expired.id)
        pipe.execute()
