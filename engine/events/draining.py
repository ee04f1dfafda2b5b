"""Routing one stored event: its routes, its delivery records, and what becomes of its row.

The outbox's step (`engine.events.outbox`) and `publish_sync` both route through
`drain_event`, which returns a `Verdict`; each applies it to the outbox row its own way.
A handler whose error says the database went away has not failed its route: the drain
raises, and is tried again whole.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from engine.base.driver import lost_connection
from engine.events.deliveries import Delivery, DeliveryLog, handler_name, route_id
from engine.events.event import WorkflowEvent
from engine.events.routing import Registration, RouteTimeout, maybe_await, route
from engine.events.settings import EventSettings
from engine.events.statuses import DEAD_LETTER, FAILED, PROCESSED, SUCCEEDED
from engine.model.telemetry import outbox_drained

log = logging.getLogger("duly.events")

MAX_ERROR_LENGTH = 4000  # characters of the errors a row keeps


@dataclass(frozen=True)
class Verdict:
    """What one drain decided for an outbox row."""

    status: str  # processed, failed or dead_letter
    route_attempts: int
    error: str | None
    retry_in: timedelta | None  # when failed: how long until the row is due again
    completed: bool  # a route completed for the event (in this drain or an earlier one)
    completed_now: bool  # a route completed in this drain
    # What to record with the row's settlement: the last route's success, and every route
    # that failed or was dead-lettered in this drain (earlier successes are recorded already).
    deliveries: tuple[Delivery, ...] = ()


@dataclass(frozen=True)
class Failure:
    """A route that did not complete in this drain."""

    reg: Registration
    attempts: int  # handler calls made
    error: BaseException

    @property
    def route(self) -> str:
        """The route as a person reads it: `event key → module.handler`."""
        return f"{self.reg.event_key} → {handler_name(self.reg)}"

    def describe(self) -> str:
        """The route and its error, for the row's error text."""
        return f"{self.route}: {type(self.error).__name__}: {self.error}"


async def drain_event(
    event: WorkflowEvent,
    routes: Sequence[Registration],
    settings: EventSettings,
    deliveries: DeliveryLog,
    *,
    route_attempts: int,
    first_drain: bool,
) -> Verdict:
    """Route `event` through `routes` once, record each route's result, and judge the row.

    `first_drain` says no drain of this event can have recorded anything yet,
    which saves reading its delivery records. The rules:

    - a route that succeeded or was dead-lettered before is not run again (a
      success counts as a successful route);
    - a validator's refusal dead-letters its route at once and is no failed drain;
    - a handler failure (after the route's retries), a predicate or `retry_on`
      that raised, or a handler past `DULY_DELIVERY_RUNNING_TIMEOUT_SECONDS`
      fails the route for this drain;
    - failed routes beside a successful one: the row is processed, the failures
      dead-lettered; failed routes alone: a failed drain, due again after
      `DULY_RETRY_BACKOFF_SECONDS x route_attempts`, or dead once
      `route_attempts` reaches `DULY_MAX_RETRIES` with dead letters enabled;
    - a dead-letter handler that raises is a failed drain, its route still failed;
    - no applicable route, or all succeeded: processed; only refusals: dead-lettered;
    - an error that says the database went away (`engine.base.driver.lost_connection`)
      is raised, after recording the routes that succeeded before it.
    """
    began = time.perf_counter()
    settled = {} if first_drain else await deliveries.statuses(event.event_id)
    completed = completed_now = False
    failed: list[Failure] = []
    refused: list[Failure] = []
    succeeded: list[Delivery] = []  # the last route's success, recorded with the verdict
    for index, reg in enumerate(routes):
        status = settled.get(route_id(reg))
        if status == SUCCEEDED:
            completed = True
            continue
        if status == DEAD_LETTER:
            continue
        try:
            result = await route(event, reg, settings.delivery_running_timeout_seconds)
        except RouteTimeout:
            limit = settings.delivery_running_timeout_seconds
            error = TimeoutError(f"the handler ran longer than {limit} s")
            failed.append(Failure(reg, 1, error))
            continue
        except Exception as exc:  # the predicate or retry_on raised
            if lost_connection(exc):
                raise
            failed.append(Failure(reg, 0, exc))
            continue
        if not result.applicable:
            continue
        if result.error is not None and lost_connection(result.error):
            raise result.error  # the database, not the route: the whole drain is tried again
        if result.completed:
            completed = completed_now = True
            success = Delivery.of(event.event_id, reg, SUCCEEDED, result.attempts, None)
            if index + 1 < len(routes):
                # Recorded before the next route runs: a drain killed later does not redo it.
                await deliveries.record([success])
            else:
                succeeded.append(success)
        elif result.error is not None:
            failure = Failure(reg, result.attempts, result.error)
            (refused if result.attempts == 0 else failed).append(failure)
    if failed or refused:
        verdict = await _judge(
            event, settings, completed, completed_now, succeeded, failed, refused, route_attempts
        )
        _log_failures(event, settings, routes, failed, refused, route_attempts, verdict)
    else:  # every route that applied completed (or none applied): the row is processed
        verdict = Verdict(
            status=PROCESSED,
            route_attempts=route_attempts,
            error=None,
            retry_in=None,
            completed=completed,
            completed_now=completed_now,
            deliveries=tuple(succeeded),
        )
    outbox_drained(verdict.status, time.perf_counter() - began)
    return verdict


