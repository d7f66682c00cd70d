"""``JobQueueSettings`` as a service's settings mixin: the service's prefix names its
variables, and a visibility timeout that does not exceed the longest job is refused."""

from __future__ import annotations

import pytest
from pydantic_settings import SettingsConfigDict

from jacana_common.settings import ServiceSettings
from jacana_jobs.settings import JobQueueSettings


class ExampleSettings(ServiceSettings, JobQueueSettings):
    model_config = SettingsConfigDict(env_prefix="JACANA_EXAMPLE_", extra="ignore", frozen=True)


def test_the_service_prefix_names_the_variables(monkeypatch) -> None:
    monkeypatch.setenv("JACANA_EXAMPLE_JOB_TTL_S", "60")
    monkeypatch.setenv("JACANA_EXAMPLE_MAX_QUEUED_JOBS", "3")
    settings = ExampleSettings()
    assert (settings.job_ttl_s, settings.max_queued_jobs) == (60.0, 3)
    assert settings.visibility_timeout_s > settings.longest_job_s


def test_a_visibility_timeout_within_the_longest_job_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("JACANA_EXAMPLE_LONGEST_JOB_S", "100")
    monkeypatch.setenv("JACANA_EXAMPLE_VISIBILITY_TIMEOUT_S", "100")
    with pytest.raises(SystemExit, match="visibility_timeout_s must exceed longest_job_s"):
        ExampleSettings.load()
