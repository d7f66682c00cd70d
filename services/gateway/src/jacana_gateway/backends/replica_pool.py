"""The replicas of one gRPC service behind each served model, and which one gets the next
request. The gateway keeps one pool for engines and one for embeddings services.

The pool owns one grpc.aio channel per distinct endpoint, opened by
:meth:`ReplicaPool.start` on the running event loop and closed by :meth:`ReplicaPool.close`
(which also cancels any call still open on them). Per-replica in-flight counts live here,
in the gateway process, and only ever change on the event loop thread.

:func:`call_with_failover` is the one unary call path of idempotent RPCs (Embed,
Transcribe): least busy replica first, the next one while replicas answer UNAVAILABLE.

Routing: :meth:`ReplicaPool.candidates` orders a model's replicas by (failed recently,
in-flight requests, rotation), so the least-loaded healthy replica comes first, ties
rotate, and a replica that just returned UNAVAILABLE is tried last for ``retry_after_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from jacana_common.errors import ApiError, api_error_from_grpc
from jacana_common.grpc_client import make_channel
from jacana_common.telemetry import outgoing_metadata

# A generated gRPC stub class: called with a channel, it gives the service's client.
StubFactory = Callable[[grpc.aio.Channel], Any]


@dataclass
class Replica:
    """One endpoint serving one model: its service stub and health stub share a channel."""

    target: str
    channel: grpc.aio.Channel
    stub_factory: StubFactory = field(repr=False)
    stub: Any = field(init=False, repr=False)
    health: health_pb2_grpc.HealthStub = field(init=False, repr=False)
    in_flight: int = 0
    failed_at: float = float("-inf")

    def __post_init__(self) -> None:
        self.stub = self.stub_factory(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)


class ReplicaPool:
    """Model id -> replicas of ``service``; least-in-flight routing; health probes.

    service: the gRPC service name the replicas' health checks are asked about.
    stub: the generated stub class of that service (``replica.stub`` is one).
    """

    def __init__(
        self,
        targets: Mapping[str, Sequence[str]],
        *,
        service: str,
        stub: StubFactory,
        retry_after_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self._stub_factory = stub
        self._targets = {model: list(endpoints) for model, endpoints in targets.items()}
        self._replicas: dict[str, list[Replica]] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._turn: dict[str, int] = dict.fromkeys(self._targets, 0)
        self._retry_after_s = retry_after_s
        self._clock = clock

    @property
    def models(self) -> list[str]:
        return list(self._targets)

    def __contains__(self, model: object) -> bool:
        return model in self._targets

    async def start(self) -> None:
        """Create the channels (connection is lazy: a down engine does not fail start-up)."""
        for model, targets in self._targets.items():
            for target in targets:
                if target not in self._channels:
                    self._channels[target] = make_channel(target)
            self._replicas[model] = [
                Replica(t, self._channels[t], self._stub_factory) for t in targets
            ]

    async def close(self) -> None:
        """Close every channel; calls still open on them end with CANCELLED."""
        channels, self._channels, self._replicas = list(self._channels.values()), {}, {}
        await asyncio.gather(*(ch.close() for ch in channels), return_exceptions=True)

    def replicas(self, model: str) -> list[Replica]:
        if not self._replicas:
            raise RuntimeError("ReplicaPool.start() has not been awaited")
        return self._replicas[model]

    def candidates(self, model: str) -> list[Replica]:
        """``model``'s replicas, best first; each call advances the tie-break rotation."""
        replicas = self.replicas(model)
        turn = self._turn[model]
        self._turn[model] = turn + 1
        cutoff = self._clock() - self._retry_after_s
        n = len(replicas)
        order = sorted(
            range(n),
            key=lambda i: (replicas[i].failed_at > cutoff, replicas[i].in_flight, (i - turn) % n),
        )
        return [replicas[i] for i in order]

    def mark_failed(self, replica: Replica) -> None:
        """Deprioritize ``replica`` for a while (it answered UNAVAILABLE)."""
        replica.failed_at = self._clock()

    def acquire(self, replica: Replica) -> None:
        """Count one more request in flight on ``replica``; pair with :meth:`release`."""
        replica.in_flight += 1

    def release(self, replica: Replica) -> None:
        replica.in_flight -= 1

    async def probe(self, replica: Replica, timeout: float) -> bool:
        """True when ``replica`` answers the gRPC health check with SERVING."""
        request = health_pb2.HealthCheckRequest(service=self.service)
        try:
            reply = await replica.health.Check(request, timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def health(self, timeout: float) -> dict[str, dict[str, bool]]:
        """Model -> endpoint -> serving, probing all replicas concurrently."""
        pairs = [(m, r) for m in self._targets for r in self.replicas(m)]
        results = await asyncio.gather(*(self.probe(r, timeout) for _, r in pairs))
        report: dict[str, dict[str, bool]] = {m: {} for m in self._targets}
        for (model, replica), ok in zip(pairs, results, strict=True):
            report[model][replica.target] = ok
        return report


def _api_error(exc: grpc.aio.AioRpcError) -> ApiError:
    return api_error_from_grpc(exc.code(), exc.details())


async def call_with_failover(
    pool: ReplicaPool,
    model: str,
    method: str,
    request: Any,
    timeout: float,
    *,
    to_error: Callable[[grpc.aio.AioRpcError], ApiError] = _api_error,
) -> Any:
    """``replica.stub.<method>(request)`` on the least busy replica of ``model``, moving on
    while replicas answer UNAVAILABLE (each marked failed). Only for idempotent RPCs: a
    retried call may have run. Raises :class:`ApiError` (the last replica's failure, as
    ``to_error`` shows it; by default its status and details)."""
    candidates = pool.candidates(model)
    for n, replica in enumerate(candidates, start=1):
        pool.acquire(replica)
        try:
            call = getattr(replica.stub, method)
            return await call(request, timeout=timeout, metadata=outgoing_metadata())
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                pool.mark_failed(replica)
            if exc.code() != grpc.StatusCode.UNAVAILABLE or n == len(candidates):
                raise to_error(exc) from None
        finally:
            pool.release(replica)
    raise RuntimeError(f"model {model!r} has no endpoints")


class ServiceBackends:
    """Model id -> replicas of one kind of gRPC service (a :class:`ReplicaPool`).

    Subclasses name the service and its stub and add the calls they route (each through
    :func:`call_with_failover`): least in flight first, a replica that answered UNAVAILABLE
    last for ``retry_after_s``, the next replica tried while one is UNAVAILABLE.
    """

    service: str  # the gRPC health name, e.g. "jacana.asr.v1.Asr"
    stub: StubFactory

    def __init__(
        self,
        targets: Mapping[str, Sequence[str]],
        *,
        retry_after_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = ReplicaPool(
            targets,
            service=self.service,
            stub=type(self).stub,
            retry_after_s=retry_after_s,
            clock=clock,
        )

    @property
    def models(self) -> list[str]:
        return self.pool.models

    def __contains__(self, model: object) -> bool:
        return model in self.pool

    async def start(self) -> None:
        await self.pool.start()

    async def close(self) -> None:
        await self.pool.close()

    async def health(self, timeout: float) -> dict[str, dict[str, bool]]:
        """Model -> endpoint -> serving, probing every replica concurrently."""
        return await self.pool.health(timeout)
