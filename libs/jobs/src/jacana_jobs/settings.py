"""How a service's job queue behaves: the settings every service with long jobs shares.

``JobQueueSettings`` is a mixin for a service's pydantic-settings class (it declares the
fields; the service's own ``env_prefix`` names the variables: ``JACANA_MULTIMODAL_JOB_TTL_S``,
``JACANA_ASR_JOB_TTL_S``). Where Redis is and where files go stay the service's own fields,
since their defaults and meaning differ per service.

Invariant (checked at start-up): ``visibility_timeout_s`` exceeds ``longest_job_s``, or the
broker would hand a job that is still running to a second worker.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, Field, model_validator


class JobQueueSettings(BaseModel):
    """Expiry, admission and re-delivery of one service's jobs."""

    job_ttl_s: float = Field(
        86_400.0,
        gt=0.0,
        le=30 * 86_400.0,
        description="How long a job (its record and files) lives after it is created; the "
        "job's expires_at.",
    )
    max_queued_jobs: int = Field(
        64, ge=1, le=100_000, description="Jobs waiting at most; beyond it a create is a 429."
    )
    retry_after_s: int = Field(
        10, ge=1, le=3600, description="The Retry-After a 429 (job queue full) suggests."
    )
    longest_job_s: float = Field(
        4 * 3600.0, gt=0.0, le=7 * 86_400.0, description="The longest one job may run."
    )
    visibility_timeout_s: float = Field(
        8 * 3600.0,
        gt=0.0,
        le=14 * 86_400.0,
        description="Seconds after which the broker hands an unacknowledged job (its worker "
        "died) to another worker; must exceed longest_job_s.",
    )
    restore_interval_s: float = Field(
        10.0, gt=0.0, le=3600.0, description="How often a worker looks for jobs whose worker died."
    )
    max_attempts: int = Field(
        3, ge=1, le=100, description="Starts of one job before it is failed for good."
    )
    sweep_interval_s: float = Field(
        60.0, gt=0.0, le=86_400.0, description="How often expired jobs' files are deleted."
    )

    @model_validator(mode="after")
    def _visibility_exceeds_the_longest_job(self) -> Self:
        if self.visibility_timeout_s <= self.longest_job_s:
            raise ValueError(
                "visibility_timeout_s must exceed longest_job_s, or a running job is handed "
                "to a second worker"
            )
        return self
