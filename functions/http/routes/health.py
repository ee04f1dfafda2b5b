"""Health and metrics: whether the database answers, and the step metrics for Prometheus."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from engine import first_line, latest_metrics
from functions.http.refusals import not_found, unavailable
from functions.http.state import connection_of
from functions.identity.access import allow
from functions.identity.principal import Role

HEALTH_TIMEOUT = 5.0  # seconds for the database to answer SELECT 1

router = APIRouter()


@router.get(
    "/healthz",
    responses=unavailable("The database is unreachable"),
    dependencies=[allow(None)],
)
async def healthz(request: Request) -> Any:
    """{"ok": true} once the database answers; 503 when it cannot be reached."""
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT):
            async with connection_of(request).engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
    except (SQLAlchemyError, OSError, TimeoutError) as exc:
        reason = first_line(exc, type(exc).__name__)
        detail = f"The database is unreachable: {reason}"
        return JSONResponse({"ok": False, "detail": detail}, status_code=503)
    return {"ok": True}


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {"description": "The metrics in Prometheus' text exposition format"},
        **not_found("metrics: prometheus-client is not installed"),
    },
    dependencies=[allow(Role.VIEWER)],
)
async def metrics() -> Response:
    """Step attempts and durations in Prometheus' text format (needs duly[metrics])."""
    found = latest_metrics()
    if found is None:
        raise HTTPException(404, "Metrics need prometheus-client: pip install 'duly[metrics]'.")
    body, content_type = found
    return Response(body, media_type=content_type)
