"""The dev app: the API of `functions.app` plus helpers a deployment must not have.

`duly dev` serves this; a deployed app serves `create_app` alone. The dev
routes move the database clock (so days of workflow time pass at once),
start the example's Onboarding run (the demo run `duly dev` starts at first
is one of those), publish the example's `expense.submitted` event
through the outbox, so the outbox row (`/outbox/events`) and then the
Expense run its handler starts (`/runs/expense`) can be watched, and
create the example's expense claims, which `POST /graphs/instances`
submits to the expense-approval graph (`install_example_graph` saves and
activates it when `duly dev` starts). The example's routes (and so the
console's example form) exist only while the app is duly's examples.
"""

from __future__ import annotations

import inspect
import logging
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Form, HTTPException, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import (
    InvalidArgumentError,
    NotFoundError,
    WorkflowEvent,
    activate_template,
    active_template_id,
    connect_workflows,
    get_graph_runtime,
    save_design,
    settings as variables,
)
from engine.testing import MAX_CLOCK_SHIFT, move_clock, reset_clock
from functions.app import create_app
from functions.console.auth import require_reader
from functions.console.overview_pages import clock_of
from functions.console.rendering import ConsolePage, error_page, render, shift_text
from functions.http.hosts import dev_hosts
from functions.http.state import connection_of
from functions.identity.access import allow
from functions.identity.principal import Role
from functions.requests.lookup import database_registry, event_tables

if TYPE_CHECKING:
    from engine import WorkflowConnection

log = logging.getLogger("duly.dev")

DEFAULT_BIND_HOST = variables.HOST.default  # what `duly dev` serves on unless told
MAX_CLOCK_MOVE = MAX_CLOCK_SHIFT  # per request, as in total (engine.testing): far from overflow
EXAMPLES_MODULE = "functions.examples"  # named, not imported: the dev app serves any app
DEMO_USER = "demo"
DEMO_EMAIL = "demo@example.com"
EXPENSE_SUBMITTED = "expense.submitted"  # the examples' event, named like the module
MAX_EXPENSE_ID = 2**31 - 1  # the expense table's integer key

dev_router = APIRouter(prefix="/dev", tags=["dev"], dependencies=[allow(Role.OPERATOR)])
# The routes that make the examples' rows: served only when DULY_APP is the examples.
examples_router = APIRouter(prefix="/dev", tags=["dev"], dependencies=[allow(Role.OPERATOR)])
# The console's clock control: a console page's form, so its session and CSRF rules apply.
console_clock_router = APIRouter(
    prefix="/console",
    route_class=ConsolePage,
    dependencies=[Depends(require_reader), allow(Role.OPERATOR)],
    include_in_schema=False,
)
ClockUnit = Literal["minutes", "hours", "days"]
ClockDirection = Literal["forward", "back", "reset"]


def create_dev_app(
    Session: async_sessionmaker[AsyncSession],
    *,
    run_worker: bool = True,
    worker_options: dict[str, Any] | None = None,
    bind_host: str = DEFAULT_BIND_HOST,
    examples: bool | None = None,
) -> FastAPI:
    """The app of `create_app` with the /dev routes: for `duly dev` and tests, never deployed.

    It answers only to loopback names and `bind_host` unless DULY_ALLOWED_HOSTS says others.
    The examples' routes come with it when `examples` says so, by default when DULY_APP
    names duly's examples (unset, it does): a user's own app has the clock routes alone.
    """
    app = create_app(
        Session,
        run_worker=run_worker,
        worker_options=worker_options,
        allowed_hosts=dev_hosts(bind_host),
    )
    app.include_router(dev_router)
    if serves_examples() if examples is None else examples:
        app.include_router(examples_router)
    app.include_router(console_clock_router)
    app.state.console_clock = True  # the overview shows the clock control
    return app


# As sent: a boolean is no number (pydantic would read false as 0), a number no text.
STRICT = ConfigDict(extra="forbid", strict=True)


class ClockMove(BaseModel):
    """How far to move the database clock; every field defaults to 0."""

    model_config = STRICT
    days: float = Field(0.0, allow_inf_nan=False)
    hours: float = Field(0.0, allow_inf_nan=False)
    minutes: float = Field(0.0, allow_inf_nan=False)
    seconds: float = Field(0.0, allow_inf_nan=False)


