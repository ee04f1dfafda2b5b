"""The one FastAPI app: health, runs and their history, writes, events, the outbox, the API docs.

Each route parses its request, calls the engine and shapes the reply. The
engine's errors become HTTP statuses here and only here: a NotFoundError names
something that does not exist (404), any other DulyError is the client's
mistake (400), and anything else is a bug: a 500 whose traceback is logged.
This module is what deploys; the dev routes live in `functions/dev.py`.

The outbox routes read the event tables (`engine.events.views`) and replay
dead letters. A database without an outbox table answers them 404; replaying
one event that is not dead-lettered is a 409 (the request is well formed,
the event's state refuses it).

The write routes address workflows from outside (`POST /workflows/{name}/
start`, `deliver`, `run`, `cancel`), publish events (`POST /events`) and ask
for a wake or a drain. A step's arguments are checked against its
annotations (`Step.arguments`, the same check a `Call` built in Python
gets), and the OpenAPI schema carries, for each workflow table, the bodies
its steps take (`/workflows/<table>/start` and so on, served by the same
routes as the templated paths).

Every write (any method but GET, HEAD and OPTIONS) needs `Authorization:
Bearer $DULY_API_TOKEN`, or an HMAC-SHA256 signature of the body under
`DULY_WEBHOOK_SECRET`: `X-Duly-Timestamp: <unix seconds>` and
`X-Duly-Signature: sha256=<hex of HMAC(secret, f"{timestamp}.{body}")>`,
refused 5 minutes either side of now (a replay inside that window is left
to idempotency keys and event ids). With neither variable set, writes are
open: local development. A body over `DULY_MAX_BODY_BYTES` (1 MiB) is 413,
judged on its Content-Length and counted as it streams in, before it is
read whole (`WriteGuard`).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import hmac
import inspect
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    create_model,
)
from pydantic.json_schema import models_json_schema
from sqlalchemy import ColumnElement, text
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.types import JSON

from engine import (
    ConfigurationError,
    DatabaseEventRegistry,
    DulyError,
    EventSettings,
    NotFoundError,
    NotRunningError,
    TemplateInvalidError,
    WorkflowEvent,
    WorkflowTransitionError,
    connect_workflows,
    get_event_registry,
    run_views,
    run_workflows,
    wake,
)
from engine.events import views
from engine.events.records import EventTables, OutboxColumns, tables_for
from engine.overview import overview as operator_overview
from engine.registry import ENGINE_COLUMNS, registered_workflows
from engine.run_views import key_text, parse_key
from engine.steps import Step
from engine.telemetry import latest_metrics
from functions.console.auth import ConsoleAuth, is_console_path, refusal_page
from functions.console.routes import console_router
from functions.console.templating import STATIC_DIRECTORY as CONSOLE_STATIC
from functions.console.templating import STATIC_URL as CONSOLE_STATIC_URL
from functions.graph_routes import router as graph_router

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from engine.connection import WorkflowConnection
    from engine.registry import WorkflowInfo

log = logging.getLogger("duly.http")

HEALTH_TIMEOUT = 5.0  # seconds for the database to answer SELECT 1
DEFAULT_LIMIT = 50  # runs per page
MAX_LIMIT = 500  # runs per page
MAX_ERRORS = 20  # validation errors in one 422 reply
MAX_ERROR_TEXT = 200  # characters of one error's message or location part
DOCS_ASSETS_URL = "/docs/assets"
# Swagger UI 5 and ReDoc, shipped in a wheel so /docs works offline.
DOCS_ASSETS_PACKAGE = ("fastapi_offline", "static")
SERVER_ERROR = "Internal server error: the traceback is in the server's log."
MAX_EVENT_ID = 200  # characters of an event id in a request
MAX_REPLAY_IDS = 10_000  # event ids in one replay request
# The statuses of engine.events.views.VIEW_STATUSES, for validation and the schema.
OutboxStatus = Literal["pending", "claimed", "processed", "failed", "dead_letter"]
EventId = Annotated[str, Field(min_length=1, max_length=MAX_EVENT_ID)]
MAX_EVENTS = 1000  # events in one POST /events
MAX_TEXT = 1000  # characters of an event's type, name or source
MAX_WAKE_SECONDS = 900.0  # a wake waits at most as long as a Lambda runs
DEFAULT_WAKE_SECONDS = 25.0
MAX_IDEMPOTENCY_KEY = 200  # characters
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB
SIGNATURE_WINDOW = 300  # seconds either side of now a signed request is taken
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
RunState = Literal["running", "waiting", "scheduled", "retrying", "finished", "failed", "cancelled"]
RunOrder = Literal["newest", "soonest"]
WRITE_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "No valid token or signature"},
    404: {"description": "No such workflow or step"},
    409: {"description": "A run with one of these unique values exists already"},
    413: {"description": "Body too large"},
}
# A key in a body: the value of a one-column primary key, or a list for a composite one.
BodyKey = StrictInt | StrictStr | list[StrictInt | StrictStr]

router = APIRouter()
docs_router = APIRouter(include_in_schema=False)


def create_app(
    Session: async_sessionmaker[AsyncSession],
    *,
    run_worker: bool,
    worker_options: dict[str, Any] | None = None,
) -> FastAPI:
    """The HTTP API over Session's database, with a worker in its lifespan if run_worker."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if run_worker:
            async with run_workflows(Session, **(worker_options or {})) as worker:
                app.state.connection = worker.connection
                yield
        else:
            async with connect_workflows(Session) as connection:
                app.state.connection = connection
                yield

    # docs_url and redoc_url None: FastAPI's own pages load their scripts from a CDN.
    app = FastAPI(title="duly", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.Session = Session
    app.add_exception_handler(NotFoundError, _not_found)
    app.add_exception_handler(DulyError, _bad_request)
    app.add_exception_handler(WorkflowTransitionError, _refused_transition)
    app.add_exception_handler(DataError, _refused_by_database)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    settings = GuardSettings.from_env()
    # The console's login and CSRF keys, derived from the same token and secret.
    app.state.console_auth = ConsoleAuth(settings.token, settings.secret)
    # ServerErrors outside WriteGuard: a bug in the guard is a logged 500 too.
    app.add_middleware(WriteGuard, settings=settings, console=app.state.console_auth)
    app.add_middleware(ServerErrors)
    app.include_router(router)
    app.include_router(graph_router)
    app.include_router(docs_router)
    app.include_router(console_router)
    app.mount(DOCS_ASSETS_URL, StaticFiles(packages=[DOCS_ASSETS_PACKAGE]), name="docs-assets")
    app.mount(CONSOLE_STATIC_URL, StaticFiles(directory=CONSOLE_STATIC), name="console-static")

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            connection = getattr(app.state, "connection", None)
            infos = connection.workflows if connection is not None else registered_workflows()
            app.openapi_schema = workflow_openapi(app, infos)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


# -- errors ---------------------------------------------------------------------------


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=404)


