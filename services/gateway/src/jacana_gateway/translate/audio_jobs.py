"""/v1/audio/transcriptions/jobs between HTTP and gRPC: the service's
``CreateTranscriptionJobRequest`` for a checked upload and its job as the API shows it.
Pure functions, no I/O.

The job object: ``{id, object: "audio.transcription.job", model, status, progress,
duration, created_at, completed_at, expires_at, response_format, language, error}``.
``status`` is queued, in_progress, completed or failed; ``progress`` the seconds of audio
transcribed so far, ``duration`` the upload's length in seconds (null until known);
``completed_at`` and ``error`` (``{code, message}``) null while unset, ``language`` null
when it is to be detected. The result itself is rendered by
:mod:`jacana_gateway.translate.audio` in any ``response_format``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb
from jacana_gateway.schemas.audio import AudioRequest
from jacana_gateway.translate.audio import transcribe_request

JOB_OBJECT = "audio.transcription.job"


def create_job_request(
    body: AudioRequest, request_id: str, trace: Mapping[str, str]
) -> pb.CreateTranscriptionJobRequest:
    """``body`` as the service's CreateTranscriptionJobRequest (no ``model``, as for
    Transcribe: the gateway's name for the model may differ from the service's)."""
    return pb.CreateTranscriptionJobRequest(
        request=transcribe_request(body, request_id),
        response_format=body.response_format,
        trace_context=dict(trace),
    )


def job_object(job: pb.TranscriptionJob) -> dict[str, Any]:
    """The job as the API shows it (``model``: the name the service gives its model)."""
    return {
        "id": job.id,
        "object": JOB_OBJECT,
        "model": job.model,
        "status": job.status,
        "progress": job.progress_seconds,
        "duration": job.duration if job.HasField("duration") else None,
        "created_at": job.created_at,
        "completed_at": job.completed_at if job.HasField("completed_at") else None,
        "expires_at": job.expires_at,
        "response_format": job.response_format or "json",
        "language": job.language or None,
        "error": (
            {"code": job.error.code, "message": job.error.message}
            if job.HasField("error")
            else None
        ),
    }


def job_deleted(reply: pb.DeleteTranscriptionJobResponse, job_id: str) -> dict[str, Any]:
    return {"id": reply.job_id or job_id, "object": f"{JOB_OBJECT}.deleted", "deleted": True}
