"""The one FastAPI app: health, read-only views of runs and history, and dev helpers.

Each route parses its request, calls the engine and shapes the reply. The
engine's errors become HTTP statuses here and only here: a DulyError is the
client's mistake (400), a LookupError names something that does not exist (404).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select, text
from sqlalchemy.exc import DataError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import DulyError, connect_workflows, run_workflows
from engine.telemetry import latest_metrics
from engine.testing import move_clock
from engine.workflow import ENGINE_COLUMNS

if TYPE_CHECKING:
    from engine.connection import WorkflowConnection
    from engine.workflow import WorkflowInfo

HEALTH_TIMEOUT = 5.0  # seconds for the database to answer SELECT 1
DEFAULT_LIMIT = 50  # runs per page
MAX_LIMIT = 500  # runs per page
MAX_CLOCK_MOVE = timedelta(days=36_500)  # per request: far enough, and far from overflow
SHOWN_ENGINE_COLUMNS = ("next_step", "next_args", "wake_at", "attempts", "last_error")
HIDDEN_COLUMNS = frozenset(ENGINE_COLUMNS) - set(SHOWN_ENGINE_COLUMNS)
RUN_COLUMNS = ("workflow", "run_key")  # of the attempt log: the URL already names the run
EXAMPLES_MODULE = "functions.examples"

router = APIRouter()
dev_router = APIRouter(prefix="/dev")


def create_app(
    Session: async_sessionmaker[AsyncSession],
    *,
    run_worker: bool,
    worker_options: dict[str, Any] | None = None,
    dev: bool = False,
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

    app = FastAPI(title="duly", lifespan=lifespan)
    app.state.Session = Session
    app.add_exception_handler(DulyError, _bad_request)
    app.add_exception_handler(LookupError, _not_found)
    app.include_router(router)
    if dev:
        app.include_router(dev_router)
    return app


# -- errors ---------------------------------------------------------------------------


async def _bad_request(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=400)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    # args[0], not str(): str(KeyError("x")) adds quotes around the message.
    message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else "Not found."
    return JSONResponse({"detail": message}, status_code=404)


# -- health and read-only views -------------------------------------------------------


@router.get("/healthz")
async def healthz(request: Request) -> Any:
    """{"ok": true} once the database answers; 503 when it cannot be reached."""
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT):
            async with _connection(request).engine.connect() as conn:
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
    infos = _connection(request).workflows
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
    table = info.table
    columns = [column for column in table.c if column.name not in HIDDEN_COLUMNS]
    newest_first = [column.desc() for column in table.primary_key.columns]
    query = select(*columns).order_by(*newest_first).limit(limit)
    async with _connection(request).engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return {"workflow": info.name, "runs": jsonable_encoder([dict(row) for row in rows])}


@router.get("/runs/{workflow}/{key}/history")
async def run_history(request: Request, workflow: str, key: str) -> dict[str, Any]:
    """Every attempt of one run, oldest first (404 when no AttemptLog is mapped)."""
    connection = _connection(request)
    info = _workflow(request, workflow)
    if connection.attempt_log is None:
        raise LookupError("No AttemptLog is mapped, so duly keeps no history of runs.")
    async with connection.sessionmaker() as session:
        try:
            row = await session.get(info.cls, parse_key(info, key))
        except DataError as exc:  # a well-typed key the column still refuses: out of range
            reason = str(exc.orig).splitlines()[0] if exc.orig else "refused by the database"
            raise HTTPException(
                400, f"{key!r} is not a valid key for {info.name}: {reason}."
            ) from None
    if row is None:
        raise LookupError(f"No {info.name} run has the key {key!r}.")
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


# -- dev helpers ------------------------------------------------------------------------


class ClockMove(BaseModel):
    """How far to move the database clock; every field defaults to 0."""

    model_config = ConfigDict(extra="forbid")
    days: float = Field(0.0, allow_inf_nan=False)
    hours: float = Field(0.0, allow_inf_nan=False)
    minutes: float = Field(0.0, allow_inf_nan=False)
    seconds: float = Field(0.0, allow_inf_nan=False)


class NewOnboarding(BaseModel):
    """Whom the example Onboarding run is for."""

    model_config = ConfigDict(extra="forbid")
    user_id: str = Field(min_length=1, max_length=200)
    email: str = Field(min_length=1, max_length=320)


@dev_router.post("/clock")
async def dev_move_clock(request: Request, move: ClockMove) -> dict[str, float]:
    """Move the database clock; the new shift from PostgreSQL's own time, in seconds."""
    try:
        by = timedelta(**move.model_dump())
    except OverflowError:
        by = None
    if by is None or abs(by) > MAX_CLOCK_MOVE:
        raise HTTPException(400, f"Move the clock by at most {MAX_CLOCK_MOVE.days} days at once.")
    shift = await move_clock(request.app.state.Session, by)
    return {"shift_seconds": shift.total_seconds()}


@dev_router.post("/onboarding")
async def dev_start_onboarding(request: Request, new: NewOnboarding) -> dict[str, Any]:
    """Start the example's Onboarding run; started is false when the user already has one."""
    started, key = await start_onboarding(_connection(request), new.user_id, new.email)
    return {"started": started, "id": key}


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
    for info in connection.workflows:
        if info.cls.__module__ == EXAMPLES_MODULE and info.cls.__name__ == "Onboarding":
            return info.cls
    raise LookupError(
        "The example app is not loaded: starting an Onboarding run needs "
        f"DULY_APP={EXAMPLES_MODULE}."
    )


# -- helpers -------------------------------------------------------------------------------


def _connection(request: Request) -> WorkflowConnection:
    connection: WorkflowConnection = request.app.state.connection
    return connection


def _workflow(request: Request, name: str) -> WorkflowInfo:
    for info in _connection(request).workflows:
        if info.name == name:
            return info
    raise LookupError(f"No workflow named {name!r}.")
