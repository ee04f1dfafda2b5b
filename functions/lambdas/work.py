"""What the four Lambda functions do, as coroutines on a `Runtime`: publish, wake, drain, deliver.

Each takes its direct event and answers a small JSON-able dict; a publish's and a
delivery's events are parsed by the request layer (`functions.requests`), as HTTP's are.
A mistake in the input is one of duly's errors; anything else raises, so Lambda retries.
An entry imports what it alone uses when first called (the request models, the event
layer, retention), so a cold wake of plain workflows loads none of them.
wake takes a slot (`infra.aws.wake_slots`) and runs a worker until caught up or
`wake_margin_seconds` before the deadline, invoking one more wake while due work waits
for room, and its successor when it stops behind. The loop: docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DataError, SQLAlchemyError

from engine import (
    DulyError,
    NotFoundError,
    Worker,
    next_due,
    registered_workflows,
    run_workflows,
    settings as variables,
)
from functions.lambdas.observing import wake_finished
from functions.lambdas.resting import DatabaseUnavailableError
from functions.lambdas.runtime import Budget, Container, Runtime
from functions.requests.errors import InputError, Problem

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from engine import WorkflowEvent
    from functions.requests.runs import DeliverRequest

log = logging.getLogger("duly.lambda")

SPREAD_FIRST = 0.5  # seconds into a wake before it first asks whether to invoke another
SPREAD_INTERVAL = 1.0  # seconds between those questions
SPREAD_AFTER_INVOKE = 3.0  # seconds after invoking one before invoking another (cold starts)
MAX_FIELD = 60  # characters of a refused field's name shown
DIRECT_DOOR = "lambda"  # the audit's `via` for what a direct invoke did


# -- input -------------------------------------------------------------------------------


def check_command(event: Any, name: str) -> dict[str, Any]:
    """The event as a dict; an InputError when it is not one or names another function."""
    if event is None:
        return {}
    if not isinstance(event, dict):
        kind = type(event).__name__
        raise InputError.at((), f"The {name} function takes a JSON object, not {kind}.")
    command = event.get("duly", name)
    if command != name:
        raise InputError.at(
            ("duly",),
            f"This is the {name} function, but the event asks for {command!r}: "
            f"send it to the {command} function, or send {{'duly': {name!r}}}.",
        )
    return event


def check_bare_command(event: Any, name: str) -> None:
    """An InputError naming each field of the event beyond `duly`: wake and drain take none
    (an actor named in one is refused, never believed)."""
    body = check_command(event, name)
    extra = [key for key in body if key != "duly"]
    if extra:
        raise InputError(
            [
                Problem((str(key)[:MAX_FIELD],), f"The {name} function takes no such field.")
                for key in extra
            ]
        )


def parse_events(event: Any) -> list[WorkflowEvent]:
    """The events of a publish: `{"events": [...]}` or one event object, as `POST /events`."""
    from functions.requests.events import parse_publish

    body = check_command(event, "publish")
    return parse_publish({k: v for k, v in body.items() if k != "duly"})


def parse_delivery(event: Any) -> tuple[str, DeliverRequest]:
    """The workflow named and the body of `POST /workflows/{workflow}/deliver`."""
    from functions.requests.runs import DeliverRequest, parse_body

    body = check_command(event, "deliver")
    workflow = body.get("workflow")
    if not isinstance(workflow, str) or not workflow:
        raise InputError.at(("workflow",), "workflow must be a non-empty string.")
    given = {k: v for k, v in body.items() if k not in ("duly", "workflow")}
    return workflow, parse_body(DeliverRequest, given)


# -- publish -----------------------------------------------------------------------------


def direct_principal() -> str:
    """Who a direct invoke acts as: DULY_DIRECT_INVOKE_PRINCIPAL, never a name in its payload."""
    return variables.DIRECT_INVOKE_PRINCIPAL.read()


async def record_direct(
    session: AsyncSession, principal: str, action: str, workflow: str, subject: Any, count: int
) -> None:
    """Record in the audit trail, in `session`'s transaction, that a direct invoke acted."""
    from engine import record_action

    await record_action(
        session,
        actor=principal,
        via=DIRECT_DOOR,
        action=action,
        workflow=workflow,
        subject=subject,
        count=count,
    )


async def publish(rt: Runtime, event: Any, budget: Budget) -> dict[str, Any]:
    """Store the events in one transaction, recorded as the direct principal's; their ids,
    which were new, whether a wake was kicked."""
    events = parse_events(event)
    principal = direct_principal()
    container = await rt.container()
    if container.tables is None:
        raise NotFoundError(
            f"{container.app_module} maps no outbox: map WorkflowOutbox, WorkflowEventRecord "
            "and WorkflowDeliveryAttempt on your base to publish events."
        )
    from functions.requests.lookup import database_registry

    registry = database_registry(container.tables, container.registry)
    outbox = container.tables.outbox_table.name
    with container.application.current():
        async with container.Session.begin() as session:
            stored = await registry.publish_many(events, session=session)
            if stored:
                subject = {"event_ids": stored}
                await record_direct(
                    session, principal, "outbox.publish", outbox, subject, len(stored)
                )
    new = set(stored)
    ids = [e.event_id for e in events]
    # An outbox row is due now: routed by a wake, which nothing runs yet.
    kicked = bool(stored) and await rt.kick()
    return {
        "ids": ids,
        "stored": stored,
        "duplicates": [i for i in ids if i not in new],
        "kicked": kicked,
    }