async def _bad_request(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=400)


async def _refused_transition(request: Request, exc: Exception) -> JSONResponse:
    """A graph workflow's refusal: its own status (400 or 409) and stable code."""
    assert isinstance(exc, WorkflowTransitionError)
    body: dict[str, Any] = {"detail": str(exc), "code": exc.code}
    if isinstance(exc, TemplateInvalidError):
        body["errors"] = list(exc.errors)
    return JSONResponse(body, status_code=exc.http_status)


async def _refused_by_database(request: Request, exc: Exception) -> JSONResponse:
    # A data exception (SQLSTATE class 22, or psycopg refusing to send a value, such as a
    # NUL byte in text) comes from a value in the request; its statement wrote nothing.
    reason = (str(getattr(exc, "orig", None) or exc).splitlines() or ["invalid"])[0]
    detail = f"The database refused a value in this request: {reason.rstrip('.')}."
    return JSONResponse({"detail": detail}, status_code=400)


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """422 with where and why each value was refused, never the value itself.

    FastAPI's own handler echoes the input back (5 MB in, 5 MB out) and fails
    with a 500 on what JSON cannot encode, such as the Infinity it refused.
    """
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "loc": [part if isinstance(part, int) else _short(str(part)) for part in error["loc"]],
            "msg": _short(str(error["msg"])),
            "type": str(error["type"]),
        }
        for error in exc.errors()[:MAX_ERRORS]
    ]
    return JSONResponse({"detail": errors}, status_code=422)


def _short(value: str) -> str:
    return value if len(value) <= MAX_ERROR_TEXT else value[: MAX_ERROR_TEXT - 1] + "…"


class ServerErrors:
    """Turns an exception no handler took (a bug) into a logged 500 with a short JSON body.

    Starlette's own last-resort handler answers in plain text and raises the
    exception again, so servers log the traceback a second time.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except Exception:
            log.exception("%s %s failed.", scope["method"], scope["path"])
            if started:
                raise  # too late for a 500: the server closes the connection
            response = JSONResponse({"detail": SERVER_ERROR}, status_code=500)
            await response(scope, receive, send)


# -- health and read-only views -------------------------------------------------------


@router.get("/healthz")
async def healthz(request: Request) -> Any:
    """{"ok": true} once the database answers; 503 when it cannot be reached."""
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT):
            async with connection_of(request).engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
    except (SQLAlchemyError, OSError, TimeoutError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        detail = f"The database is unreachable: {reason}"
        return JSONResponse({"ok": False, "detail": detail}, status_code=503)
    return {"ok": True}


@router.get("/metrics")
async def metrics() -> Response:
    """Step attempts and durations in Prometheus' text format (needs duly[metrics])."""
    found = latest_metrics()
    if found is None:
        raise HTTPException(404, "Metrics need prometheus-client: pip install 'duly[metrics]'.")
    body, content_type = found
    return Response(body, media_type=content_type)


@router.get("/workflows")
async def list_workflows(request: Request) -> dict[str, Any]:
    """The workflow tables this app serves: their steps, the lanes they need, their limit."""
    infos = connection_of(request).workflows
    return {"workflows": [_describe(info) for info in infos]}


