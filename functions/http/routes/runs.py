"""Reading runs: the workflows served, the operator's overview, pages of runs, one run.

Every read goes through `engine.views.runs` and `engine.views.run` (the console's and the CLI's
queries too), so all of them show the same runs in the same order. The older paths
`/runs/{name}` and `/runs/{name}/{key}/history` are the same two handlers, answering the same.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.encoders import jsonable_encoder

from engine import (
    MAX_FILTER_TEXT,
    EventTables,
    NotFoundError,
    RunFilter,
    WaitTimeoutError,
    list_runs,
    overview as operator_overview,
    parse_filter,
    run_detail,
    wait_for_end,
)
from functions.http.refusals import not_found
from functions.http.segments import RawPathRoute
from functions.http.state import connection_of
from functions.requests.lookup import MAX_TEXT, event_tables, find_workflow, is_engine_table
from functions.requests.runs import url_key

if TYPE_CHECKING:
    from engine import WorkflowInfo
from functions.identity.access import allow
from functions.identity.principal import Role

DEFAULT_LIMIT = 50  # runs per page
MAX_LIMIT = 500  # runs per page
MAX_OFFSET = 10**9  # runs a page may skip
MAX_WAIT = 30.0  # seconds a read may wait for its run to end
RunState = Literal["running", "waiting", "scheduled", "retrying", "finished", "failed", "cancelled"]
RunOrder = Literal["newest", "soonest"]

router = APIRouter(route_class=RawPathRoute)  # a run key may hold `/`


@router.get("/workflows", dependencies=[allow(Role.VIEWER)])
async def list_workflows(request: Request) -> dict[str, Any]:
    """The workflow tables this app serves: their steps, the lanes they need, their limit,
    and whether they are the engine's own (the outbox, graph deadlines), not callers' runs."""
    infos = connection_of(request).workflows
    return {"workflows": [_describe(info) for info in infos]}


@router.get("/overview", dependencies=[allow(Role.VIEWER)])
async def overview(request: Request) -> dict[str, Any]:
    """Every workflow table's runs by state, due now, stranded and the next due instant;
    the outbox's summary when the app maps one. Counted when asked (whole tables)."""
    connection = connection_of(request)
    try:
        tables: EventTables | None = event_tables(connection.workflows)
    except NotFoundError:  # an app without an outbox
        tables = None
    return (await operator_overview(connection, tables)).to_dict()


def _describe(info: WorkflowInfo) -> dict[str, Any]:
    limit = info.limit
    return {
        "name": info.name,
        "engine_owned": is_engine_table(info),
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


@router.get(
    "/workflows/{name}/runs",
    responses=not_found("workflow, or no run for the cursor `after`"),
    dependencies=[allow(Role.VIEWER)],
)
@router.get(
    "/runs/{name}",
    responses=not_found("workflow, or no run for the cursor `after`"),
    dependencies=[allow(Role.VIEWER)],
    deprecated=True,
    summary="List Workflow Runs (an older path of GET /workflows/{name}/runs)",
)
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
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    q: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=MAX_FILTER_TEXT,
            description='A filter: `state:failed error:"card declined" amount>=100 since:1h`.',
        ),
    ] = None,
) -> dict[str, Any]:
    """Runs with their state, filtered; newest (highest key) or soonest due first, paged.

    `q` is a filter in duly's filter language (`state:failed error:"card declined"
    amount>=100 since:1h`), ANDed with the single parameters; a newest page with a
    condition on an own column goes by that column, highest first, then by key.

    `next_after` is the cursor of the next page (pass it as `after`), and
    `next_offset` the offset of the next page; each is null on the last. A
    page (unless by offset) reads at most 5,000 runs of the table: `searching`
    says it stopped there with fewer runs than asked, and `next_after` goes on.
    """
    connection = connection_of(request)
    info = find_workflow(connection, name)
    filters = RunFilter(state=state, step=next_step, key=key, error=error)
    if q is not None:
        filters = parse_filter(info, q).also(filters)
    page = await list_runs(
        connection, info, filters, order=order, limit=limit, after=after, offset=offset
    )
    return {
        "workflow": info.name,
        "runs": jsonable_encoder([run.to_dict() for run in page.runs]),
        "next_after": page.next_after,
        "next_offset": page.next_offset,
        "searching": page.searching,
    }


@router.get(
    "/workflows/{name}/runs/{key}",
    responses=not_found("workflow or run"),
    dependencies=[allow(Role.VIEWER)],
)
@router.get(
    "/runs/{name}/{key}/history",
    responses=not_found("workflow or run"),
    dependencies=[allow(Role.VIEWER)],
    deprecated=True,
    summary="Workflow Run (an older path of GET /workflows/{name}/runs/{key})",
)
async def workflow_run(
    request: Request,
    name: str,
    key: str,
    wait: Annotated[
        float | None,
        Query(
            ge=0,
            le=MAX_WAIT,
            allow_inf_nan=False,
            description=f"Seconds to wait, at most {MAX_WAIT:g}, for the run to end "
            "(finished, failed, cancelled): answered as soon as it has, or at the bound "
            "with the run as it stands.",
        ),
    ] = None,
) -> dict[str, Any]:
    """One run: its row, its state, what it waits for, and its history when a log is mapped.

    With `wait`, a long poll: the answer comes once the run has ended, woken by
    the database's notification, or when the wait is up.
    """
    connection = connection_of(request)
    info = find_workflow(connection, name)
    run_key = url_key(info, key, ("path", "key"))
    if wait:
        with contextlib.suppress(WaitTimeoutError):
            await wait_for_end(info, run_key.where(info), wait)
    detail = await run_detail(connection, info, run_key)
    found: dict[str, Any] = jsonable_encoder(detail.to_dict())
    return found