# -- wake ----------------------------------------------------------------------------------


@dataclass
class Spread:
    """How many more wakes this one invoked."""

    invoked: int = 0


async def wake(rt: Runtime, event: Any, budget: Budget) -> dict[str, Any]:
    """Run due work until caught up or near the deadline; the next instant is registered.
    A database that does not answer in time leaves a wake-up to come, and raises."""
    check_bare_command(event, "wake")
    try:
        return await wake_cycle(rt, budget)
    except DatabaseUnavailableError:
        await rt.keep_wake_armed()
        raise


async def wake_cycle(rt: Runtime, budget: Budget) -> dict[str, Any]:
    """One wake: a slot, a worker until caught up or out of time, the slot freed."""
    started = time.monotonic()
    try:
        return await _wake_cycle(rt, budget)
    finally:
        wake_finished(time.monotonic() - started)


async def _wake_cycle(rt: Runtime, budget: Budget) -> dict[str, Any]:
    container = await rt.container()
    result: dict[str, Any] = {"steps": 0, "caught_up": False, "slot": None, "invoked": 0}
    if budget.until_stop() <= 0:
        return {**result, "reason": "too little time left to claim anything"}
    holder = uuid.uuid4().hex
    slot = await container.slots.take(holder, budget.left())
    if slot is None:
        # Every slot is held: the holders were rung and look once more before leaving.
        return {**result, "reason": "busy: every wake slot is held"}
    spread = Spread()
    caught_up = released = False
    try:
        async with run_workflows(
            container.application.parts_for(container.Session),  # its own connection
            on_idle=rt.tell_idle,
            suspends_when_idle=True,
            lease=budget.lease(),
            shutdown_timeout=budget.shutdown(),
            max_concurrency=rt.max_concurrency,
            lanes=all_lanes(),
        ) as worker:
            spreading = asyncio.create_task(spread_work(rt, container, worker, budget, spread))
            try:
                while (left := budget.until_stop()) > 0:
                    since = await container.slots.now()
                    caught_up = await worker.wake(left)
                    if not caught_up:
                        break
                    released = await container.slots.release(slot, holder, since)
                    if released:
                        break
                    caught_up = False  # a wake was refused meanwhile: look once more
            finally:
                spreading.cancel()
                await asyncio.gather(spreading, return_exceptions=True)
            steps = worker.steps_started
        # Leaving run_workflows stopped the worker: steps still running had the shutdown
        # time, and what they could not finish was handed back, due now.
    finally:
        if not released:
            await container.slots.release(slot, holder)
    if not caught_up:
        # What is left goes on in a fresh invocation, not at the next schedule.
        spread.invoked += await rt.invoke_another_wake()
    return {
        **result,
        "steps": steps,
        "caught_up": caught_up,
        "slot": slot,
        "invoked": spread.invoked,
    }


async def spread_work(
    rt: Runtime, container: Container, worker: Worker, budget: Budget, spread: Spread
) -> None:
    """Invoke one more wake whenever work is due that this one has no room for and a slot is free.

    Work due now and not claimed after this worker's passes is work it cannot
    take (or a limit holds back, which another wake would not help).
    """
    infos = list(worker.tables.values())
    # The worker's own answer: a table whose rows name a step this code lacks is served
    # by name, so a row no wake can take never asks for another wake.
    served = [worker.served[info.name] for info in infos]
    bucket = worker.connection.rate_bucket
    table = bucket.__table__ if bucket is not None else None
    await asyncio.sleep(SPREAD_FIRST)
    while True:
        pause = SPREAD_INTERVAL
        try:
            async with worker.connection.autocommit.connect() as conn:
                upcoming = await next_due(conn, infos, served, table)
            if (
                upcoming is not None
                and upcoming.seconds <= 0
                and not upcoming.held
                and await container.slots.free() > 0
            ):
                spread.invoked += await rt.invoke_another_wake()
                pause = SPREAD_AFTER_INVOKE
        except Exception:
            log.exception("wake: could not judge whether to invoke another wake")
        await asyncio.sleep(pause)


def all_lanes() -> set[str]:
    """Every lane of every workflow mapped: on Lambda one wake function serves them all."""
    return {step.lane for info in registered_workflows() for step in info.steps.values()} or {
        "default"
    }