class NewOnboarding(BaseModel):
    """Whom the example Onboarding run is for."""

    model_config = STRICT
    user_id: str = Field(min_length=1, max_length=200)
    email: str = Field(min_length=1, max_length=320)


class NewExpenseClaim(BaseModel):
    """An expense claim, the subject the example's approval graph runs on."""

    model_config = STRICT
    title: str = Field(min_length=1, max_length=200)
    amount: int = Field(ge=0, le=MAX_EXPENSE_ID)
    submitted_by: str = Field(min_length=1, max_length=200)


class NewExpense(BaseModel):
    """An expense to submit: the example's handler starts its Expense run."""

    model_config = STRICT
    expense_id: int = Field(ge=1, le=MAX_EXPENSE_ID)
    amount: int = Field(ge=0, le=MAX_EXPENSE_ID)


@dev_router.post("/clock")
async def dev_move_clock(request: Request, move: ClockMove) -> dict[str, float]:
    """Move the database clock; the new shift from PostgreSQL's own time, in seconds."""
    try:
        by = timedelta(**move.model_dump())
    except OverflowError:
        by = None
    if by is None or abs(by) > MAX_CLOCK_MOVE:
        raise HTTPException(400, f"Move the clock by at most {MAX_CLOCK_MOVE.days} days at once.")
    try:
        shift = await move_clock(request.app.state.Session, by)
    except InvalidArgumentError as exc:  # past the total shift the clock may have
        raise HTTPException(400, str(exc)) from None
    announce_clock_move(request)
    return {"shift_seconds": shift.total_seconds()}


@dev_router.post("/clock/reset")
async def dev_reset_clock(request: Request) -> dict[str, float]:
    """Put the database clock back on PostgreSQL's own time."""
    await reset_clock(request.app.state.Session)
    announce_clock_move(request)
    return {"shift_seconds": 0.0}


def announce_clock_move(request: Request) -> None:
    """Tell `app.state.clock_moved`, if set (`duly dev --serverless`'s firer), of the move.

    Workers hear the NOTIFY; the firer holds no connection to hear it on.
    """
    moved = getattr(request.app.state, "clock_moved", None)
    if moved is not None:
        moved()


@console_clock_router.post("/clock", response_model=None)
async def console_move_clock(
    request: Request,
    amount: Annotated[str, Form(max_length=40)] = "1",
    unit: Annotated[ClockUnit, Form()] = "days",
    direction: Annotated[ClockDirection, Form()] = "forward",
) -> Response:
    """The overview's clock control: move the clock (through `POST /dev/clock`) or reset it.

    htmx gets the control back, redrawn, and tells the overview to refresh
    at once; a browser without script goes back to the overview.
    """
    error = None
    try:
        if direction == "reset":
            await dev_reset_clock(request)
        else:
            by = float(amount.strip())
            if by != by or by in (float("inf"), float("-inf")):  # NaN or infinite
                raise ValueError(amount)
            move = ClockMove(**{unit: -by if direction == "back" else by})
            await dev_move_clock(request, move)
    except ValueError:
        error = f"{amount!r} is not a number of {unit}."
    except HTTPException as exc:
        error = str(exc.detail)
    if not request.headers.get("hx-request"):
        if error is not None:
            return error_page(request, 400, error)
        return RedirectResponse("/console", status_code=303)
    now, shift = await clock_of(request)
    note = None if error else f"Moved: the clock is now {shift_text(shift)} from PostgreSQL's own."
    context = {
        "now": now,
        "shift": shift,
        "amount": amount,
        "unit_chosen": unit,
        "clock_error": error,
        "clock_note": note,
    }
    response = render(request, "overview/clock.html", context, status_code=200)
    if error is None:
        response.headers["HX-Trigger"] = "clock-moved"
    return response


@examples_router.post("/onboarding")
async def dev_start_onboarding(request: Request, new: NewOnboarding) -> dict[str, Any]:
    """Start the example's Onboarding run; started is false when the user already has one."""
    started, key = await start_onboarding(connection_of(request), new.user_id, new.email)
    return {"started": started, "id": key}


