"""Small helpers the tests share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

T = TypeVar("T")


async def wait_until(
    condition: Callable[[], Awaitable[object]], timeout: float = 5.0, interval: float = 0.005
) -> None:
    """Wait until `condition()` is truthy; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout} s")
        await asyncio.sleep(interval)


async def fetch(Session: async_sessionmaker[AsyncSession], model: type[T], key: Any) -> T:
    """The row as the database has it now."""
    async with Session() as session:
        row = await session.get(model, key, populate_existing=True)
        assert row is not None, f"no {model.__name__} row {key!r}"
        return row
