"""Environment settings of the video service and its render workers (prefix
``JACANA_MULTIMODAL_``).

One class serves both processes: the gRPC service (``python -m jacana_multimodal``) and
the Celery render worker (``celery -A jacana_multimodal.worker worker``) must agree on
Redis, the artifact directory, the models and the broker's timeouts, so they read the
same variables. Read once per process (``MultimodalSettings.load``).

The job queue's behaviour (expiry, admission, re-delivery) comes from
``jacana_jobs.JobQueueSettings``: a worker that died is noticed after at most
``visibility_timeout_s`` plus ``restore_interval_s``, and its render starts again on
another worker (renders are idempotent per job id).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from jacana_common.metrics import MetricsSettings
from jacana_common.settings import ServiceSettings
from jacana_jobs.settings import JobQueueSettings
from jacana_multimodal.pipelines.registry import ModelSpec, default_specs, parse_model_specs


class MultimodalSettings(ServiceSettings, MetricsSettings, JobQueueSettings):
    """Every knob of the video service and its workers, validated at start-up."""

    model_config = SettingsConfigDict(env_prefix="JACANA_MULTIMODAL_", extra="ignore", frozen=True)

    port: int = Field(50091, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        pattern=r"^rediss?://",
        description="Redis holding the job records, the render queue and Celery's results.",
    )
    storage_dir: Path = Field(
        Path(".run/videos"),
        description="Directory of the rendered artifacts (MP4, thumbnail, spritesheet) and "
        "uploaded reference images; the service and every worker must see the same one.",
    )
    models: str = Field(
        "",
        description='The video models, as JSON: a list of {"id", "architecture", '
        '"path"} (architectures: wan2.1-t2v, wan2.1-i2v; path: a diffusers directory). '
        "Empty: the embedded wan-tiny-random (random weights, noise frames). The first is "
        "the default model.",
    )
    cache_dir: Path = Field(
        Path("~/.cache/jacana/multimodal"),
        description="Where the embedded tiny model is built on first use.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Render device of the workers; auto: CUDA when present."
    )
    cuda_compile: bool = Field(
        True,
        description="torch.compile the video transformer's blocks when rendering on CUDA "
        "(1.26x faster per denoising step of Wan 2.1 1.3B at 832x480 on an H100; the same "
        "function, with fewer bfloat16 roundings). Once per worker process: the first "
        "render of each new size and length waits for it (about 10 s on an H100). Ignored "
        "on a CPU.",
    )

    @model_validator(mode="after")
    def _check(self) -> MultimodalSettings:
        self.model_specs()  # a bad MODELS value fails at start-up, not on first use
        return self

    def model_specs(self) -> list[ModelSpec]:
        """The configured models, the default first."""
        return parse_model_specs(self.models) if self.models.strip() else default_specs()