@examples_router.post("/expenses")
async def dev_submit_expense(request: Request, new: NewExpense) -> dict[str, Any]:
    """Publish `expense.submitted` through the outbox; the worker's drain starts the run.

    Submitting the same expense again publishes another event, whose
    delivery finds the run already started and starts none.
    """
    connection = connection_of(request)
    example_class(connection, "Expense")
    tables = event_tables(connection.workflows)
    event = WorkflowEvent(
        event_type=EXPENSE_SUBMITTED,
        event_name="expense_submitted",
        payload={"expense_id": new.expense_id, "amount": new.amount},
        source="duly dev",
    )
    # In a transaction, as a business change would publish it: announced when it commits.
    async with connection.sessionmaker() as session, session.begin():
        await database_registry(tables).publish(event, session=session)
    kick = getattr(request.app.state, "kick", None)
    if kick is not None:  # serverless: nothing else runs the outbox row now due
        kicked = kick()
        if inspect.isawaitable(kicked):
            await kicked
    return {"event_id": event.event_id, "expense_id": new.expense_id}


@examples_router.post("/expense-claims", status_code=201)
async def dev_create_expense_claim(request: Request, new: NewExpenseClaim) -> dict[str, Any]:
    """Create an example expense claim; submit it with `POST /graphs/instances`."""
    claim_class = examples_module().ExpenseClaim
    async with request.app.state.Session() as session, session.begin():
        claim = claim_class(**new.model_dump())
        session.add(claim)
    return {
        "id": claim.id,
        "subject_type": claim_class.__tablename__,
        "subject_key": str(claim.id),
        "workflow": examples_module().expense_graph.EXPENSE_APPROVAL,
    }


def serves_examples() -> bool:
    """Whether DULY_APP names duly's examples (as it does unset)."""
    return variables.APP.read() == EXAMPLES_MODULE


def examples_module() -> Any:
    """The example app's module, if this process loaded it."""
    module = sys.modules.get(EXAMPLES_MODULE)
    if module is None:
        raise NotFoundError(
            f"The example app is not loaded: this needs DULY_APP={EXAMPLES_MODULE}."
        )
    return module


async def install_example_graph() -> None:
    """Save and activate the example's expense-approval graph unless a version is active."""
    module = sys.modules.get(EXAMPLES_MODULE)
    if module is None:
        return
    runtime = get_graph_runtime()
    design = module.expense_graph.DESIGN
    async with runtime.engine.begin() as conn:
        try:
            await active_template_id(conn, runtime.tables, design["name"])
            return
        except NotFoundError:
            pass
        saved = await save_design(conn, runtime.tables, design, runtime.conditions.names())
        await activate_template(conn, runtime.tables, saved.template_id, runtime.conditions.names())
    log.info("saved and activated the %s graph, version %s", design["name"], saved.version)


async def start_onboarding(
    connection: WorkflowConnection, user_id: str, email: str
) -> tuple[bool, Any]:
    """Start an example Onboarding run; (started, id), the id of the existing run if not."""
    onboarding = example_onboarding(connection)
    row = onboarding(user_id=user_id, email=email)
    if await row.start(onboarding.welcome):
        return True, row.id
    async with connection.sessionmaker() as session:
        existing = await session.scalar(select(onboarding.id).where(onboarding.user_id == user_id))
    return False, existing


def example_onboarding(connection: WorkflowConnection) -> Any:
    """The example app's Onboarding class, if this connection serves it."""
    return example_class(connection, "Onboarding")


def example_class(connection: WorkflowConnection, name: str) -> Any:
    """The example app's workflow class `name`, if this connection serves it."""
    for info in connection.workflows:
        if info.cls.__module__ == EXAMPLES_MODULE and info.cls.__name__ == name:
            return info.cls
    raise NotFoundError(
        f"The example app is not loaded: this needs its {name} table, and DULY_APP="
        f"{EXAMPLES_MODULE}."
    )


async def start_demo(Session: async_sessionmaker[AsyncSession]) -> None:
    """Start the demo Onboarding run unless it exists or the example app is not loaded."""
    async with connect_workflows(Session) as connection:
        try:
            started, key = await start_onboarding(connection, DEMO_USER, DEMO_EMAIL)
        except NotFoundError:
            return
    if started:
        log.info("started the demo run onboarding[%s] for %s", key, DEMO_EMAIL)
