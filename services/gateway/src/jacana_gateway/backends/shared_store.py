"""Backends whose replicas share one job store (Redis): calls by job id go to any replica.

A new job goes to the replicas of its model; a call about an existing job (get, result,
delete) may go to any replica of any model, since every replica reads the same store.
:class:`SharedStoreBackends` routes those under :data:`ANY_REPLICA`, the union of every
model's endpoints (on the same channels), and hides that key from ``models`` and
``health``. The routing itself (least in flight, UNAVAILABLE replicas skipped) is
:class:`ServiceBackends`'.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from jacana_gateway.backends.replica_pool import ServiceBackends

# The routing key of calls any replica can answer; not a valid model id, so never a model's.
ANY_REPLICA = "*"


class SharedStoreBackends(ServiceBackends):
    """Model id -> replicas, plus :data:`ANY_REPLICA` for the calls by job id."""

    def __init__(
        self,
        targets: Mapping[str, Sequence[str]],
        *,
        retry_after_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._models = list(targets)
        every = list(dict.fromkeys(t for endpoints in targets.values() for t in endpoints))
        routed = {**targets, ANY_REPLICA: every} if every else dict(targets)
        super().__init__(routed, retry_after_s=retry_after_s, clock=clock)

    @property
    def models(self) -> list[str]:
        return list(self._models)

    def __contains__(self, model: object) -> bool:
        return model in self._models

    async def health(self, timeout: float) -> dict[str, dict[str, bool]]:
        report = await super().health(timeout)
        report.pop(ANY_REPLICA, None)
        return report
