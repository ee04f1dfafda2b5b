"""Failed credentials slowed down per client: after a few misses, a wait before the next try.

One in-process window per client address (a Lambda container keeps its own),
used by the guard for wrong bearer tokens and by the console's login form.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

FREE_MISSES = 10  # wrong credentials a client may send in a window before waiting
WINDOW_SECONDS = 60.0
MAX_CLIENTS = 10_000  # addresses remembered at once; the oldest are forgotten first


class Throttle:
    """Counts a client's failures in a sliding window; `wait` says how long it must wait."""

    def __init__(
        self,
        free: int = FREE_MISSES,
        window: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free = free
        self.window = window
        self.clock = clock
        self._misses: OrderedDict[str, list[float]] = OrderedDict()

    def wait(self, client: str) -> float | None:
        """Seconds `client` must wait before trying again; None when it may try now."""
        misses = self._recent(client)
        if len(misses) < self.free:
            return None
        return max(misses[-self.free] + self.window - self.clock(), 0.001)

    def failed(self, client: str) -> None:
        """Count one wrong credential from `client`."""
        misses = self._recent(client)
        misses.append(self.clock())
        self._misses[client] = misses[-self.free :]
        self._misses.move_to_end(client)
        while len(self._misses) > MAX_CLIENTS:
            self._misses.popitem(last=False)

    def _recent(self, client: str) -> list[float]:
        since = self.clock() - self.window
        return [at for at in self._misses.get(client, []) if at > since]
