"""The outbox in the console, in a real Chromium: a dead letter, its error, its replay.

- an event whose handler's validator refuses it is dead-lettered; the
  outbox page lists it, its page shows the route's error, and replaying it
  (after a confirmation) routes it again, now accepted, to processed:
  test_a_dead_letter_is_replayed_from_its_page
- the login form and a refused page are accessible too (the outbox's and
  every other page's check is in the tests that open them):
  test_the_login_and_error_pages_are_accessible

The handler is registered by this module on the registry the live console's
application routes with (the examples' `DatabaseEventRegistry`), for an event type of
its own, so no other test's events reach it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from playwright.sync_api import Page, expect

from engine import WorkflowEvent
from tests.browser.conftest import LiveConsole

EVENT_TYPE = "console.test.flaky"
SETTLE = 15.0  # seconds an event may take to be routed
accepted_payloads: set[str] = set()  # payload marks the validator lets through
handled: list[str] = []  # event ids the handler ran for


def accepts(event: WorkflowEvent) -> bool:
    """Refuses an event until its mark is accepted: the first drain dead-letters it."""
    return event.payload.get("mark") in accepted_payloads


async def handle(event: WorkflowEvent) -> None:
    handled.append(event.event_id)


def status_after_reloads(page: Page, wanted: str) -> None:
    """Reload the event's page until its status is `wanted` (its page does not poll)."""
    deadline = time.monotonic() + SETTLE
    status = page.locator("#event-status")
    while status.inner_text().strip() != wanted:
        assert time.monotonic() < deadline, f"the event stayed {status.inner_text()!r}"
        page.wait_for_timeout(200)
        page.reload()


def test_a_dead_letter_is_replayed_from_its_page(
    page: Page, console: LiveConsole, accessible: Callable[[Page], None]
) -> None:
    console.application.event_registry.register(EVENT_TYPE, handle, validator=accepts)
    mark = uuid.uuid4().hex
    event_id = f"console-{mark[:12]}"
    published = page.request.post(
        f"{console.url}/events",
        data={"event_type": EVENT_TYPE, "event_id": event_id, "payload": {"mark": mark}},
    )
    assert published.ok, published.text()

    page.goto(f"/console/outbox/events/{event_id}")
    status_after_reloads(page, "dead_letter")
    page.goto("/console/outbox?status=dead_letter")
    expect(page.get_by_role("heading", name="Outbox", exact=True)).to_be_visible()
    accessible(page)
    page.get_by_role("link", name=event_id).click()
    expect(page.get_by_role("heading", name=f"Event {event_id}")).to_be_visible()
    routes = page.get_by_role("table")
    expect(routes).to_contain_text("dead_letter")
    expect(routes).to_contain_text("handle")
    accessible(page)

    accepted_payloads.add(mark)
    page.get_by_role("button", name="Replay this event…").click()
    expect(page.locator("#confirm-question")).to_contain_text(event_id)
    accessible(page)
    page.get_by_role("button", name="Yes, replay").click()
    expect(page.get_by_role("status")).to_contain_text("Replayed 1 event(s)")
    status_after_reloads(page, "processed")
    assert event_id in handled
    expect(page.get_by_role("button", name="Replay this event…")).to_have_count(0)


def test_the_login_and_error_pages_are_accessible(
    page: Page, accessible: Callable[[Page], None]
) -> None:
    page.goto("/console/login")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    accessible(page)
    reply = page.goto("/console/runs/onboarding/not-a-number")
    assert reply is not None and reply.status == 422
    expect(page.get_by_role("alert")).to_contain_text("expected int")
    accessible(page)
    reply = page.goto("/console/runs/no_such_workflow")
    assert reply is not None and reply.status == 404
    expect(page.get_by_role("alert")).to_contain_text("No workflow named")