@router.get("/overview")
async def overview(request: Request) -> dict[str, Any]:
    """Every workflow table's runs by state, due now, stranded and the next due instant;
    the outbox's summary when the app maps one. Counted when asked (whole tables)."""
    try:
        tables: EventTables | None = event_tables(request)
    except NotFoundError:  # an app without an outbox
        tables = None
    return (await operator_overview(connection_of(request), tables)).to_dict()


def _describe(info: WorkflowInfo) -> dict[str, Any]:
    limit = info.limit
    return {
        "name": info.name,
        "steps": list(info.steps),
        "lanes": sorted({step.lane for step in info.steps.values()}),
        "limit": None
        if limit is None
        else {
            "by": limit.by,
            "at_most": limit.at_most,
            "rate": limit.rate,
            "per_seconds": limit.per.total_seconds() if limit.per is not None else None,
        },
    }


@router.get("/runs/{workflow}")
async def list_runs(
    request: Request,
    workflow: str,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
) -> dict[str, Any]:
    """The newest runs of a workflow (by primary key), with their engine columns."""
    info = _workflow(request, workflow)
    page = await run_views.list_runs(connection_of(request), info, limit=limit)
    # Column names, not attribute keys, name the fields: the JSON shows the table.
    return {"workflow": info.name, "runs": jsonable_encoder([run.row for run in page.runs])}


@router.get("/runs/{workflow}/{key}/history")
async def run_history(request: Request, workflow: str, key: str) -> dict[str, Any]:
    """Every attempt of one run, oldest first (404 when no AttemptLog is mapped)."""
    connection = connection_of(request)
    info = _workflow(request, workflow)
    if connection.attempt_log is None:
        raise NotFoundError("No AttemptLog is mapped, so duly keeps no history of runs.")
    row = await run_views.read_run(connection, info, key)
    attempts, _ = await run_views.run_history(connection, info, row)
    return {"workflow": info.name, "key": key, "attempts": jsonable_encoder(attempts)}


# -- the outbox -------------------------------------------------------------------------


class ReplayRequest(BaseModel):
    """Which dead-lettered events to replay; all of them when event_ids is absent."""

    model_config = ConfigDict(extra="forbid")
    event_ids: list[EventId] | None = Field(None, max_length=MAX_REPLAY_IDS)


@router.get("/outbox")
async def outbox_summary(request: Request) -> dict[str, Any]:
    """Outbox rows by status, the next due instant, and handlers with failing routes."""
    summary = await views.outbox_summary(event_tables(request), engine=_reads(request))
    return jsonable_encoder(summary)


