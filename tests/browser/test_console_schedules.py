"""Schedules and refused deliveries in the console, in a real Chromium.

- a Digest run (09:00 on weekdays in Los Angeles) is listed on the schedules
  page once it has fired; it is paused and resumed there, each after a
  confirmation: test_a_schedule_is_paused_and_resumed_from_its_page
- an event for another step than the one a run waits for is refused, and
  the run's page says why: test_a_refused_delivery_says_why

Every page these tests open passes axe-core with no serious or critical violation.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from playwright.sync_api import Page, expect

from tests.browser.conftest import LiveConsole

SETTLE = 15.0  # seconds a run may take to reach the state a test waits for


def started(page: Page, console: LiveConsole, workflow: str, body: dict[str, object]) -> str:
    """Start a run through the API; its key."""
    reply = page.request.post(f"{console.url}/workflows/{workflow}/start", data=body)
    assert reply.status == 201, reply.text()
    key: str = reply.json()["key"]
    return key


def reload_until(page: Page, shown: Callable[[], bool], what: str) -> None:
    """Reload the page until `shown` (these pages do not poll)."""
    deadline = time.monotonic() + SETTLE
    while not shown():
        assert time.monotonic() < deadline, f"{what} did not appear"
        page.wait_for_timeout(200)
        page.reload()


def test_a_schedule_is_paused_and_resumed_from_its_page(
    page: Page, console: LiveConsole, accessible: Callable[[Page], None]
) -> None:
    name = f"digest-{uuid.uuid4().hex[:8]}"
    key = started(page, console, "digest", {"row": {"name": name}, "step": "send"})
    page.goto("/console")
    page.get_by_role("navigation", name="Console").get_by_role("link", name="Schedules").click()
    expect(page.get_by_role("heading", name="Schedules", level=1)).to_be_visible()
    row = page.locator(f"#schedule-digest-{key}")
    reload_until(page, lambda: row.count() == 1, f"digest {key}'s schedule")
    expect(row).to_contain_text("0 9 * * MON-FRI")
    expect(row).to_contain_text("America/Los_Angeles")
    expect(row.locator(".state")).to_have_text("scheduled")
    accessible(page)

    row.get_by_role("button", name=f"Pause: digest {key}").click()
    expect(page.get_by_text(f"Pause digest run {key}?")).to_be_visible()
    accessible(page)
    page.get_by_role("button", name="Yes, pause it").click()
    expect(page.get_by_role("status")).to_have_text("Paused: nothing fires until it is resumed.")
    expect(row.locator(".state")).to_have_text("paused")
    expect(row.locator("td").nth(3)).to_have_text("—")  # no next firing while paused
    accessible(page)

    row.get_by_role("button", name=f"Resume: digest {key}").click()
    accessible(page)
    page.get_by_role("button", name="Yes, resume it").click()
    expect(page.get_by_role("status")).to_contain_text("Resumed")
    expect(row.locator(".state")).to_have_text("scheduled")
    expect(row.locator("td").nth(3).locator("time")).to_have_count(1)


def test_a_refused_delivery_says_why(
    page: Page, console: LiveConsole, accessible: Callable[[Page], None]
) -> None:
    key = started(page, console, "expense", {"row": {"amount": 12}, "step": "request_approval"})
    page.goto(f"/console/runs/expense/{key}")
    reload_until(page, lambda: page.locator(".state-waiting").count() > 0, "the wait")
    page.goto(f"/console/runs/expense/{key}/deliver?step=escalate")
    accessible(page)
    page.get_by_role("button", name="Deliver…").click()
    accessible(page)
    page.get_by_role("button", name="Yes, deliver it").click()
    expect(page.get_by_role("status")).to_have_text(
        "Not delivered: the run waits for another step's event."
    )
    accessible(page)
