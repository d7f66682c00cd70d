"""How many generation requests the gateway serves at once; beyond that, a 429.

The count lives in the app's state and only changes on the event loop thread. A request
holds its :class:`Slot` from admission until its response (stream included) has ended.
"""

from __future__ import annotations

from jacana_gateway.errors import too_many_requests


class Slot:
    """One admitted request; :meth:`release` is idempotent."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission

    def release(self) -> None:
        if self._admission is not None:
            self._admission.in_flight -= 1
            self._admission = None


class Admission:
    """A counter with a ceiling."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def admit(self) -> Slot:
        """A slot, or a 429 ApiError when ``limit`` requests are already in flight."""
        if self.in_flight >= self.limit:
            raise too_many_requests(self.limit)
        self.in_flight += 1
        return Slot(self)
