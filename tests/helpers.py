"""Small helpers the tests share."""

from __future__ import annotations

import asyncio
import inspect
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx
import uvicorn
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

T = TypeVar("T")
STARTUP = 10.0  # seconds for uvicorn to start serving


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


@asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """Serve `app` with uvicorn on a free loopback port; a client for it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_config=None, ws="none", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        deadline = time.monotonic() + STARTUP
        while not server.started:
            assert not task.done(), "uvicorn stopped while starting"
            assert time.monotonic() < deadline, "uvicorn did not start in time"
            await asyncio.sleep(0.01)
        base_url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base_url, trust_env=False) as client:
            yield client
    finally:
        server.should_exit = True
        await task
        sock.close()
