"""Every console page under /console, mounted by `functions.app.create_app`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from functions.console.templating import templates

console_router = APIRouter(prefix="/console", include_in_schema=False)


@console_router.get("", response_class=HTMLResponse)
async def home(request: Request) -> HTMLResponse:
    """The console's first page."""
    return templates.TemplateResponse(request, "home.html", {"title": "duly"})
