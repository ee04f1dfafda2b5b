"""What a worker remembers of a limited table's groups between visits of every group.

When the groups of the oldest due rows cannot fill a claim (one tenant's import ahead of
everyone), the claim probes the longest-waiting groups the last visit of every group left
here, keyed by their oldest due row, instead of visiting every group again. The memory is
used for `REMEMBER_SECONDS` at least, longer when a visit is slow (visits take at most
`SCAN_SHARE` of the time); a group it does not know may wait until the next visit.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row

REMEMBERED_GROUPS = 1024  # groups a visit of every group leaves, longest-waiting first
WINDOW_PER_SLOT = 4  # remembered groups that could start, probed per row a claim wants
WINDOW_MOST = 256  # remembered groups one claim probes at most, those at their limit included
REMEMBER_SECONDS = 1.0  # a visit's memory is used for this long at least
SCAN_SHARE = 0.05  # and longer when visits are slow: they take at most this share of the time

# How a claim found its groups (the `tier` its first statement answers).
OLDEST = 1  # the groups of the oldest due rows were enough: the memory was not needed
RECALLED = 2  # with the remembered groups they were enough
VISITED = 3  # neither was: every group was visited


class GroupMemory:
    """The groups of one limited table a worker last saw waiting, longest-waiting first."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # (since, tie-breaker, group, could start when last seen): a heap, oldest first.
        self._heap: list[tuple[datetime, int, Any, bool]] = []
        self._out: list[tuple[datetime, int, Any, bool]] = []  # handed to the claim in progress
        self._order = itertools.count()
        self._until = float("-inf")
        self.visits = 0  # visits of every group this memory was made from

    def __len__(self) -> int:
        return len(self._heap) + len(self._out)

    def window(self, want: int) -> list[Any]:
        """The remembered groups a claim of `want` rows probes: those waiting longest.

        As many as may fill it (`WINDOW_PER_SLOT` a row) of those that could
        start when last seen, with those that could not passed on the way
        (they are probed too: they may have freed a slot). None when the
        memory is empty or too old: the claim visits every group then. They
        are out of the memory until `learn` puts back what the claim saw.
        """
        self._restore()
        if self._clock() >= self._until:
            self._heap.clear()
            return []
        able = 0
        while self._heap and able < want * WINDOW_PER_SLOT and len(self._out) < WINDOW_MOST:
            entry = heapq.heappop(self._heap)
            self._out.append(entry)
            able += entry[3]
        return [entry[2] for entry in self._out]

    def learn(self, tier: int, rows: Sequence[Row[Any]], seconds: float) -> None:
        """Keep what a claim's first statement (`rows`, found by `tier`) saw of the groups.

        After a visit of every group (which took `seconds`), the groups it
        returned replace the memory. After a claim from the window, each of
        its groups that has due work is keyed again by its oldest due row,
        and one with none is forgotten. A window the claim did not need goes
        back as it was.
        """
        if tier == VISITED:
            self._out.clear()
            self._heap = [self._entry(row) for row in rows]
            heapq.heapify(self._heap)
            self.visits += 1
            self._until = self._clock() + max(REMEMBER_SECONDS, seconds / SCAN_SHARE)
            return
        if tier == OLDEST:
            self._restore()
            return
        self._out.clear()
        for row in rows:
            if row.recalled:
                heapq.heappush(self._heap, self._entry(row))

    def forget(self) -> None:
        """Remember nothing: the next claim that needs it visits every group."""
        self._heap.clear()
        self._out.clear()
        self._until = float("-inf")

    def _entry(self, row: Row[Any]) -> tuple[datetime, int, Any, bool]:
        return (row.since, next(self._order), row.grp, bool(row.able))

    def _restore(self) -> None:
        for entry in self._out:
            heapq.heappush(self._heap, entry)
        self._out.clear()
