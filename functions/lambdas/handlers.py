"""duly's four Lambda entries (template.yaml): publish, wake, drain and deliver.

A direct event runs its operation (`functions.lambdas.work`), whose results are
publish `{"ids", "stored", "duplicates", "kicked"}`, wake `{"steps", "caught_up", "slot",
"invoked"}` (and `"reason"` when it did not work), drain `{"routed", "caught_up",
"kicked"}`, deliver `{"accepted", "workflow", "step"}`; a mistake in it answers `{"error",
"type"}` and writes nothing. An HTTP event (Function URL, HTTP API 2.0) goes to the one app
through `functions.lambdas.http_events`. On Lambda every invocation's log lines are JSON
with its request id, and its metrics EMF lines (`functions.lambdas.observing`). Why:
docs/architecture.md, "On AWS Lambda".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from engine.base.errors import ConfigurationError
from functions.lambdas import http_events, work
from functions.lambdas.observing import invocation
from functions.lambdas.runtime import Budget, Runtime, runtime
from functions.requests.errors import refusal_of

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
    with invocation(context, rt.settings.schedule_group):
        if is_http(event):
            return http_events.answer(rt, event, context)
        try:
            return rt.run(operation(rt, event, budget))
        except ConfigurationError:
            raise  # the deployment's mistake, not the input's: failed, retried once fixed
        except work.CLIENT_ERRORS as exc:
            said = refusal_of(exc)
            log.info("%s refused its input: %s", getattr(operation, "__name__", "duly"), said)
            return {"error": said, "type": type(exc).__name__}
