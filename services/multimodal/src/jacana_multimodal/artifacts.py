"""Where a video's files live in the artifact storage: one place that names the keys.

Every key derives from the job id, so a re-delivered render overwrites its own files
(renders are idempotent per id) and the sweeper can delete a reference image from the id
alone. ``VARIANTS`` are what ``GET /v1/videos/{id}/content?variant=`` serves.
"""

from __future__ import annotations

# variant -> (file name, content type)
VARIANTS: dict[str, tuple[str, str]] = {
    "video": ("video.mp4", "video/mp4"),
    "thumbnail": ("thumbnail.webp", "image/webp"),
    "spritesheet": ("spritesheet.jpg", "image/jpeg"),
}


def artifact_key(job_id: str, variant: str) -> str:
    return f"videos/{job_id}/{VARIANTS[variant][0]}"


def input_key(job_id: str) -> str:
    """The reference image uploaded with the request (PNG, already at the render size)."""
    return f"inputs/{job_id}.png"