@router.get("/outbox/events")
async def list_outbox_events(
    request: Request,
    status: OutboxStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    before: Annotated[str | None, Query(min_length=1, max_length=MAX_EVENT_ID)] = None,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    """Outbox rows newest first; `before` (the last id of a page) or `offset` pages on."""
    page = await views.list_outbox(
        event_tables(request),
        status,
        limit=limit,
        before=before,
        offset=offset,
        engine=_reads(request),
    )
    return {"events": jsonable_encoder(page.rows), "next_before": page.next_before}


@router.get("/outbox/events/{event_id}")
async def outbox_event(request: Request, event_id: str) -> dict[str, Any]:
    """One event as published, its outbox row and each route's delivery record."""
    detail = await views.event_detail(event_tables(request), event_id, engine=_reads(request))
    return jsonable_encoder(detail)


@router.post("/outbox/dead-letters/replay")
async def replay_dead_letters(
    request: Request, body: ReplayRequest | None = None
) -> dict[str, Any]:
    """Make dead-lettered events due again: those of event_ids, or every one."""
    ids = None if body is None else body.event_ids
    replayed = await database_registry(event_tables(request)).replay_dead_letters(ids)
    return {"replayed": replayed, "count": len(replayed)}


@router.post("/outbox/events/{event_id}/replay")
async def replay_event(request: Request, event_id: str) -> dict[str, Any]:
    """Make one dead-lettered event due again; 409 when it is not dead-lettered."""
    tables = event_tables(request)
    replayed = await database_registry(tables).replay_dead_letters([event_id])
    if not replayed:
        detail = await views.event_detail(tables, event_id, engine=_reads(request))
        status = detail.outbox.status if detail.outbox is not None else "without an outbox row"
        raise HTTPException(
            409, f"Event {event_id!r} is {status}, not dead_letter: there is nothing to replay."
        )
    return {"replayed": replayed, "count": len(replayed)}


def event_tables(request: Request) -> EventTables:
    """The event tables of the outbox in this app's database; NotFoundError when it has none."""
    found = [
        info.cls for info in connection_of(request).workflows if issubclass(info.cls, OutboxColumns)
    ]
    if not found:
        raise NotFoundError(
            "This database has no outbox table: map WorkflowOutbox, WorkflowEventRecord and "
            "WorkflowDeliveryAttempt on your base and create their tables."
        )
    try:
        return tables_for(found[-1])
    except ConfigurationError as exc:  # the outbox is there, its record or delivery class not
        raise NotFoundError(str(exc)) from None


def database_registry(tables: EventTables) -> DatabaseEventRegistry:
    """The configured DatabaseEventRegistry, else one for `tables`.

    Used to publish and replay, neither of which reads a setting, so the
    environment's are not parsed for it.
    """
    registry = get_event_registry()
    if isinstance(registry, DatabaseEventRegistry):
        return registry
    return DatabaseEventRegistry(outbox=tables.outbox, settings=EventSettings())


def _reads(request: Request) -> AsyncEngine:
    # Each read its own transaction: no BEGIN and COMMIT round trips.
    return connection_of(request).autocommit


# -- events, wake and drain -------------------------------------------------------------


class EventIn(BaseModel):
    """One event to publish; its id (a fresh UUID when absent) makes a resend harmless."""

    model_config = ConfigDict(extra="forbid")
    event_type: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
    event_name: Annotated[str, Field(max_length=MAX_TEXT)] = ""
    payload: dict[str, Any] = Field(default_factory=dict)
    event_id: EventId | None = None
    occurred_at: AwareDatetime | None = None
    source: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    def event(self) -> WorkflowEvent:
        """The WorkflowEvent this describes; the defaults filled as WorkflowEvent fills them."""
        given = self.model_dump(exclude_none=True)
        return WorkflowEvent(**given)


class EventBatch(BaseModel):
    """Events published together, in one transaction."""

    model_config = ConfigDict(extra="forbid")
    events: list[EventIn] = Field(min_length=1, max_length=MAX_EVENTS)


@router.post("/events")
async def publish_events(request: Request, body: EventBatch | EventIn) -> dict[str, Any]:
    """Publish one event or a batch through the outbox in one transaction; the ids stored.

    An id already stored is answered among `duplicates` and stores nothing.
    """
    given = body.events if isinstance(body, EventBatch) else [body]
    events = [one.event() for one in given]
    registry = database_registry(event_tables(request))
    connection = connection_of(request)
    async with connection.sessionmaker() as session, session.begin():
        stored = await registry.publish_many(events, session=session)
    new = set(stored)
    duplicates = [event.event_id for event in events if event.event_id not in new]
    if stored:
        connection.kick(registry.tables().outbox_table.name)
        await _call_state(request, "kick")
    return {"stored": stored, "duplicates": duplicates}


@router.post("/wake", responses={503: {"description": "Not caught up in time, or no worker"}})
async def wake_up(
    request: Request,
    timeout: Annotated[float, Query(ge=0, le=MAX_WAKE_SECONDS)] = DEFAULT_WAKE_SECONDS,
) -> Any:
    """Run due work until caught up: 200 once it is, 503 when `timeout` seconds pass first.

    The Lambda runtime sets `app.state.wake`; otherwise the worker of this
    process is asked (`engine.wake`), and without one the answer is 503.
    """
    state_wake = getattr(request.app.state, "wake", None)
    try:
        caught_up = await _maybe_await(
            state_wake(timeout) if state_wake is not None else wake(timeout)
        )
    except NotRunningError:
        detail = "No worker runs in this process, so nothing can be woken here."
        return JSONResponse({"caught_up": False, "detail": detail}, status_code=503)
    if not caught_up:
        detail = f"Not caught up within {timeout:g} seconds: more work remains."
        return JSONResponse({"caught_up": False, "detail": detail}, status_code=503)
    return {"caught_up": True}


@router.post("/drain", responses={503: {"description": "No drain configured in this app"}})
async def drain_outbox(request: Request) -> Any:
    """Route the outbox now, through the drain the Lambda runtime sets (`app.state.drain`)."""
    drain = getattr(request.app.state, "drain", None)
    if drain is None:
        detail = (
            "No drain is configured in this app: the serverless runtime sets one; a process "
            "with a worker routes the outbox as it goes (or run `duly drain`)."
        )
        return JSONResponse({"detail": detail}, status_code=503)
    result = await _maybe_await(drain())
    return {"drained": jsonable_encoder(result)}


async def _call_state(request: Request, name: str) -> None:
    """Call `app.state.<name>()` (plain or async) when the runtime set one."""
    found = getattr(request.app.state, name, None)
    if found is not None:
        await _maybe_await(found())


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


# -- workflows: start, deliver, run, cancel ---------------------------------------------


class StartRequest(BaseModel):
    """A new run: its row's columns (by column name), its first step and that step's arguments."""

    model_config = ConfigDict(extra="forbid")
    row: dict[str, Any] = Field(default_factory=dict)
    step: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
    args: dict[str, Any] = Field(default_factory=dict)


class Addressed(BaseModel):
    """Which runs: `key` (a list for a composite key), or `where` {column: value}."""

    model_config = ConfigDict(extra="forbid")
    key: BodyKey | None = None
    where: dict[str, Any] | None = None


class CancelRequest(Addressed):
    """The runs to end where they stand."""


class RunRequest(Addressed):
    """The runs to run a step on now, replacing what they had scheduled."""

    step: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
    args: dict[str, Any] = Field(default_factory=dict)


class DeliverRequest(RunRequest):
    """An event for the runs waiting on `step`; a repeated `idempotency_key` is refused."""

    idempotency_key: Annotated[str, Field(min_length=1, max_length=MAX_IDEMPOTENCY_KEY)] | None = (
        None
    )
    restart: bool = False


@router.post("/workflows/{name}/start", status_code=201, responses=WRITE_RESPONSES)
async def start_workflow(request: Request, name: str, body: StartRequest) -> dict[str, Any]:
    """Insert a run and its first step; 409 when a unique key of the row already has a run."""
    info = _writable(request, name)
    step = _step(info, body.step)
    call = _call(step, body.args)
    values = _row_values(info, body.row)
    row = info.cls(**values)
    try:
        started = await row.start(call)
    except IntegrityError as exc:  # NOT NULL, CHECK or a foreign key: the row's values
        reason = (str(exc.orig).splitlines() or ["refused"])[0] if exc.orig else "refused"
        raise HTTPException(400, f"The database refused this {info.name} row: {reason}") from None
    if not started:
        raise HTTPException(
            409, f"A {info.name} run with one of these unique values exists: none was started."
        )
    await _call_state(request, "kick")  # on Lambda nothing else runs the step now due
    return {"workflow": info.name, "key": key_text(info, row), "step": step.name}


@router.post("/workflows/{name}/deliver", responses=WRITE_RESPONSES)
async def deliver_to_workflow(request: Request, name: str, body: DeliverRequest) -> dict[str, Any]:
    """Deliver an event to the addressed runs; how many accepted it (waiting, or holding it)."""
    info = _writable(request, name)
    call = _call(_step(info, body.step), body.args)
    handle = info.cls.by(*_where(info, body))
    accepted = await handle.deliver(call, key=body.idempotency_key, restart=body.restart)
    if accepted:
        await _call_state(request, "kick")
    return {"workflow": info.name, "accepted": accepted}


@router.post("/workflows/{name}/run", responses=WRITE_RESPONSES)
async def run_on_workflow(request: Request, name: str, body: RunRequest) -> dict[str, Any]:
    """Run a step now on the addressed runs, replacing what was scheduled; how many."""
    info = _writable(request, name)
    call = _call(_step(info, body.step), body.args)
    addressed = await info.cls.by(*_where(info, body)).run(call)
    if addressed:
        await _call_state(request, "kick")
    return {"workflow": info.name, "addressed": addressed}


@router.post("/workflows/{name}/cancel", responses=WRITE_RESPONSES)
async def cancel_workflow(request: Request, name: str, body: CancelRequest) -> dict[str, Any]:
    """End the addressed runs where they stand; how many were live."""
    info = _writable(request, name)
    cancelled = await info.cls.by(*_where(info, body)).cancel()
    return {"workflow": info.name, "cancelled": cancelled}


def _writable(request: Request, name: str) -> WorkflowInfo:
    info = _workflow(request, name)
    if issubclass(info.cls, OutboxColumns):
        raise NotFoundError(f"{info.name} is the outbox: publish events with POST /events instead.")
    return info


def _step(info: WorkflowInfo, name: str) -> Step[Any, Any]:
    found = info.steps.get(name)
    if found is None:
        steps = ", ".join(info.steps) or "none"
        raise NotFoundError(f"Workflow {info.name} has no step {name!r}; its steps: {steps}.")
    return found


def _call(step: Step[Any, Any], args: dict[str, Any]) -> Any:
    """The call of `step` with `args` by name; 422 naming each argument that does not fit."""
    try:
        step.arguments.validate(args)
    except ValidationError as exc:
        raise _invalid(exc, "args") from None
    except ValueError:  # NaN or Infinity: JSON has neither
        raise _invalid_at(["body", "args"], "Arguments must be JSON: no NaN or Infinity.") from None
    return step.call_named(args)


def _invalid(exc: ValidationError, field: str) -> RequestValidationError:
    errors = [
        {"loc": ["body", field, *error["loc"]], "msg": error["msg"], "type": error["type"]}
        for error in exc.errors()
    ]
    return RequestValidationError(errors)


def _invalid_at(loc: list[str | int], message: str) -> RequestValidationError:
    return RequestValidationError([{"loc": loc, "msg": message, "type": "value_error"}])


@dataclass(frozen=True, eq=False)
class Columns:
    """A workflow's own columns (not the engine's), checked as JSON like step arguments."""

    model: type[BaseModel]  # the row a start inserts, by column name
    keys: dict[str, str]  # column name -> attribute key
    adapters: dict[str, TypeAdapter[Any]]  # column name -> one value, or null


@lru_cache(maxsize=256)
def columns_of(info: WorkflowInfo) -> Columns:
    """The pydantic model of a workflow's columns, built once per table.

    A column is required when it is NOT NULL with no default of either kind
    and is not the autoincrementing key; JSON columns take any JSON.
    """
    fields: dict[str, Any] = {}
    keys: dict[str, str] = {}
    adapters: dict[str, TypeAdapter[Any]] = {}
    strict = ConfigDict(strict=True)
    for number, column in enumerate(c for c in info.table.c if c.name not in ENGINE_COLUMNS):
        kind = _python_type(column)
        required = not (
            column.nullable
            or column.default is not None
            or column.server_default is not None
            or column is info.table.autoincrement_column
        )
        hint: Any = kind | None if column.nullable and kind is not Any else kind
        fields[f"c{number}"] = (hint, Field(... if required else None, alias=column.name))
        keys[column.name] = info.mapper.get_property_by_column(column).key
        adapters[column.name] = TypeAdapter(kind | None if kind is not Any else Any, config=strict)
    model = create_model(
        f"{info.cls.__name__}_row", __config__=ConfigDict(strict=True, extra="forbid"), **fields
    )
    return Columns(model, keys, adapters)


def _python_type(column: Any) -> Any:
    """The Python type a column's values take, or Any when there is none pydantic can check."""
    if isinstance(column.type, JSON):
        return Any
    try:
        kind = column.type.python_type
        TypeAdapter(kind)
    except Exception:  # NotImplementedError, or no schema for the type: unchecked
        return Any
    return kind


def _row_values(info: WorkflowInfo, row: dict[str, Any]) -> dict[str, Any]:
    """The row's values by attribute key, parsed from JSON; 422 for what does not fit."""
    columns = columns_of(info)
    try:
        parsed = columns.model.model_validate_json(json.dumps(row, allow_nan=False))
    except ValidationError as exc:
        raise _invalid(exc, "row") from None
    except ValueError:
        raise _invalid_at(["body", "row"], "The row must be JSON: no NaN or Infinity.") from None
    given = parsed.model_dump(by_alias=True, exclude_unset=True)
    return {columns.keys[name]: value for name, value in given.items()}


def _where(info: WorkflowInfo, body: Addressed) -> list[ColumnElement[bool]]:
    """The WHERE clause of `key` or `where`; exactly one must be given."""
    if (body.key is None) == (body.where is None):
        raise _invalid_at(["body"], "Give the runs' key or a where object, one of them.")
    if body.key is not None:
        key = body.key if isinstance(body.key, list) else [body.key]
        parts = parse_key(info, json.dumps(key) if len(key) != 1 else str(key[0]))
        return [c == v for c, v in zip(info.mapper.primary_key, parts, strict=True)]
    assert body.where is not None
    if not body.where:
        raise _invalid_at(["body", "where"], "where needs a column: it would address every run.")
    columns = columns_of(info)
    clauses: list[ColumnElement[bool]] = []
    for name, value in body.where.items():
        adapter = columns.adapters.get(name)
        if adapter is None:
            raise _invalid_at(["body", "where", name], f"{info.name} has no column {name!r}.")
        if isinstance(info.table.c[name].type, JSON):  # json has no = in PostgreSQL
            raise _invalid_at(["body", "where", name], f"{name} is JSON: it cannot be matched.")
        try:
            typed = adapter.validate_json(json.dumps(value, allow_nan=False))
        except ValidationError as exc:
            raise _invalid(exc, "where") from None
        except ValueError:
            raise _invalid_at(["body", "where", name], "No NaN or Infinity in JSON.") from None
        column = info.table.c[name]
        clauses.append(column.is_(None) if typed is None else column == typed)
    return clauses


# -- workflows: reading runs ------------------------------------------------------------


@router.get("/workflows/{name}/runs")
async def list_workflow_runs(
    request: Request,
    name: str,
    state: RunState | None = None,
    next_step: Annotated[str | None, Query(min_length=1, max_length=MAX_TEXT)] = None,
    key: Annotated[str | None, Query(min_length=1, max_length=MAX_TEXT)] = None,
    error: Annotated[str | None, Query(min_length=1, max_length=MAX_TEXT)] = None,
    order: RunOrder = "newest",
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    after: Annotated[str | None, Query(min_length=1, max_length=MAX_TEXT)] = None,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> dict[str, Any]:
    """Runs with their state, filtered; newest (highest key) or soonest due first, paged.

    `next_after` is the cursor of the next page (pass it as `after`), and
    `next_offset` the offset of the next page; each is null on the last. A
    page (unless by offset) reads at most 5,000 runs of the table: `searching`
    says it stopped there with fewer runs than asked, and `next_after` goes on.
    """
    info = _workflow(request, name)
    filters = run_views.RunFilter(state=state, step=next_step, key=key, error=error)
    page = await run_views.list_runs(
        connection_of(request), info, filters, order=order, limit=limit, after=after, offset=offset
    )
    return {
        "workflow": info.name,
        "runs": jsonable_encoder([run.to_dict() for run in page.runs]),
        "next_after": page.next_after,
        "next_offset": page.next_offset,
        "searching": page.searching,
    }


@router.get("/workflows/{name}/runs/{key}")
async def workflow_run(request: Request, name: str, key: str) -> dict[str, Any]:
    """One run: its row, its state, what it waits for, and its history when a log is mapped."""
    info = _workflow(request, name)
    detail = await run_views.run_detail(connection_of(request), info, key)
    found: dict[str, Any] = jsonable_encoder(detail.to_dict())
    return found


# -- the OpenAPI schema: each workflow's bodies, from its steps --------------------------


def workflow_openapi(app: FastAPI, infos: list[WorkflowInfo]) -> dict[str, Any]:
    """The app's schema plus, per workflow table, start/deliver/run paths with step bodies.

    Those paths are served by the templated routes; their bodies are a
    `oneOf` discriminated by `step`, each step's `args` the model of its
    signature (`Step.arguments`), so a client sees exactly what it may send.
    """
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    components["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "DULY_API_TOKEN"},
        "signature": {
            "type": "apiKey",
            "in": "header",
            "name": "X-Duly-Signature",
            "description": "sha256=<hex of HMAC-SHA256(DULY_WEBHOOK_SECRET, "
            '"<X-Duly-Timestamp>.<body>")>, with X-Duly-Timestamp in Unix seconds.',
        },
    }
    for path in schema.get("paths", {}).values():
        for method, operation in path.items():
            if method.upper() not in SAFE_METHODS:
                operation["security"] = [{"bearer": []}, {"signature": []}]
    writable = [info for info in infos if not issubclass(info.cls, OutboxColumns)]
    models: list[tuple[Any, Literal["validation"]]] = []
    for info in writable:
        models.append((columns_of(info).model, "validation"))
        models.extend((s.arguments.model, "validation") for s in info.steps.values())
    refs, defs = models_json_schema(
        models, by_alias=True, ref_template="#/components/schemas/{model}"
    )
    schemas.update(defs.get("$defs", {}))
    templated = schema["paths"]
    for info in writable:
        row_ref = refs[(columns_of(info).model, "validation")]
        for action in ("start", "deliver", "run"):
            generic = templated.get(f"/workflows/{{name}}/{action}", {}).get("post")
            if generic is None or not info.steps:
                continue
            bodies = []
            for step in info.steps.values():
                body = _step_body(action, step, refs[(step.arguments.model, "validation")])
                if action == "start":
                    body["properties"]["row"] = row_ref
                    body["required"].append("row")
                bodies.append(body)
            operation = copy.deepcopy(generic)
            operation["parameters"] = []
            operation["operationId"] = f"{action}_{info.name}"
            operation["summary"] = f"{action.capitalize()} {info.name}"
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"oneOf": bodies}}},
            }
            templated[f"/workflows/{info.name}/{action}"] = {"post": operation}
    return schema


