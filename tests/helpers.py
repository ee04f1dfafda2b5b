"""Small helpers the tests share."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

T = TypeVar("T")


async def wait_until(
    condition: Callable[[], Awaitable[object] | object],
    timeout: float = 5.0,
    interval: float = 0.005,
) -> None:
    """Wait until `condition()` (awaited if it is a coroutine) is truthy; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not await _value(condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout} s")
        await asyncio.sleep(interval)


async def _value(result: Awaitable[object] | object) -> object:
    return await result if inspect.isawaitable(result) else result


async def fetch(Session: async_sessionmaker[AsyncSession], model: type[T], key: Any) -> T:
    """The row as the database has it now."""
    async with Session() as session:
        row = await session.get(model, key, populate_existing=True)
        assert row is not None, f"no {model.__name__} row {key!r}"
        return row