async def _judge(
    event: WorkflowEvent,
    settings: EventSettings,
    completed: bool,
    completed_now: bool,
    succeeded: list[Delivery],
    failed: list[Failure],
    refused: list[Failure],
    route_attempts: int,
) -> Verdict:
    dead = list(refused)
    retrying: list[Failure] = []
    attempts = route_attempts
    if failed and completed:
        dead += failed  # the event had a successful route: the row is done
        status = PROCESSED
    elif failed:
        attempts += 1
        if attempts >= settings.max_retries and settings.dead_letter_enabled:
            dead += failed
            status = DEAD_LETTER
        else:
            retrying = failed
            status = FAILED
    else:
        status = PROCESSED if completed or not refused else DEAD_LETTER

    broken = await _dead_letter(event, dead)
    if broken:
        # The dead-letter handling is owed: those routes stay failed and the drain failed.
        dead = [f for f in dead if f not in broken]
        retrying += broken
        if attempts == route_attempts:
            attempts += 1
        out_of_drains = attempts >= settings.max_retries and settings.dead_letter_enabled
        status = DEAD_LETTER if out_of_drains else FAILED

    records = list(succeeded)
    records += [Delivery.of(event.event_id, f.reg, DEAD_LETTER, f.attempts, _text(f)) for f in dead]
    records += [Delivery.of(event.event_id, f.reg, FAILED, f.attempts, _text(f)) for f in retrying]
    errors = [f.describe() for f in (*failed, *refused)] + [
        f"dead-letter handler of {f.reg.event_key} → {handler_name(f.reg)} raised" for f in broken
    ]
    retry_in = settings.retry_backoff_seconds * attempts if status == FAILED else None
    return Verdict(
        status=status,
        route_attempts=attempts,
        error="\n".join(errors)[:MAX_ERROR_LENGTH] or None,
        retry_in=timedelta(seconds=retry_in) if retry_in is not None else None,
        completed=completed,
        completed_now=completed_now,
        deliveries=tuple(records),
    )


async def _dead_letter(event: WorkflowEvent, dead: list[Failure]) -> list[Failure]:
    """Tell each dead route's dead-letter handler; return the routes whose handler raised."""
    broken = []
    for failure in dead:
        handler = failure.reg.dead_letter
        if handler is None:
            log.warning(
                "event %s (%s): dead-lettered for %s: %s",
                event.event_id,
                event.event_type,
                failure.route,
                _first_line(failure.error),
            )
            continue
        try:
            await maybe_await(handler(event, failure.error))
        except Exception:
            log.exception("event %s: a dead-letter handler raised", event.event_id)
            broken.append(failure)
    return broken


def _log_failures(
    event: WorkflowEvent,
    settings: EventSettings,
    routes: Sequence[Registration],
    failed: list[Failure],
    refused: list[Failure],
    route_attempts: int,
    verdict: Verdict,
) -> None:
    """One line per failed route (its error's class and first line), then the drain's summary.

    No payload and, at INFO, no traceback: a handler's error text is what the operator needs,
    and the traceback follows at DEBUG.
    """
    if not log.isEnabledFor(logging.INFO):
        return
    drain = _drain_number(settings, route_attempts)
    for failure in failed:
        log.info(
            "event %s (%s): %s failed in drain %s after %d handler call%s: %s",
            event.event_id,
            event.event_type,
            failure.route,
            drain,
            failure.attempts,
            "" if failure.attempts == 1 else "s",
            _first_line(failure.error),
        )
        if log.isEnabledFor(logging.DEBUG):
            traceback = failure.error
            log.debug("event %s: %s failed:", event.event_id, failure.route, exc_info=traceback)
    log.info(
        "event %s (%s): drain %s: %d of %d routes failed, %s",
        event.event_id,
        event.event_type,
        drain,
        len(failed) + len(refused),
        len(routes),
        _outcome(verdict),
    )


def _drain_number(settings: EventSettings, route_attempts: int) -> str:
    """This drain's number, and of how many before the dead letter when there is a limit."""
    number = route_attempts + 1
    if not settings.dead_letter_enabled:
        return str(number)
    return f"{number} of {max(1, settings.max_retries)}"


def _outcome(verdict: Verdict) -> str:
    if verdict.status == FAILED:
        return f"due again in {verdict.retry_in}"
    if verdict.status == DEAD_LETTER:
        return "the event is dead-lettered"
    return "the event is processed (its failed routes dead-lettered)"


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _text(failure: Failure) -> str:
    return f"{type(failure.error).__name__}: {failure.error}"[:MAX_ERROR_LENGTH]


def event_from_json(data: dict[str, Any]) -> WorkflowEvent:
    """The event an outbox row carries in its step's arguments."""
    return WorkflowEvent(
        event_type=data["event_type"],
        event_name=data["event_name"],
        payload=data.get("payload") or {},
        event_id=data["event_id"],
        occurred_at=datetime.fromisoformat(data["occurred_at"]),
        source=data.get("source"),
        metadata=data.get("metadata") or {},
    )
