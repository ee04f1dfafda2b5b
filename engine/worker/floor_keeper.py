"""The probe below a worker's floors, run beside its pass loop, never in it.

Now and then it asks each floored table for a due row below its floor (one
that a writer committed late, or that a lock hid from a claim), lowers the
floor to it and wakes the pass loop. The probe reads what the claims no
longer read, so it is spaced out by its own cost: every second it reads the
last PROBE_NEAR below each floor, where a late writer's row lands, and the
whole range below far less often when that is slow (a held horizon). A
worker that claimed nothing since the last probe forgets its floors instead,
and asks nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.claims.floors import DueFloors, probe_below
from engine.model.registry import WorkflowInfo

log = logging.getLogger("duly.worker")

PROBE_EVERY = 1.0  # seconds between probes, at the least
PROBE_SHARE = 0.05  # the probe's share of its interval, at most: a slow probe comes less often
DEEP_SHARE = 0.005  # the same for the probe of the whole range below the floors

Served = Callable[[], list[tuple[WorkflowInfo, tuple[str, ...] | None]]]


class FloorKeeper:
    """Lowers `floors` where a probe finds due work beneath them."""

    def __init__(
        self, engine: AsyncEngine, floors: DueFloors, served: Served, kick: Callable[[], None]
    ) -> None:
        self._engine = engine
        self._floors = floors
        self._served = served  # the unlimited tables the pass loop claims, and their steps
        self._kick = kick
        self._claimed = False
        self.interval = PROBE_EVERY
        self._deep_at = 0.0  # time.monotonic() from which the next probe reads the whole range
        self.probes = 0

    def claimed(self) -> None:
        """The pass loop took rows: its floors are worth keeping until the next probe."""
        self._claimed = True

    async def keep(self) -> None:
        """Probe every `interval` seconds while the worker runs."""
        while True:
            await asyncio.sleep(self.interval)
            if not self._claimed:
                self._floors.forget()  # idle: the next claim reads from the first entry
                continue
            self._claimed = False
            await self.probe(deep=time.monotonic() >= self._deep_at)

    async def probe(self, deep: bool = True) -> None:
        """Look below every floor once (`deep`: all the way down, else within PROBE_NEAR);
        lower those with due work beneath."""
        floored = [
            (info, steps, floor)
            for info, steps in self._served()
            if (floor := self._floors.floor(info.name)) is not None
        ]
        if not floored:
            return
        started = time.monotonic()
        try:
            async with self._engine.connect() as conn:
                found = await probe_below(conn, floored, near=not deep)
        except (SQLAlchemyError, OSError) as exc:
            log.debug("probe below the floors failed (%s); claims read from the start", exc)
            self._floors.forget()
            return
        self.probes += 1
        took = time.monotonic() - started
        if deep:  # the near probes go on meanwhile, every second
            self._deep_at = time.monotonic() + max(PROBE_EVERY, took / DEEP_SHARE)
            self.interval = PROBE_EVERY
        else:
            self.interval = max(PROBE_EVERY, took / PROBE_SHARE)
        lowered = False
        for (info, _, _), at in zip(floored, found, strict=True):
            if at is not None:
                self._floors.lower(info.name, at)
                lowered = True
        if lowered:
            self._kick()