async def http_wake(rt: Runtime, timeout_seconds: float) -> bool:
    """The app's POST /wake: a wake cycle within `timeout_seconds` and the invocation; caught up?"""
    outer = rt.budget
    margin = outer.margin if outer is not None else rt.settings.wake_margin_seconds
    remaining = float(timeout_seconds) + margin
    if outer is not None:
        remaining = min(remaining, outer.left())
    result = await wake_cycle(rt, Budget(remaining, margin, time.monotonic()))
    return bool(result["caught_up"])


# -- drain ---------------------------------------------------------------------------------


async def drain(rt: Runtime, event: Any, budget: Budget) -> dict[str, Any]:
    """Route the outbox rows due now (as `duly drain`), bounded by the deadline.

    Also the safety net: when anything is due now that no wake has taken (a
    lost wake-up, or more than the drain could route), it kicks a wake. With
    DULY_PRUNE_ON_DRAIN, a bounded prune pass follows (`engine.retention`).
    """
    check_bare_command(event, "drain")
    container = await rt.container()
    tables = container.tables
    if tables is None:
        raise NotFoundError(
            f"{container.app_module} maps no outbox: there is nothing to drain. Map "
            "WorkflowOutbox, WorkflowEventRecord and WorkflowDeliveryAttempt on your base."
        )
    from engine import prune, routing_of

    if container.registry is None:  # an outbox is mapped, so the event layer is configured
        raise NotFoundError(f"{container.app_module} configures no event registry.")
    try:
        routes, settings = routing_of(container.registry)
    except TypeError as exc:  # the app configured a registry a drain cannot route with
        raise InputError.at((), str(exc)) from None
    if not len(routes):
        raise InputError.at(
            (),
            f"{container.app_module} registers no event handler: draining would settle every "
            "event as processed without routing it.",
        )
    routed, caught_up = 0, False
    if budget.until_stop() > 0:
        lease = min(budget.lease().total_seconds(), float(settings.outbox_claim_ttl_seconds))
        async with run_workflows(
            container.application.parts_for(container.Session),  # its own connection
            workflows=[tables.outbox],
            suspends_when_idle=True,
            lease=_seconds(lease),
            shutdown_timeout=budget.shutdown(),
            max_concurrency=settings.outbox_batch_size,
        ) as worker:
            caught_up = await worker.wake(budget.until_stop())
            routed = worker.steps_started
    kicked = (not caught_up or await due_now(container)) and await rt.kick()
    result: dict[str, Any] = {"routed": routed, "caught_up": caught_up, "kicked": kicked}
    retention = rt.retention
    if retention.prune_on_drain and budget.until_stop() > 0:
        # A few batches at most, so the drain stays short: the next drain prunes on.
        pruned = await prune(container.connection, retention, max_batches=retention.drain_batches)
        result["pruned"] = {
            "rows": pruned.rows,
            "batches": pruned.batches,
            "complete": pruned.complete,
        }
    return result


async def due_now(container: Container) -> bool:
    """Whether any table has work due now that nobody holds."""
    infos = container.connection.workflows
    if not infos:
        return False
    async with container.connection.autocommit.connect() as conn:
        upcoming = await next_due(conn, infos)
    return upcoming is not None and upcoming.seconds <= 0


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=max(1.0, value))


# -- deliver -------------------------------------------------------------------------------


async def deliver(rt: Runtime, event: Any, budget: Budget) -> dict[str, Any]:
    """Deliver `step(**args)` to the runs named; how many took it, hold it, refused it and why
    (when some accepted it, a wake is kicked and the delivery recorded as the direct
    principal's)."""
    from functions.requests.lookup import find_writable
    from functions.requests.runs import addressed_subject, deliver_event, delivery_answer

    workflow, request = parse_delivery(event)
    principal = direct_principal()
    container = await rt.container()
    connection = container.connection
    info = find_writable(connection, workflow)  # an unknown one's refusal names the app's
    with container.application.current():
        delivered = await deliver_event(info, request)
    if delivered:
        await rt.kick()  # the accepted event's step is due now, and no worker runs here
        subject = {**addressed_subject(request), "step": request.step}
        try:
            async with container.Session.begin() as session:
                await record_direct(
                    session, principal, "run.deliver", info.name, subject, delivered
                )
        except SQLAlchemyError as exc:  # the delivery committed: answer it, never retry it
            log.warning("deliver: its audit record was not written: %s", type(exc).__name__)
    return {**delivery_answer(info, delivered), "step": request.step}


# -- errors --------------------------------------------------------------------------------

# A client's mistake, answered as {"error", "type"}: a Lambda retry would repeat it. A
# DataError is a value PostgreSQL refused (its statement wrote nothing). A
# ConfigurationError (a DulyError too) is the deployment's fault: it raises.
CLIENT_ERRORS: tuple[type[Exception], ...] = (DulyError, DataError)
