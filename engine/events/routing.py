"""Routing events to handlers: registrations, and the in-memory registry.

A registration names a route key, a handler and how to treat it: `when` (a
predicate: a False skips the route), `validator` (run first; a failure goes
straight to dead letter, never retried), `retries` and `retry_on` (which
handler failures are tried again, within one routing), and `dead_letter`
(told of a route that gave up). Keys are exact strings: a key with a dot
matches `WorkflowEvent.event_type`, one without matches `event_name`;
nothing is stripped, normalised, wildcarded or prefix-matched.

Handlers may be plain or async functions; so may a dead-letter callback.
Predicates, validators and retry predicates are plain functions.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.events.event import WorkflowEvent
from engine.model.telemetry import duplicates_ignored

log = logging.getLogger("duly.events")

MAX_SEEN_EVENT_IDS = 10_000  # event ids an in-memory registry remembers, oldest evicted
MAX_MATCHING_KEPT = 1024  # (type, name) pairs whose routes are kept

Handler = Callable[[WorkflowEvent], Awaitable[object] | object]
Predicate = Callable[[WorkflowEvent], bool]
RetryPredicate = Callable[[BaseException], bool]
DeadLetterHandler = Callable[[WorkflowEvent, BaseException], Awaitable[object] | object]


def callable_identity(fn: object) -> str | None:
    """How registrations compare a callable: `module.qualname` when it has them, else repr()."""
    if fn is None:
        return None
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if module is not None and qualname is not None:
        return f"{module}.{qualname}"
    return repr(fn)


class ValidationFailed(Exception):
    """A validator returned False: the event is not fit for this route."""


@dataclass(frozen=True, eq=False)
class Registration:
    """One route: an event key, a handler, and how its failures are treated."""

    event_key: str
    handler: Handler
    when: Predicate | None = None
    validator: Predicate | None = None
    retries: int = 0  # clamped to at least 0 when registered
    retry_on: RetryPredicate | None = None  # None: every failure is retried
    dead_letter: DeadLetterHandler | None = None

    @property
    def identity(self) -> tuple[Any, ...]:
        """What makes two registrations the same one (the second is then ignored)."""
        return (
            self.event_key,
            callable_identity(self.handler),
            callable_identity(self.validator),
            callable_identity(self.when),
            self.retries,
            callable_identity(self.retry_on),
            callable_identity(self.dead_letter),
        )

    @property
    def routes_by_type(self) -> bool:
        """A key with a dot matches the event type; one without, the event name."""
        return "." in self.event_key

    def matches(self, event: WorkflowEvent) -> bool:
        """Whether this route's key is exactly the event's type (or name)."""
        return self.event_key == (event.event_type if self.routes_by_type else event.event_name)


class EventRegistry(Protocol):
    """What every registry offers: register handlers, publish events."""

    def register(
        self,
        event_key: str,
        handler: Handler,
        *,
        when: Predicate | None = None,
        validator: Predicate | None = None,
        retries: int = 0,
        retry_on: RetryPredicate | None = None,
        dead_letter: DeadLetterHandler | None = None,
    ) -> Registration:
        """Add a route; an identical one already registered is kept instead."""
        ...

    async def publish(self, event: WorkflowEvent) -> bool:
        """Route `event`; True when a handler completed for it in this call."""
        ...


class Routes:
    """Registrations in order, identical ones ignored; thread-safe to add and to snapshot."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._registrations: list[Registration] = []
        self._by_identity: dict[tuple[Any, ...], Registration] = {}
        self._matching: dict[tuple[str, str], tuple[Registration, ...]] = {}  # by (type, name)

    def register(
        self,
        event_key: str,
        handler: Handler,
        *,
        when: Predicate | None = None,
        validator: Predicate | None = None,
        retries: int = 0,
        retry_on: RetryPredicate | None = None,
        dead_letter: DeadLetterHandler | None = None,
    ) -> Registration:
        """Build a registration and add it; an identical one already registered is kept."""
        # The retry count is clamped, and so is the identity that includes it.
        return self.add(
            Registration(
                event_key, handler, when, validator, max(0, retries), retry_on, dead_letter
            )
        )

    def add(self, registration: Registration) -> Registration:
        """Append `registration` unless an identical one exists; return the one kept."""
        with self._lock:
            kept = self._by_identity.setdefault(registration.identity, registration)
            if kept is registration:
                self._registrations.append(registration)
                self._matching.clear()
            return kept

    def matching(self, event: WorkflowEvent) -> tuple[Registration, ...]:
        """The routes for `event`, as of now: type routes first, each bucket in order.

        Kept per (type, name) until the next registration: a drain asks this
        once per event, and events of one kind share their routes. A kept
        answer is read without the lock (a dict lookup is atomic, and the
        answer is immutable); only a miss computes one under it.
        """
        key = (event.event_type, event.event_name)
        found = self._matching.get(key)
        if found is not None:
            return found
        with self._lock:
            snapshot = self._registrations
            by_type = [r for r in snapshot if r.routes_by_type and r.matches(event)]
            by_name = [r for r in snapshot if not r.routes_by_type and r.matches(event)]
            if len(self._matching) >= MAX_MATCHING_KEPT:
                self._matching.clear()  # many kinds of events: start over, never grow
            found = self._matching[key] = tuple(by_type + by_name)
        return found

    def __len__(self) -> int:
        with self._lock:
            return len(self._registrations)


