"""The overview, `/console`: the app's workflows by state, the last hour, the outbox.

The counts are `engine.views.overview`'s (the queries of `GET /overview` and
`duly status`), the chart is `engine.views.activity.activity` drawn as SVG. The
live part of the page is a fragment (`/console/overview/live`) the page
asks for again every 2 s while it is visible (htmx; `console.js` skips the
request while the tab is hidden), so the overview costs the database
nothing while nobody looks. In `duly dev` the page also carries the clock
control (`functions.console.clock_pages`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select

from engine import RUN_STATES, EventTables, NotFoundError, activity, clock_shift, db_now, overview
from functions.console.charts import activity_chart
from functions.console.rendering import ConsolePage, connection_of, render
from functions.identity.access import allow
from functions.identity.principal import Role
from functions.requests.lookup import event_tables, is_engine_table

router = APIRouter(route_class=ConsolePage)


async def overview_page(request: Request) -> HTMLResponse:
    """The whole overview page (at `/console` itself: `routes.py` adds it there)."""
    return render(request, "overview/page.html", await overview_context(request))


@router.get("/overview/live", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)])
async def overview_live(request: Request) -> HTMLResponse:
    """The part of the overview that updates itself."""
    return render(request, "overview/live.html", await overview_context(request))


async def overview_context(request: Request) -> dict[str, Any]:
    """Everything the overview shows, read now."""
    connection = connection_of(request)
    tables: EventTables | None
    try:
        tables = event_tables(connection.workflows)
    except NotFoundError:  # an app without an outbox
        tables = None
    found = await overview(connection, tables)
    # The engine's own tables are named under the table, not counted as workflows.
    own = sorted(info.name for info in connection.workflows if is_engine_table(info))
    recent = await activity(connection)
    now, shift = await clock_of(request)
    charts = {
        name: activity_chart(
            recent.minutes,
            recent.steps.get(name, []),
            recent.failures.get(name, []),
            label=f"{name}: steps a minute over the last hour",
            small=True,
        )
        for name in recent.steps
    }
    steps, failures = recent.total()
    per_minute = [sum(column) for column in zip(*recent.steps.values(), strict=True)] or [0] * len(
        recent.minutes
    )
    failed_per_minute = [sum(column) for column in zip(*recent.failures.values(), strict=True)] or [
        0
    ] * len(recent.minutes)
    label = (
        f"Steps a minute over the last hour, all workflows: {steps} steps, {failures} failed "
        f"attempts; the last minute {per_minute[-1] if per_minute else 0} steps."
    )
    return {
        "title": "Overview",
        "workflows": [counts for counts in found.workflows if counts.workflow not in own],
        "engine_tables": own,
        "stranded": found.stranded,
        "outbox": found.outbox,
        "states": RUN_STATES,
        "activity": recent,
        "charts": charts,
        "chart": activity_chart(recent.minutes, per_minute, failed_per_minute, label=label),
        "steps_last_hour": steps,
        "failures_last_hour": failures,
        "now": now,
        "shift": shift,
    }


async def clock_of(request: Request) -> tuple[datetime, timedelta]:
    """The database's time (the moved clock included) and how far the clock is moved."""
    async with connection_of(request).autocommit.connect() as conn:
        row = (await conn.execute(select(db_now(), clock_shift()))).one()
    now, shift = row[0], row[1]
    assert isinstance(now, datetime) and isinstance(shift, timedelta)
    return now, shift
