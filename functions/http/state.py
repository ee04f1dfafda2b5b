"""What an app's routes find on its state: the application, its connection, the runtime's hooks.

The lifespan (or the Lambda runtime) sets `app.state.connection`; the
Lambda runtime also sets `kick`, `wake` and `drain`, plain or async. Its `kick`
follows a committed write and never raises: a kick that cannot reach AWS is
logged and counted, and the route still answers its 2xx.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from engine import Application

if TYPE_CHECKING:
    from engine import WorkflowConnection


class Current:
    """The outermost middleware: the app's application current for every request (its
    lifespan runs in another task), so ambient calls (`row.start()`) reach its database."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        application: Application | None = getattr(scope["app"].state, "application", None)
        if application is None:  # the lifespan's own scope, before it made one
            await self.app(scope, receive, send)
            return
        with application.current():
            await self.app(scope, receive, send)


def connection_of(request: Request) -> WorkflowConnection:
    """The workflow connection the app's lifespan opened."""
    connection: WorkflowConnection = request.app.state.connection
    return connection


async def call_state(request: Request, name: str) -> None:
    """Call `app.state.<name>()` (plain or async) when the runtime set one."""
    found = getattr(request.app.state, name, None)
    if found is not None:
        await maybe_await(found())


async def maybe_await(value: Any) -> Any:
    """`value`, awaited if it is awaitable."""
    return await value if inspect.isawaitable(value) else value
