"""The speech-to-text services (``jacana.asr.v1.Asr``) behind /v1/audio/*: their replicas
per model and the ``Transcribe`` call routed over them."""

from __future__ import annotations

from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb
from jacana_common.pb.jacana.asr.v1 import asr_pb2_grpc
from jacana_gateway.backends.replica_pool import ServiceBackends, call_with_failover

ASR_SERVICE = "jacana.asr.v1.Asr"


class AsrBackends(ServiceBackends):
    """Model id -> ASR service replicas (a :class:`ReplicaPool`), and ``Transcribe`` calls
    routed over them: least in flight first, UNAVAILABLE replicas skipped."""

    service = ASR_SERVICE
    stub = asr_pb2_grpc.AsrStub

    async def transcribe(
        self, model: str, request: pb.TranscribeRequest, timeout: float
    ) -> pb.TranscribeResponse:
        """``Transcribe`` on the least busy replica. Raises :class:`ApiError`."""
        return await call_with_failover(self.pool, model, "Transcribe", request, timeout)
