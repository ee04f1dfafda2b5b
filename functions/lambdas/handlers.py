"""duly's Lambda entries: the four direct ones (publish, wake, drain, deliver) and `http`.

A direct event runs its operation (`functions.lambdas.work`), whose results are
publish `{"ids", "stored", "duplicates", "kicked"}`, wake `{"steps", "caught_up", "slot",
"invoked"}` (and `"reason"` when it did not work), drain `{"routed", "caught_up",
"kicked"}`, deliver `{"workflow", "step", "accepted", "taken", "held", "refused",
"message"}`; a mistake in it, an HTTP request
among them, answers `{"error", "type"}` and writes nothing. Only `http` serves HTTP events
(Function URL, HTTP API) through `functions.lambdas.http_events`, and under DULY_PUBLIC_URL
it drops the event's `requestContext.authorizer` first. Every invocation's log lines are
JSON with its request id, and its metrics EMF lines (`functions.lambdas.observing`). Under
DULY_DATABASE_PAUSES an invocation closes its connections when done, and a database that
does not answer in its time raises `DatabaseUnavailableError` (HTTP: 503 with
Retry-After). Why: docs/architecture.md, "On AWS Lambda".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from engine import ConfigurationError
from functions.lambdas import http_events, snapshots, work
from functions.lambdas.observing import invocation
from functions.lambdas.public_url import checked_by_aws
from functions.lambdas.resting import DatabaseUnavailableError
from functions.lambdas.runtime import Budget, Runtime, runtime
from functions.requests.errors import InputError, refusal_of, spelled

log = logging.getLogger("duly.lambda")

Operation = Callable[[Runtime, Any, Budget], Coroutine[Any, Any, dict[str, Any]]]
# The keys only an HTTP request's event has (payload formats 2.0 and 1.0).
HTTP_KEYS = frozenset({"requestContext", "httpMethod", "routeKey", "rawPath"})
HTTP_ENTRY = "functions.lambdas.handlers.http"

snapshots.register()  # SnapStart's hooks, where Lambda's runtime provides the library


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
    """Deliver an outside event to the runs named; how many took it, hold it, refused it."""
    return handle(work.deliver, event, context)


def http(event: Any, context: Any) -> dict[str, Any]:
    """Answer an HTTP request with the app; any other event is refused as its input."""
    rt = runtime()
    start(rt, context)
    with invocation(context, rt.settings.schedule_group):
        if not is_http(event):
            return refused(
                "http",
                InputError.at((), "The http function takes an HTTP request's event only."),
            )
        try:
            if rt.settings.database_pauses:
                rt.run(rt.container())  # the database reached (or the 503) before the app runs
            return http_events.answer(rt, checked_by_aws(event), context)
        except DatabaseUnavailableError as exc:
            return http_events.unavailable(exc)
        finally:
            finish(rt)


def is_http(event: Any) -> bool:
    """Whether `event` is an HTTP request: a Function URL / HTTP API 2.0 payload with the
    method, path and source its `requestContext.http` always has (or a 1.0 payload)."""
    if not isinstance(event, dict) or not isinstance(event.get("requestContext"), dict):
        return False
    if event.get("version") != "2.0":
        return "httpMethod" in event
    http = event["requestContext"].get("http")
    return isinstance(http, dict) and all(
        isinstance(http.get(part), str) for part in ("method", "path", "sourceIp")
    )


def looks_like_http(event: Any) -> bool:
    """Whether `event` carries any key only an HTTP request's event has."""
    return isinstance(event, dict) and not HTTP_KEYS.isdisjoint(event)


def handle(
    operation: Operation, event: Any, context: Any, rt: Runtime | None = None
) -> dict[str, Any]:
    """Run one invocation on the container's runtime; a client's mistake is answered, not raised."""
    rt = rt if rt is not None else runtime()
    budget = start(rt, context)
    name = getattr(operation, "__name__", "duly")
    with invocation(context, rt.settings.schedule_group):
        try:
            if looks_like_http(event):  # refused before anything is read: no identity in it
                raise InputError.at(
                    ("requestContext",),
                    f"The {name} function takes its own direct events, not an HTTP request: "
                    f"HTTP is served by the function whose handler is {HTTP_ENTRY}.",
                )
            return rt.run(operation(rt, event, budget))
        except DatabaseUnavailableError:
            raise  # retryable: Lambda retries an asynchronous invoke; the caller sees the type
        except ConfigurationError:
            raise  # the deployment's mistake, not the input's: failed, retried once fixed
        except work.CLIENT_ERRORS as exc:
            return refused(name, exc)
        finally:
            finish(rt)


def start(rt: Runtime, context: Any) -> Budget:
    """Note the invocation's budget and function on the runtime; the budget."""
    budget = Budget.of(context, rt.settings.wake_margin_seconds)
    rt.budget = budget
    rt.invoked_function_arn = getattr(context, "invoked_function_arn", None)
    return budget


def finish(rt: Runtime) -> None:
    """Under DULY_DATABASE_PAUSES, close the invocation's connections (`Runtime.release`)."""
    if rt.settings.database_pauses:
        rt.run(rt.release())


def refused(name: str, exc: Exception) -> dict[str, Any]:
    """The answer to a refused input; the log says its kind and places, never its values."""
    kind = type(exc).__name__
    log.info("%s refused its input: %s at %s", name, kind, places_of(exc) or "the event")
    return {"error": refusal_of(exc), "type": kind}


def places_of(exc: BaseException) -> str:
    """Where an input's refused values sit (`events[1].occurred_at, ...`), none of them shown."""
    found = exc if isinstance(exc, InputError) else exc.__cause__
    if not isinstance(found, InputError):
        return ""
    return ", ".join(spelled(problem.loc) or "the event" for problem in found.problems)
