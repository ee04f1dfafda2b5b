"""The one FastAPI app: health, read-only views of runs and history, the outbox, the API docs.

Each route parses its request, calls the engine and shapes the reply. The
engine's errors become HTTP statuses here and only here: a NotFoundError names
something that does not exist (404), any other DulyError is the client's
mistake (400), and anything else is a bug: a 500 whose traceback is logged.
This module is what deploys; the dev routes live in `functions/dev.py`.

The outbox routes read the event tables (`engine.events.views`) and replay
dead letters. A database without an outbox table answers them 404; replaying
one event that is not dead-lettered is a 409 (the request is well formed,
the event's state refuses it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text
from sqlalchemy.exc import DataError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine import (
    ConfigurationError,
    DatabaseEventRegistry,
    DulyError,
    EventSettings,
    NotFoundError,
    connect_workflows,
    get_event_registry,
    run_workflows,
)
from engine.events import views
from engine.events.records import EventTables, OutboxColumns, tables_for
from engine.registry import ENGINE_COLUMNS
from engine.telemetry import latest_metrics

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from engine.connection import WorkflowConnection
    from engine.registry import WorkflowInfo

log = logging.getLogger("duly.http")

HEALTH_TIMEOUT = 5.0  # seconds for the database to answer SELECT 1
DEFAULT_LIMIT = 50  # runs per page
MAX_LIMIT = 500  # runs per page
SHOWN_ENGINE_COLUMNS = ("next_step", "next_args", "wake_at", "attempts", "last_error")
HIDDEN_COLUMNS = frozenset(ENGINE_COLUMNS) - set(SHOWN_ENGINE_COLUMNS)
RUN_COLUMNS = ("workflow", "run_key")  # of the attempt log: the URL already names the run
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
    app.add_exception_handler(DataError, _refused_by_database)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_middleware(ServerErrors)
    app.include_router(router)
    app.include_router(docs_router)
    app.mount(DOCS_ASSETS_URL, StaticFiles(packages=[DOCS_ASSETS_PACKAGE]), name="docs-assets")
    return app


# -- errors ---------------------------------------------------------------------------


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=404)


async def _bad_request(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=400)


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
    rows = await info.cls.by().newest(limit)
    # Column names, not attribute keys, name the fields: the JSON shows the table.
    shown = [
        (column.name, info.mapper.get_property_by_column(column).key)
        for column in info.table.c
        if column.name not in HIDDEN_COLUMNS
    ]
    runs = [{name: getattr(row, key) for name, key in shown} for row in rows]
    return {"workflow": info.name, "runs": jsonable_encoder(runs)}


@router.get("/runs/{workflow}/{key}/history")
async def run_history(request: Request, workflow: str, key: str) -> dict[str, Any]:
    """Every attempt of one run, oldest first (404 when no AttemptLog is mapped)."""
    connection = connection_of(request)
    info = _workflow(request, workflow)
    if connection.attempt_log is None:
        raise NotFoundError("No AttemptLog is mapped, so duly keeps no history of runs.")
    async with connection.sessionmaker() as session:
        try:
            row = await session.get(info.cls, parse_key(info, key))
        except DataError as exc:  # a well-typed key the column still refuses: out of range
            reason = str(exc.orig).splitlines()[0] if exc.orig else "refused by the database"
            raise HTTPException(
                400, f"{key!r} is not a valid key for {info.name}: {reason}."
            ) from None
    if row is None:
        raise NotFoundError(f"No {info.name} run has the key {key!r}.")
    attempts = await row.history()
    shown = [c.key for c in connection.attempt_log.__table__.c if c.key not in RUN_COLUMNS]
    rows = [{name: getattr(attempt, name) for name in shown} for attempt in attempts]
    return {"workflow": info.name, "key": key, "attempts": jsonable_encoder(rows)}


def parse_key(info: WorkflowInfo, key: str) -> tuple[Any, ...]:
    """The primary key in a URL as typed values: the text itself, or a JSON list if composite."""
    columns = list(info.mapper.primary_key)
    if len(columns) == 1:
        parts: list[Any] = [key]
    else:
        try:
            parts = json.loads(key)
        except ValueError:
            parts = []
        if not isinstance(parts, list) or len(parts) != len(columns):
            raise HTTPException(
                400, f"The key of {info.name} has {len(columns)} parts: give a JSON list."
            )
    return tuple(_typed(info, column, part) for column, part in zip(columns, parts, strict=True))


def _typed(info: WorkflowInfo, column: Any, value: Any) -> Any:
    try:
        kind = column.type.python_type
    except NotImplementedError:
        return value
    if isinstance(value, kind):
        return value
    try:
        parse = getattr(kind, "fromisoformat", kind)
        return parse(value if isinstance(value, str) else str(value))
    except (TypeError, ValueError, ArithmeticError):
        expected = f"expected {kind.__name__}"
        message = f"{value!r} is not a valid {column.name} for {info.name}: {expected}."
        raise HTTPException(400, message) from None


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
