"""Start the real speech-to-text service, and a gateway in front of it, as processes on
free loopback ports (the helpers of :mod:`stack`, for the ASR stack).

The gateway serves speech-to-text alone (only ``JACANA_GATEWAY_ASR``), so no LLM is
loaded, and it is ready when ``/health`` reports the ASR service serving.
"""

from __future__ import annotations

from stack import Service, start_grpc_service, start_service_gateway

ASR_MODEL_ID = "whisper-tiny.en"


def start_asr(**env: str) -> Service:
    """``python -m jacana_asr`` (Whisper tiny.en) on a free port; waits for SERVING."""
    return start_grpc_service("jacana_asr", "JACANA_ASR_", **env)


def start_asr_gateway(asr: dict[str, list[str]], **env: str) -> Service:
    """A gateway serving only ``asr`` (model -> endpoints); waits for /health 200."""
    return start_service_gateway("ASR", asr, **env)
