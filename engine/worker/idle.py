"""The idle contract: what a worker tells a platform when it has nothing to do.

`on_idle(at)` is told the instant the worker next waits for (the database's
own value, leases included), or None, each time that answer changes, so a
caller registering it elsewhere writes once per answer. `wake(timeout)` asks
the worker to look and returns True once a pass that started after the call
claimed nothing, with none of the worker's steps still running, and the
instant behind that pass has been reported: the two halves a platform that
suspends idle machines needs.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TypeAlias

log = logging.getLogger("duly.worker")

MAX_WAKE_CALLERS = 8  # past this many waiting at once, wake() returns False at once

OnIdle: TypeAlias = Callable[[datetime | None], Awaitable[None] | None]
_NOT_YET = object()  # nothing reported so far


class IdleContract:
    """Reports the next instant once per change, and answers wake() callers."""

    def __init__(self, on_idle: OnIdle | None) -> None:
        self._on_idle = on_idle
        self._reported: object = _NOT_YET
        self._caught_up_pass = 0
        self._changed = asyncio.Condition()
        self._callers = 0
        self.reports = 0  # how many times on_idle was called

    @property
    def waiting(self) -> bool:
        """A wake() caller waits for a caught-up pass."""
        return self._callers > 0

    async def after_pass(
        self, number: int, claimed: int, upcoming: datetime | None, running: bool
    ) -> None:
        """Called after a pass that asked when work is next due."""
        if not await self._report(upcoming):
            return  # the platform was not told: this pass cannot count as caught up
        if claimed == 0 and not running:
            async with self._changed:
                self._caught_up_pass = number
                self._changed.notify_all()

    async def wait_caught_up(
        self, after_pass: int, timeout: float, kick: Callable[[], None]
    ) -> bool:
        """Wait for a caught-up pass numbered after `after_pass`; False on timeout or crowding."""
        kick()
        if self._callers >= MAX_WAKE_CALLERS:
            return False
        self._callers += 1
        try:
            async with self._changed:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._caught_up_pass > after_pass), timeout
                )
            return True
        except TimeoutError:
            return False
        finally:
            self._callers -= 1

    async def _report(self, at: datetime | None) -> bool:
        if at == self._reported:
            return True
        if self._on_idle is not None:
            try:
                result = self._on_idle(at)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("on_idle(%s) failed; it is told again after the next pass", at)
                return False
        self._reported = at
        self.reports += 1
        return True
