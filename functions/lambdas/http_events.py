"""An HTTP event on Lambda: the one app through mangum, on the container's loop.

The app is built on the container's first HTTP event (a direct event never imports
FastAPI or mangum); its `POST /wake` and `/drain` run in the container, and its `kick`
is the scheduler's. A database that did not answer in the invocation's time is a 503
with Retry-After (`unavailable`), the app never run.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from functions.lambdas.public_url import refuse_an_open_public_url
from functions.lambdas.resting import DatabaseUnavailableError
from functions.lambdas.runtime import Budget, LambdaHandler, Runtime
from functions.lambdas.work import drain as drain_outbox, http_wake

if TYPE_CHECKING:
    from fastapi import FastAPI


def answer(runtime: Runtime, event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Answer an HTTP event (Function URL, HTTP API 2.0) with the app, on the container's loop."""
    handler = runtime.http_handler if runtime.http_handler is not None else _make_http(runtime)
    # Mangum runs the app with run_until_complete on the thread's current loop: make
    # that the container's, where the engine and its pool live.
    asyncio.set_event_loop(runtime.loop)
    return handler(event, context)


def serve(runtime: Runtime, app: FastAPI) -> None:
    """Give an app what its routes call on Lambda: `POST /wake` and `/drain` run in this
    container, and `kick` (after `POST /events` stored something) is the scheduler's."""

    async def wake(timeout_seconds: float) -> bool:
        return await http_wake(runtime, timeout_seconds)

    async def drain() -> dict[str, Any]:
        budget = runtime.budget or Budget.of(None, runtime.settings.wake_margin_seconds)
        return await drain_outbox(runtime, {}, budget)

    app.state.wake = wake
    app.state.drain = drain
    app.state.kick = runtime.kick


def _make_http(runtime: Runtime) -> LambdaHandler:
    from mangum import Mangum

    from functions.app import create_app

    refuse_an_open_public_url()
    container = runtime.run(runtime.container())
    app = create_app(container.Session, run_worker=False)
    # The lifespan is off under mangum (it would run on every invocation): set what it sets.
    app.state.connection = container.connection
    app.state.application = container.application
    serve(runtime, app)

    asyncio.set_event_loop(runtime.loop)
    handler: LambdaHandler = Mangum(app, lifespan="off")
    runtime.http_handler = handler
    return handler


def unavailable(error: DatabaseUnavailableError) -> dict[str, Any]:
    """The 503 answer (a Function URL's response) to a request the database could not serve."""
    body = {"detail": str(error), "type": type(error).__name__}
    return {
        "statusCode": 503,
        "headers": {"content-type": "application/json", "retry-after": str(error.retry_after)},
        "body": json.dumps(body),
        "isBase64Encoded": False,
    }