@dataclass(frozen=True)
class RouteResult:
    """What became of one route for one event."""

    registration: Registration
    applicable: bool  # False when `when` said no
    completed: bool = False
    attempts: int = 0
    error: BaseException | None = None
    dead_lettered: bool = False


class RouteTimeout(Exception):
    """A route's handler calls ran past the running timeout of one drain."""


async def route(
    event: WorkflowEvent, reg: Registration, timeout: float | None = None
) -> RouteResult:
    """Run one route for `event`: validate, ask `when`, then the handler with its retries.

    Predicate and retry-predicate exceptions propagate (the caller decides);
    a validator's failure and a handler's last failure come back as the
    result's `error`, to be dead-lettered. `timeout` bounds the time the
    route's handler calls spend awaited (a plain function cannot be
    interrupted, so only what a handler returns to await is timed):
    past it, `RouteTimeout`.
    """
    if reg.validator is not None:
        try:
            if not reg.validator(event):
                raise ValidationFailed(
                    f"The validator of the route {reg.event_key!r} refused event {event.event_id}."
                )
        except Exception as exc:
            return RouteResult(reg, applicable=True, error=exc)
    if reg.when is not None and not reg.when(event):
        return RouteResult(reg, applicable=False)
    attempts = 0
    deadline: float | None = None
    while True:
        attempts += 1
        try:
            result = reg.handler(event)
            if inspect.isawaitable(result):
                if timeout is None:
                    await result
                else:
                    if deadline is None:
                        deadline = asyncio.get_running_loop().time() + timeout
                    await _awaited_until(result, deadline)
        except RouteTimeout:
            raise
        except Exception as exc:
            # retry_on is asked only while the budget allows another attempt.
            if attempts <= reg.retries and (reg.retry_on is None or reg.retry_on(exc)):
                continue
            return RouteResult(reg, applicable=True, attempts=attempts, error=exc)
        return RouteResult(reg, applicable=True, completed=True, attempts=attempts)


async def _awaited_until(result: Awaitable[object], deadline: float) -> None:
    """Await `result`; past `deadline` (the loop's clock), cancel it and raise RouteTimeout."""
    bound = asyncio.timeout_at(deadline)
    try:
        async with bound:
            await result
    except TimeoutError as exc:
        if bound.expired():
            raise RouteTimeout() from exc
        raise  # the handler's own TimeoutError: a failure like any other


class RoutedRegistry:
    """What every registry of ours shares: its routes, and how a route is registered."""

    def __init__(self) -> None:
        self.routes = Routes()

    def register(
        self,
        event_key: str,
        handler: Handler,
        *,
        when: Predicate | None = None,
        validator: Predicate | None = None,
        retries: int = 0,
        retry_on: RetryPredicate | None = None,
        dead_letter: DeadLetterHandler | None = None,
    ) -> Registration:
        """Add a route; an identical one already registered is kept instead."""
        return self.routes.register(
            event_key,
            handler,
            when=when,
            validator=validator,
            retries=retries,
            retry_on=retry_on,
            dead_letter=dead_letter,
        )


class InMemoryEventRegistry(RoutedRegistry):
    """Routes events inline, in this process: for development and tests.

    Each event id is routed once: the id is marked seen before its handlers
    run (a failing handler does not make it publishable again), in a
    bounded cache that evicts the oldest id. A failing route does not stop
    the later ones.
    """

    def __init__(
        self,
        dead_letter_handler: DeadLetterHandler | None = None,
        max_seen_event_ids: int = MAX_SEEN_EVENT_IDS,
    ) -> None:
        super().__init__()
        self.dead_letter_handler = dead_letter_handler
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._max_seen = max(1, max_seen_event_ids)
        self._lock = threading.RLock()

    async def publish(self, event: WorkflowEvent) -> bool:
        """Route `event` to its handlers now; True when at least one applicable one completed.

        False for an event id already published (it routes nothing again).
        """
        if not self._first_sighting(event.event_id):
            duplicates_ignored("memory")
            return False
        completed = False
        for reg in self.routes.matching(event):
            result = await route(event, reg)
            if result.completed:
                completed = True
            elif result.error is not None:
                await self._dead_letter(event, reg, result.error)
        return completed

    def seen(self, event_id: str) -> bool:
        """Whether `event_id` is still in the cache of published ids."""
        with self._lock:
            return event_id in self._seen

    def _first_sighting(self, event_id: str) -> bool:
        with self._lock:
            if event_id in self._seen:
                return False
            self._seen[event_id] = None
            while len(self._seen) > self._max_seen:
                self._seen.popitem(last=False)
            return True

    async def _dead_letter(
        self, event: WorkflowEvent, reg: Registration, error: BaseException
    ) -> None:
        # The route's own dead-letter handler comes before the registry's.
        handler = reg.dead_letter if reg.dead_letter is not None else self.dead_letter_handler
        if handler is None:
            log.warning(
                "event %s (%s): the route %r gave up: %s: %s",
                event.event_id,
                event.event_type,
                reg.event_key,
                type(error).__name__,
                error,
            )
            return
        await maybe_await(handler(event, error))


async def maybe_await(result: object) -> object:
    """`result` awaited when it is awaitable (an async handler's), else as it is."""
    return await result if inspect.isawaitable(result) else result
