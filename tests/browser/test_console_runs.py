"""Runs in the console, in a real Chromium: start one from a form, watch it wait, act on it.

- a run started from the generic start form reaches its `wake_in` (the
  example Onboarding sleeps three days), and once the overview's clock
  control moves the clock, its next step appears on its page without a
  reload: test_a_run_started_from_a_form_passes_its_wait_when_the_clock_moves
- a run is cancelled from its page after a confirmation:
  test_a_run_is_cancelled_after_a_confirmation
- a step's form is generated from its signature and refuses a value the
  step cannot take, at its field: test_a_step_form_refuses_a_bad_value_at_its_field
- the pages are usable by keyboard: the skip link, then the search box and the filters, reach
  the runs: test_the_runs_list_is_usable_by_keyboard

Every page these tests open passes axe-core with no serious or critical
violation. The tests share one database (the session's console): each
works on runs it started, and the clock is put back when a test moves it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.browser.conftest import LiveConsole

SETTLE = 15_000  # ms a run may take to reach a state the page shows


@pytest.fixture
def clock_put_back(console: LiveConsole, page: Page) -> Iterator[None]:
    """Put the database clock back on PostgreSQL's time after the test (others share it)."""
    yield
    page.request.post(f"{console.url}/dev/clock/reset")


def start_onboarding(page: Page, accessible: Callable[[Page], None]) -> str:
    """Start an Onboarding run from the console's start form; the run page's URL."""
    user = f"u-{uuid.uuid4().hex[:8]}"
    page.goto("/console/runs/onboarding")
    accessible(page)
    page.get_by_role("link", name="Start a run").click()
    expect(page.get_by_role("heading", name="Start a run of onboarding")).to_be_visible()
    accessible(page)
    page.get_by_label("user_id").fill(user)
    page.get_by_label("email").fill(f"{user}@example.com")
    page.get_by_role("button", name="Start the run with welcome").click()
    expect(page.get_by_role("status")).to_contain_text("Started")
    return page.url.split("?")[0]


def test_a_run_started_from_a_form_passes_its_wait_when_the_clock_moves(
    page: Page,
    context: BrowserContext,
    accessible: Callable[[Page], None],
    screenshots: Path,
    clock_put_back: None,
) -> None:
    start_onboarding(page, accessible)
    # welcome runs, and the run sleeps: check is due in three days.
    attempts = page.locator("table.attempts")
    expect(attempts).to_contain_text("welcome", timeout=SETTLE)
    expect(page.locator("#run-next-step")).to_have_text("check")
    expect(page.locator("#run-due")).to_contain_text("in 2 days")  # 2 days 23 hours and more
    expect(page.locator("#run-state")).to_have_text("scheduled")
    accessible(page)
    page.evaluate("window.notReloaded = true")

    overview = context.new_page()
    overview.goto("/console")
    expect(overview.get_by_role("heading", name="Database clock")).to_be_visible()
    accessible(overview)
    overview.get_by_label("By").fill("3")
    overview.get_by_label("Unit").select_option("days")
    overview.get_by_role("button", name="Move the clock forward").click()
    expect(overview.locator("#clock")).to_contain_text("+3 days")
    # The overview redraws itself at once (the move tells it to), on the moved clock.
    expect(overview.locator("#overview-live")).to_contain_text("moved +3 days")
    overview.screenshot(path=screenshots / "overview.png", full_page=True)

    # The run's page redraws itself: check has run, and the run sleeps again (four days).
    expect(attempts.locator("tbody tr")).to_have_count(2, timeout=SETTLE)
    expect(attempts.locator("tbody tr").nth(1)).to_contain_text("check")
    expect(page.locator("#run-due")).to_contain_text("in 3 days")
    assert page.evaluate("window.notReloaded") is True, "the page was reloaded"
    page.screenshot(path=screenshots / "run-timeline.png", full_page=True)
    accessible(page)


def test_a_run_is_cancelled_after_a_confirmation(
    page: Page, accessible: Callable[[Page], None]
) -> None:
    run_url = start_onboarding(page, accessible)
    expect(page.locator("#run-next-step")).to_have_text("check", timeout=SETTLE)
    page.get_by_role("button", name="Cancel this run…").click()
    expect(page.get_by_role("heading", name="Confirm")).to_be_visible()
    expect(page.locator("#confirm-question")).to_contain_text("Cancel onboarding")
    accessible(page)
    page.get_by_role("button", name="Yes, cancel it").click()
    expect(page.get_by_role("status")).to_contain_text("Cancelled: 1 run(s)")
    assert page.url.split("?")[0] == run_url
    expect(page.locator("#run-state")).to_have_text("cancelled")
    expect(page.get_by_role("button", name="Cancel this run…")).to_have_count(0)


def test_a_step_form_refuses_a_bad_value_at_its_field(
    page: Page, accessible: Callable[[Page], None]
) -> None:
    start_onboarding(page, accessible)
    page.get_by_label("Run a step now").select_option("activated")
    page.get_by_role("button", name="Choose…").first.click()
    expect(page.get_by_role("heading", name="Run a step now")).to_be_visible()
    accessible(page)
    plan = page.get_by_label("plan")
    expect(plan).to_be_visible()
    assert plan.evaluate("element => element.tagName") == "SELECT"  # a Literal: a choice
    plan.select_option("pro")
    page.get_by_role("button", name="Run it now…").click()
    expect(page.get_by_role("button", name="Yes, run it now")).to_be_focused()
    page.get_by_role("link", name="No, go back").click()
    expect(page.locator("#run-next-step")).to_have_text("check", timeout=SETTLE)

    # A bad number where the row's id is a whole number: refused at that field.
    page.goto("/console/runs/onboarding/start")
    page.get_by_label("id", exact=True).fill("twelve")
    page.get_by_label("user_id").fill("u-twelve")
    page.get_by_label("email").fill("twelve@example.com")
    page.get_by_role("button", name="Start the run with welcome").click()
    expect(page.locator("#field-row-id-error")).to_contain_text("valid integer")
    expect(page.get_by_label("id", exact=True)).to_have_attribute("aria-invalid", "true")
    accessible(page)


def test_the_runs_list_is_usable_by_keyboard(
    page: Page, accessible: Callable[[Page], None]
) -> None:
    page.goto("/console/runs/onboarding")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    # From the main content, Tab reaches the way back, the start link, then the filters.
    page.keyboard.press("Tab")
    expect(page.locator("main .crumbs a")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Start a run")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_role("searchbox", name="Search")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_label("State")).to_be_focused()
    page.get_by_label("State").select_option("cancelled")
    for _ in ("step", "key", "error", "order", "the button"):
        page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Show")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"state=cancelled"))
    expect(page.get_by_label("State")).to_have_value("cancelled")
    accessible(page)
