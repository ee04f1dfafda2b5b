"""Every GET page of the console passes axe-core: no serious or critical violation.

The pages are the app's own console routes, enumerated; `PAGES` gives each
route a URL to open (with example path parameters: a run, an event, a graph
version and an instance this test makes). A console route without an entry
fails the test, so a new page is checked from the day it is added.

- test_every_console_page_is_accessible
- test_every_console_route_has_an_entry
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from playwright.sync_api import APIRequestContext, Page, expect
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from functions.identity.access import declared_routes
from functions.local.dev import create_dev_app
from tests.browser.conftest import LiveConsole

# Each console GET route: the URL that shows it (its example values in braces), or None and
# why it is no page of its own to check.
PAGES: dict[str, str | None] = {
    "/console": "/console",
    "/console/overview/live": "/console",  # the overview's live part, checked within it
    "/console/login": "/console/login",
    "/console/login/oidc": None,  # a redirect to the issuer, with one configured
    "/console/login/callback": None,  # the issuer's redirect back: no page to read
    "/console/runs/{workflow}": "/console/runs/onboarding",
    "/console/runs/{workflow}/start": "/console/runs/onboarding/start",
    "/console/runs/{workflow}/{key}/live": "/console/runs/onboarding/{run}",  # within its page
    "/console/runs/{workflow}/{key}/{action}": "/console/runs/onboarding/{run}/run?step=check",
    "/console/runs/{workflow}/{key:path}": "/console/runs/onboarding/{run}",
    "/console/bulk/{workflow}": "/console/bulk/onboarding?state=failed",
    "/console/schedules": "/console/schedules",
    "/console/outbox": "/console/outbox",
    "/console/outbox/events/{event_id:path}": "/console/outbox/events/{event}",
    "/console/graphs": "/console/graphs",
    "/console/graphs/templates/{template_id}": "/console/graphs/templates/{template}",
    "/console/graphs/instances/{instance_id}": "/console/graphs/instances/{instance}?user=mia",
    "/console/graphs/instances/{instance_id}/live": "/console/graphs/instances/{instance}",
    "/console/graphs/designer": "/console/graphs/designer",
    "/console/graphs/designer/{template_id}": "/console/graphs/designer/{template}",
}
# Pages reached from these by a form rather than a link: the confirmation of an action.
CONFIRMED = "/console/runs/onboarding/{run}/deliver?step=activated"


def console_routes(console: LiveConsole) -> list[str]:
    """The paths of the dev app's console GET routes (the app `duly dev` serves)."""
    Session = async_sessionmaker(create_async_engine(console.database_url))
    app = create_dev_app(Session, run_worker=False)
    return sorted(
        {
            path
            for method, path, _ in declared_routes(app.routes)
            if method == "GET" and (path == "/console" or path.startswith("/console/"))
        }
    )


def examples(request: APIRequestContext) -> dict[str, str]:
    """A run, an event, the active graph version and an instance on it, made now."""
    mark = uuid.uuid4().hex[:8]
    user = {"user_id": f"axe-{mark}", "email": f"axe-{mark}@example.com"}
    run: Any = request.post("/dev/onboarding", data=user).json()
    expense = {"expense_id": int(mark, 16) % 2**31 or 1, "amount": 20}
    event: Any = request.post("/dev/expenses", data=expense).json()
    claim: Any = request.post(
        "/dev/expense-claims", data={"title": "Axe", "amount": 30, "submitted_by": "sam"}
    ).json()
    submitted: Any = request.post(
        "/graphs/instances",
        data={
            "subject_type": claim["subject_type"],
            "subject_key": claim["subject_key"],
            "workflow": claim["workflow"],
            "user": "sam",
        },
    ).json()
    versions: Any = request.get("/graphs/templates").json()["templates"]
    [active] = [v for v in versions if v["is_active"] and v["name"] == claim["workflow"]]
    return {
        "run": str(run["id"]),
        "event": str(event["event_id"]),
        "template": str(active["id"]),
        "instance": str(submitted["id"]),
    }


def test_every_console_route_has_an_entry(console: LiveConsole) -> None:
    routes = console_routes(console)
    missing = [path for path in routes if path not in PAGES]
    assert missing == [], f"console pages with no entry in PAGES (add one): {missing}"
    gone = [path for path in PAGES if path not in routes]
    assert gone == [], f"entries in PAGES for no console route: {gone}"


def test_every_console_page_is_accessible(
    page: Page, console: LiveConsole, accessible: Callable[[Page], None]
) -> None:
    found = examples(page.request)
    urls = {url.format(**found) for url in PAGES.values() if url is not None}
    checked = []
    for url in sorted(urls):
        reply = page.goto(url)
        assert reply is not None and reply.status == 200, (url, reply and reply.status)
        expect(page.locator("main h1").first).to_be_visible()
        accessible(page)
        checked.append(url)
    # The confirmation an action asks for, reached by its form.
    page.goto(CONFIRMED.format(**found))
    page.get_by_role("button", name="Deliver…").click()
    expect(page.get_by_role("heading", name="Confirm")).to_be_visible()
    accessible(page)
    assert len(checked) == len(urls)