def _step_body(action: str, step: Step[Any, Any], args_ref: dict[str, Any]) -> dict[str, Any]:
    """The body of `action` for one step: its name as a constant and its arguments' model."""
    properties: dict[str, Any] = {"step": {"type": "string", "enum": [step.name]}, "args": args_ref}
    if action in ("deliver", "run"):
        properties["key"] = {
            "anyOf": [
                {"type": "integer"},
                {"type": "string"},
                {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string"}]}},
            ]
        }
        properties["where"] = {"type": "object", "minProperties": 1}
    if action == "deliver":
        properties["idempotency_key"] = {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_IDEMPOTENCY_KEY,
        }
        properties["restart"] = {"type": "boolean"}
    required = ["step"]
    if any(
        p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in list(step.signature.parameters.values())[1:]
    ):
        required.append("args")
    return {
        "title": f"{step.qualname} ({action})",
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


# -- writes: who may, and how much ----------------------------------------------------


@dataclass(frozen=True)
class GuardSettings:
    """Who may write, and the largest body any request may send."""

    token: str | None = None
    secret: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    @classmethod
    def from_env(cls) -> GuardSettings:
        """DULY_API_TOKEN, DULY_WEBHOOK_SECRET and DULY_MAX_BODY_BYTES; empty means unset."""
        raw = os.environ.get("DULY_MAX_BODY_BYTES", "").strip()
        try:
            limit = int(raw) if raw else DEFAULT_MAX_BODY_BYTES
        except ValueError:
            limit = -1
        if limit < 1:
            raise ConfigurationError(
                f"DULY_MAX_BODY_BYTES must be a whole number of bytes above 0, not {raw!r}."
            )
        return cls(
            token=os.environ.get("DULY_API_TOKEN") or None,
            secret=os.environ.get("DULY_WEBHOOK_SECRET") or None,
            max_body_bytes=limit,
        )

    @property
    def open(self) -> bool:
        """Whether writes need nothing (neither a token nor a secret is set: local dev)."""
        return self.token is None and self.secret is None


def signature_of(secret: str, timestamp: str, body: bytes) -> str:
    """The X-Duly-Signature value of `body` sent at `timestamp`: `sha256=<hex>`."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


class BodyTooLarge(Exception):
    """A request body went past the limit while it was read."""


class WriteGuard:
    """Refuses bodies over the limit (413) and writes without a token or signature (401).

    Pure ASGI, so a body is counted as it arrives and never read past the
    limit; a write's body is read here (at most the limit) and handed on
    whole to the app, since its signature covers all of it. A write to the
    console (`/console/...`, a browser's form) is judged by the console's
    rules instead: its CSRF token always, and the session the login form
    set whenever a token or secret is set (`ConsoleAuth.write_refusal`);
    the routes it reaches then call the API's own route functions.
    """

    def __init__(
        self, app: ASGIApp, settings: GuardSettings, console: ConsoleAuth | None = None
    ) -> None:
        self.app = app
        self.settings = settings
        self.console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        limit = self.settings.max_body_bytes
        length = headers.get("content-length", "")
        if length.strip().isdigit() and int(length) > limit:
            await _refuse(scope, receive, send, 413, _too_large(limit))
            return
        if scope["method"] in SAFE_METHODS:
            await self.app(scope, _counted(receive, limit), send)
            return
        if self.console is not None and is_console_path(scope["path"]):
            await self._console_write(scope, receive, send, headers)
            return
        bearer = self._bearer_ok(headers)
        if not bearer and self.settings.secret is None and self.settings.token is not None:
            await _refuse(scope, receive, send, 401, _unauthenticated(self.settings))
            return
        try:
            body = await _read_body(receive, limit)
        except BodyTooLarge:
            await _refuse(scope, receive, send, 413, _too_large(limit))
            return
        if not bearer and not self.settings.open:
            refused = self._signature_refused(headers, body)
            if refused is not None:
                await _refuse(scope, receive, send, 401, refused)
                return
        await self.app(scope, _replayed(body, receive), send)

    async def _console_write(
        self, scope: Scope, receive: Receive, send: Send, headers: Mapping[str, str]
    ) -> None:
        assert self.console is not None
        limit = self.settings.max_body_bytes
        try:
            body = await _read_body(receive, limit)
        except BodyTooLarge:
            await _refuse(scope, receive, send, 413, _too_large(limit))
            return
        refused = self.console.write_refusal(scope["path"], headers, body)
        if refused is not None:
            await refusal_page(*refused, scope)(scope, receive, send)
            return
        await self.app(scope, _replayed(body, receive), send)

    def _bearer_ok(self, headers: Mapping[str, str]) -> bool:
        token = self.settings.token
        if token is None:
            return False
        scheme, _, given = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), token.encode()
        )

    def _signature_refused(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """Why the request's signature is not good, or None when it is."""
        secret = self.settings.secret
        if secret is None:
            return _unauthenticated(self.settings)
        timestamp = headers.get("x-duly-timestamp", "").strip()
        signature = headers.get("x-duly-signature", "").strip()
        if not timestamp or not signature:
            return _unauthenticated(self.settings)
        if not timestamp.isdigit() or len(timestamp) > 12:
            return "X-Duly-Timestamp must be the time of signing in whole Unix seconds."
        if abs(time.time() - int(timestamp)) > SIGNATURE_WINDOW:
            return (
                f"The signature's timestamp is more than {SIGNATURE_WINDOW // 60} minutes "
                "from now: sign the request again."
            )
        expected = signature_of(secret, timestamp, body)
        if not hmac.compare_digest(signature.encode(), expected.encode()):
            return "X-Duly-Signature does not match the body and timestamp."
        return None


def _unauthenticated(settings: GuardSettings) -> str:
    ways = []
    if settings.token is not None:
        ways.append("Authorization: Bearer <DULY_API_TOKEN>")
    if settings.secret is not None:
        ways.append("X-Duly-Timestamp and X-Duly-Signature (HMAC-SHA256 of the body)")
    return f"This route writes: send {' or '.join(ways)}."


def _too_large(limit: int) -> str:
    return f"The request body is larger than {limit} bytes (DULY_MAX_BODY_BYTES)."


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, detail: str) -> None:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    response = JSONResponse({"detail": detail}, status_code=status, headers=headers)
    await response(scope, receive, send)


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, or BodyTooLarge as soon as it passes `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away: what came is all there is
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replayed(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app `body` whole, then the client's own messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _counted(receive: Receive, limit: int) -> Receive:
    """A receive that fails with a 413 once the body passes `limit` (a GET with a body)."""
    size = 0

    async def counted() -> Message:
        nonlocal size
        message = await receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                raise HTTPException(413, _too_large(limit))
        return message

    return counted


# -- API docs, served from a wheel rather than a CDN -----------------------------------


@docs_router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI over this app's OpenAPI schema, every asset served by the app itself."""
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title="duly: API",
        swagger_js_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png",
    )


@docs_router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    """ReDoc over the same schema, also without a CDN (or Google's fonts)."""
    root = request.scope.get("root_path", "")
    return get_redoc_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title="duly: API",
        redoc_js_url=f"{root}{DOCS_ASSETS_URL}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png",
        with_google_fonts=False,
    )


# -- helpers -------------------------------------------------------------------------------


def connection_of(request: Request) -> WorkflowConnection:
    """The workflow connection the app's lifespan opened."""
    connection: WorkflowConnection = request.app.state.connection
    return connection


def _workflow(request: Request, name: str) -> WorkflowInfo:
    for info in connection_of(request).workflows:
        if info.name == name:
            return info
    raise NotFoundError(f"No workflow named {name!r}.")
