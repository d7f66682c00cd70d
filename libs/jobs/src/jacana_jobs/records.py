"""The job record: what a long job is, which states it passes through, and its Redis form.

A ``JobRecord`` is an immutable snapshot. The record's owner is the Redis hash that
``JobStore`` writes; a snapshot is never written back as a whole, only through the store's
transitions. Invariants every record satisfies:

- ``status`` moves only along ``ALLOWED_TRANSITIONS``: queued → in_progress →
  completed | failed | cancelled, queued → failed | cancelled, and in_progress →
  in_progress (a re-delivered task starts again). Terminal states never change.
- ``progress`` is within [0, 100] and never decreases; a completed job has 100.
- ``error`` is set exactly when ``status`` is failed; ``artifacts`` only when completed.
- Times are Unix seconds (float); ``expires_at`` is fixed at creation and the Redis hash
  expires at that instant.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class JobError(Exception):
    """Base of the errors the job machinery raises on purpose."""


class JobNotFound(JobError, KeyError):
    """No record with this id (never created, deleted, or expired)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id

    def __str__(self) -> str:
        return f"no job {self.job_id!r}"


class IllegalTransition(JobError):
    """A transition the record's current status does not allow (e.g. completing a
    cancelled job)."""

    def __init__(self, job_id: str, current: JobStatus, wanted: JobStatus) -> None:
        super().__init__(f"job {job_id!r} cannot go from {current.value} to {wanted.value}")
        self.job_id = job_id
        self.current = current
        self.wanted = wanted


class JobStatus(StrEnum):
    """The life of a job. The values are the OpenAI Videos API's status strings."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """True for completed, failed and cancelled: nothing moves the job any more."""
        return self in TERMINAL

    def can_become(self, other: JobStatus) -> bool:
        return other in ALLOWED_TRANSITIONS[self]


TERMINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})

ALLOWED_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.IN_PROGRESS, JobStatus.FAILED, JobStatus.CANCELLED}),
    # in_progress → in_progress: a task re-delivered after its worker died starts again.
    JobStatus.IN_PROGRESS: frozenset(
        {JobStatus.IN_PROGRESS, JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    JobStatus.COMPLETED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}


@dataclass(frozen=True)
class ErrorInfo:
    """Why a job failed: a machine-readable ``code`` and a human ``message``."""

    code: str
    message: str


_TIME_FIELDS = ("started_at", "completed_at")


@dataclass(frozen=True)
class JobRecord:
    """One job as the store last saw it.

    ``id`` is ``<kind>_<32 hex>``; ``kind`` names the job family ("video", "transcription");
    ``model`` the model that runs it; ``params`` the JSON-able request the worker needs;
    ``artifacts`` maps a variant name ("video", "thumbnail") to a storage key; ``attempts``
    counts the starts (more than one means a re-delivery after a lost worker).
    """

    id: str
    kind: str
    model: str
    status: JobStatus
    created_at: float
    expires_at: float
    progress: float = 0.0
    started_at: float | None = None
    completed_at: float | None = None
    error: ErrorInfo | None = None
    artifacts: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0

    def to_mapping(self) -> dict[str, str]:
        """The Redis hash form: every value a string; absent optionals are left out."""
        out = {
            "id": self.id,
            "kind": self.kind,
            "model": self.model,
            "status": self.status.value,
            "progress": repr(float(self.progress)),
            "created_at": repr(float(self.created_at)),
            "expires_at": repr(float(self.expires_at)),
            "artifacts": json.dumps(self.artifacts, sort_keys=True),
            "params": json.dumps(self.params, sort_keys=True),
            "attempts": str(int(self.attempts)),
        }
        for name in _TIME_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = repr(float(value))
        if self.error is not None:
            out["error_code"] = self.error.code
            out["error_message"] = self.error.message
        return out

    @classmethod
    def from_mapping(cls, mapping: dict[str, str] | dict[bytes, bytes]) -> JobRecord:
        """Inverse of ``to_mapping``; accepts the bytes a plain ``redis.Redis`` returns."""
        m = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in mapping.items()
        }
        error = None
        if "error_code" in m:
            error = ErrorInfo(code=m["error_code"], message=m.get("error_message", ""))
        return cls(
            id=m["id"],
            kind=m["kind"],
            model=m["model"],
            status=JobStatus(m["status"]),
            progress=float(m.get("progress", 0.0)),
            created_at=float(m["created_at"]),
            expires_at=float(m["expires_at"]),
            started_at=float(m["started_at"]) if "started_at" in m else None,
            completed_at=float(m["completed_at"]) if "completed_at" in m else None,
            error=error,
            artifacts=json.loads(m.get("artifacts", "{}")),
            params=json.loads(m.get("params", "{}")),
            attempts=int(m.get("attempts", 0)),
        )
