"""`GET /audit`: the newest actions people took, who and through which door (operator)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from engine import MAX_ACTIONS_READ, recent_actions
from functions.http.state import connection_of
from functions.identity.access import allow
from functions.identity.principal import Role

DEFAULT_READ = 50  # records a read answers by default

router = APIRouter()


# Operators: the trail names people (their principals' ids), which a viewer's
# dashboard has no need to read.
@router.get("/audit", dependencies=[allow(Role.OPERATOR)])
async def audit_trail(
    request: Request,
    workflow: Annotated[str | None, Query(max_length=200)] = None,
    before: Annotated[int | None, Query(ge=1)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_ACTIONS_READ)] = DEFAULT_READ,
) -> dict[str, Any]:
    """The newest records first (of one workflow, before the record `before`)."""
    async with connection_of(request).sessionmaker() as session:
        entries = await recent_actions(session, workflow=workflow, before=before, limit=limit)
    shown = [entry.to_dict() for entry in entries]
    more = len(entries) == limit and bool(entries)
    return {"actions": shown, "before": entries[-1].id if more else None}
