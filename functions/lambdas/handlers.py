"""duly's four Lambda entries (template.yaml): publish, wake, drain and deliver.

Each takes its direct event (the scheduler's target input `{"duly": "wake"}`,
an invoke) or an HTTP event (a Function URL or HTTP API payload 2.0), which
goes to the one FastAPI app (`functions.http.app`) through mangum; FastAPI,
mangum and boto3 are imported only when an event needs them, so a direct
entry's cold start pays for SQLAlchemy, psycopg and the engine alone.

Direct results (see `functions.lambdas.work`):

- publish  `{"ids", "stored", "duplicates", "kicked"}`
- wake     `{"steps", "caught_up", "slot", "invoked"}` (+ `"reason"` when it did not work)
- drain    `{"routed", "caught_up", "kicked"}`
- deliver  `{"accepted", "workflow", "step"}`

A mistake in the input answers `{"error": message, "type": exception name}`
and writes nothing, so a Lambda retry does not repeat it; a real failure
(the database down) raises, so the retry applies. Per-container state (the
loop, engine, app, clients) is `functions.lambdas.runtime`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from engine.base.errors import ConfigurationError
from functions.lambdas import http_events, work
from functions.lambdas.runtime import Budget, Runtime, runtime

log = logging.getLogger("duly.lambda")

Operation = Callable[[Runtime, Any, Budget], Coroutine[Any, Any, dict[str, Any]]]


def publish(event: Any, context: Any) -> dict[str, Any]:
    """Publish one event or a batch into the outbox; kick a wake for them."""
    return handle(work.publish, event, context)


def wake(event: Any, context: Any) -> dict[str, Any]:
    """Run due work until caught up or near the deadline; register the next instant."""
    return handle(work.wake, event, context)


def drain(event: Any, context: Any) -> dict[str, Any]:
    """Route the outbox now, bounded by the deadline (also the safety-net target)."""
    return handle(work.drain, event, context)


def deliver(event: Any, context: Any) -> dict[str, Any]:
    """Deliver an outside event to the runs waiting for it; how many accepted."""
    return handle(work.deliver, event, context)


def is_http(event: Any) -> bool:
    """Whether `event` is an HTTP request: a Function URL / HTTP API 2.0 (or 1.0) payload."""
    return (
        isinstance(event, dict)
        and isinstance(event.get("requestContext"), dict)
        and (event.get("version") == "2.0" or "httpMethod" in event)
    )


def handle(
    operation: Operation, event: Any, context: Any, rt: Runtime | None = None
) -> dict[str, Any]:
    """Run one invocation on the container's runtime; a client's mistake is answered, not raised."""
    rt = rt if rt is not None else runtime()
    budget = Budget.of(context, rt.settings.wake_margin_seconds)
    rt.budget = budget
    rt.invoked_function_arn = getattr(context, "invoked_function_arn", None)
    if is_http(event):
        return http_events.answer(rt, event, context)
    try:
        return rt.run(operation(rt, event, budget))
    except ConfigurationError:
        raise  # the deployment's mistake, not the input's: failed, and retried once it is fixed
    except work.CLIENT_ERRORS as exc:
        log.info("%s refused its input: %s", getattr(operation, "__name__", "duly"), exc)
        return {"error": str(exc), "type": type(exc).__name__}
