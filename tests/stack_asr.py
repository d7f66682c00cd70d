"""Start the real speech-to-text service, and a gateway in front of it, as processes on
free loopback ports (the helpers of :mod:`stack`, for the ASR stack).

The gateway serves speech-to-text alone (only ``JACANA_GATEWAY_ASR``), so no LLM is
loaded, and it is ready when ``/health`` reports the ASR service serving.

:class:`AsrJobStack` adds what transcription jobs need: a redis-server, the service
configured with it and Celery transcription workers. Each part can be stopped, killed and
started again on the same ports and data, which is what the durability tests do.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from job_stack import JobStack
from stack import (
    Service,
    start_grpc_service,
    start_service_gateway,
)

ASR_MODEL_ID = "whisper-tiny.en"
JOB_QUEUE = "jacana.transcription"
# Distinct sentences: repeated text compresses well, which sends a window into Whisper's
# sampled temperature fallback, and a sampled window is not reproducible across processes.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Speech recognition turns spoken words into written text.",
    "Please call Stella and ask her to bring these things from the store.",
    "Seven ships sailed north along the rocky coast before dawn.",
    "My grandmother grows tomatoes, beans and sunflowers in her garden.",
    "The library closes early on Sundays during the summer holidays.",
    "A train to the capital leaves every hour from platform nine.",
    "Heavy rain is expected tomorrow afternoon across the western valleys.",
    "The orchestra rehearsed the new symphony for three long weeks.",
    "Please remember to water the plants and feed the cat on Friday.",
    "Engineers measured the bridge again after the storm had passed.",
)


def speech_wav(
    directory: Path, name: str, sentences: tuple[str, ...] = SENTENCES, voice: str = "en"
) -> Path:
    """``sentences`` spoken by espeak-ng's ``voice`` (a language code), one after another,
    as a 16 kHz mono s16 wav (about 3.5 s a sentence). Skips the test when espeak-ng or sox
    is missing."""
    missing = [b for b in ("espeak-ng", "sox") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} on PATH")
    parts = []
    for i, sentence in enumerate(sentences):
        raw = directory / f"{name}-{i}.raw.wav"
        command = ["espeak-ng", "-v", voice, "-w", str(raw), sentence]
        subprocess.run(command, check=True, timeout=60)
        parts.append(str(raw))
    out = directory / f"{name}.wav"
    subprocess.run(
        ["sox", "-R", *parts, "-r", "16000", "-c", "1", "-b", "16", str(out)],
        check=True,
        timeout=60,
    )
    return out


def start_asr(**env: str) -> Service:
    """``python -m jacana_asr`` (Whisper tiny.en) on a free port; waits for SERVING."""
    return start_grpc_service("jacana_asr", "JACANA_ASR_", **env)


def start_asr_gateway(asr: dict[str, list[str]], **env: str) -> Service:
    """A gateway serving only ``asr`` (model -> endpoints); waits for /health 200."""
    return start_service_gateway("ASR", asr, **env)


class AsrJobStack(JobStack):
    """Redis, the ASR service with jobs on, transcription workers and a gateway."""

    module = "jacana_asr"
    prefix = "JACANA_ASR_"
    worker_app = "jacana_asr.worker"
    queue = JOB_QUEUE
    gateway_map = "ASR"

    @property
    def env(self) -> dict[str, str]:
        """What the service and the workers share. One torch thread in both, so a job's
        result and a synchronous transcription run the same arithmetic."""
        return {
            "JACANA_ASR_REDIS_URL": self.redis.url,
            "JACANA_ASR_STORAGE_DIR": str(self.storage_dir),
            "JACANA_ASR_NUM_THREADS": "1",
            # A dead worker's job is handed on within seconds, not hours.
            "JACANA_ASR_LONGEST_JOB_S": "20",
            "JACANA_ASR_VISIBILITY_TIMEOUT_S": "25",
            "JACANA_ASR_RESTORE_INTERVAL_S": "1",
            "OMP_NUM_THREADS": "1",
            **self.extra_env,
        }

    @property
    def storage_dir(self) -> Path:
        return self.root / "transcriptions"

    @property
    def models(self) -> list[str]:
        return [ASR_MODEL_ID]


def start_asr_job_stack(root: Path, workers: int = 1, **extra_env: str) -> AsrJobStack:
    """Redis, the ASR service with jobs on, ``workers`` transcription workers, a gateway."""
    return AsrJobStack.start(root, workers, **extra_env)
