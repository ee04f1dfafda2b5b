"""Bulk actions over HTTP: `POST /workflows/{name}/bulk`, `POST /outbox/dead-letters/bulk`.

A body without `expected` is a dry run; with the dry run's `expected` and `upto` it
applies for a few seconds (a Lambda's request must end) and answers its progress and
`next`, which the same body sends back to go on. 409 when the filter now matches more
than was confirmed, or `next` is not the caller's newest for this body (forged, altered,
replayed, another principal's); 400 when `next` is not a continuation at all.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder

from functions.http.refusals import conflict, not_found
from functions.http.state import call_state, connection_of
from functions.identity.access import allow
from functions.identity.actors import actor_of
from functions.identity.principal import Role
from functions.requests import bulk
from functions.requests.bulk import BulkReplayRequest, BulkRunsRequest
from functions.requests.lookup import event_tables, find_writable

LAMBDA_MARGIN = 2.0  # seconds of a Lambda invocation kept for the answer after the batches
CHANGED = conflict(
    "The filter matches more than the dry run counted, or `next` is not the newest this body's "
    "bulk action gave the caller (forged, altered, replayed, or another principal's)"
)

router = APIRouter()


def budget_of(request: Request) -> float:
    """Seconds of batches for this request: BUDGET, less on a Lambda near its deadline."""
    context = request.scope.get("aws.context")
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return bulk.BUDGET
    return max(0.0, min(bulk.BUDGET, remaining() / 1000 - LAMBDA_MARGIN))


@router.post(
    "/workflows/{name}/bulk",
    responses={**not_found("workflow or step"), **CHANGED},
    dependencies=[allow(Role.OPERATOR)],
)
async def bulk_on_workflow(request: Request, name: str, body: BulkRunsRequest) -> dict[str, Any]:
    """Dry-run, or apply, an action on every run the filter matches."""
    connection = connection_of(request)
    info = find_writable(connection, name)
    answer = await bulk.bulk_runs(
        connection, info, body, actor_of(request), budget=budget_of(request)
    )
    if answer.get("done"):
        await call_state(request, "kick")  # on Lambda nothing else runs the steps now due
    return jsonable_encoder(answer)


@router.post(
    "/outbox/dead-letters/bulk",
    responses={**not_found("outbox table in this database"), **CHANGED},
    dependencies=[allow(Role.OPERATOR)],
)
async def bulk_replay(request: Request, body: BulkReplayRequest) -> dict[str, Any]:
    """Dry-run, or apply, the replay of every dead letter the filter matches."""
    connection = connection_of(request)
    tables = event_tables(connection.workflows)
    answer = await bulk.bulk_replay(
        connection, tables, body, actor_of(request), budget=budget_of(request)
    )
    if answer.get("done"):
        await call_state(request, "kick")
    return jsonable_encoder(answer)
