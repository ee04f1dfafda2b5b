"""Every console page under /console, mounted by `functions.app.create_app`.

One router gathers the page modules' routers, behind one dependency: with
any credential configured, every page needs a session (`auth.require_reader`;
the login pages excepted). `duly dev` adds the clock control beside it
(`functions.local.dev`).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse

from functions.console import (
    auth,
    bulk_pages,
    graph_designer,
    graph_instance_pages,
    graph_pages,
    login,
    outbox_pages,
    overview_pages,
    run_pages,
    schedule_pages,
)
from functions.console.rendering import ConsolePage
from functions.identity.access import allow
from functions.identity.principal import Role

console_router = APIRouter(
    prefix="/console", include_in_schema=False, dependencies=[Depends(auth.require_reader)]
)
# The overview is /console itself: a path no sub-router can be included at.
console_router.add_api_route(
    "",
    overview_pages.overview_page,
    response_class=HTMLResponse,
    route_class_override=ConsolePage,
    dependencies=[allow(Role.VIEWER)],
)
console_router.include_router(login.router)
console_router.include_router(overview_pages.router)
console_router.include_router(run_pages.router)
console_router.include_router(bulk_pages.router)
console_router.include_router(outbox_pages.router)
console_router.include_router(schedule_pages.router)
console_router.include_router(graph_pages.router)
console_router.include_router(graph_instance_pages.router)
console_router.include_router(graph_designer.router)
