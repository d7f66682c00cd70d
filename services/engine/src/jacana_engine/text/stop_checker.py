"""Stop strings over streamed text: release what can never be part of a match, hold the rest.

One ``StopStringMatcher`` per request, owned by its detokenizer; plain Python on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Feeds on text pieces; releases text that contains no stop string and no partial one.

    Invariants: released text never contains a stop string, nor ends with the beginning of one
    that later text could complete. When stop strings overlap, the one that completes first
    wins (then the longer one, on a tie), so the result does not depend on how the text was cut
    into pieces. After a match the request is over and further text is dropped.
    """

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._stops = tuple(dict.fromkeys(s for s in stops if s))
        # Every proper prefix of a stop string: a suffix of pending text in here may still grow
        # into a match, so it is held back.
        self._prefixes = frozenset(s[:i] for s in self._stops for i in range(1, len(s)))
        self._max_hold = max((len(s) - 1 for s in self._stops), default=0)
        self._pending = ""
        self.matched: str | None = None

    @property
    def pending(self) -> str:
        """Text held back because it may be the start of a stop string."""
        return self._pending

    def feed(self, text: str) -> tuple[str, str | None]:
        """Add ``text``; return (text safe to release, the stop string matched or None).

        On a match the released text ends right before the stop string.
        """
        if self.matched is not None:
            return "", None
        if not self._stops:
            return text, None
        buffer = self._pending + text
        hit = self._earliest_match(buffer, len(self._pending))
        if hit is not None:
            start, stop = hit
            self.matched = stop
            self._pending = ""
            return buffer[:start], stop
        hold = self._held_suffix_length(buffer)
        cut = len(buffer) - hold
        self._pending = buffer[cut:]
        return buffer[:cut], None

    def flush(self) -> str:
        """Release the held-back text (generation ended for another reason)."""
        text, self._pending = self._pending, ""
        return "" if self.matched is not None else text

    def _earliest_match(self, buffer: str, old: int) -> tuple[int, str] | None:
        # The first ``old`` characters held no complete stop, so a match must end after them.
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self._stops:
            start = buffer.find(stop, max(0, old - len(stop) + 1))
            if start < 0:
                continue
            key = (start + len(stop), start, stop)
            if best is None or key[:2] < best[:2]:
                best = key
        return None if best is None else (best[1], best[2])

    def _held_suffix_length(self, buffer: str) -> int:
        for length in range(min(len(buffer), self._max_hold), 0, -1):
            if buffer[-length:] in self._prefixes:
                return length
        return 0
