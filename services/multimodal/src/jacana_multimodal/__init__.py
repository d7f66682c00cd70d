"""Jacana's video service.

- ``server``/``service``: the ``jacana.multimodal.v1.Multimodal`` gRPC service. It owns the
  video job API: it validates a request against the model's card, writes the job record
  (``jacana_jobs.JobStore``) and queues the render; it never renders.
- ``worker``: the Celery app and the render task, run by ``celery -A jacana_multimodal.worker
  worker`` (one process per GPU, concurrency 1).
- ``pipelines``: the video models (diffusers pipelines) behind one interface, chosen by
  setting; ``media``: MP4, thumbnail and spritesheet encoding.

Importing this package has no side effects.
"""
