"""Searching runs in the console, in a real Chromium: the search box on a workflow's runs list.

- a failed run is found by its error text typed in the search box; the results page keeps
  the text in the box and passes axe-core: test_a_failed_run_is_found_by_its_error_text
- a search the console cannot read is said beside the box, which is marked invalid, and
  that page passes axe-core too: test_a_search_that_cannot_be_read_is_said_beside_the_box
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, expect
from sqlalchemy import create_engine, text

from tests.browser.conftest import LiveConsole


def failed_onboarding(console: LiveConsole, user: str, error: str) -> int:
    """An Onboarding run that failed with `error`, written straight to the table; its key."""
    engine = create_engine(console.database_url)
    try:
        with engine.begin() as conn:
            key = conn.execute(
                text(
                    "INSERT INTO onboarding (user_id, email, nudges, status, last_error) "
                    "VALUES (:user, :email, 0, 'welcoming', :error) RETURNING id"
                ),
                {"user": user, "email": f"{user}@example.com", "error": error},
            ).scalar_one()
    finally:
        engine.dispose()
    return int(key)


def test_a_failed_run_is_found_by_its_error_text(
    page: Page, console: LiveConsole, accessible: Callable[[Page], None], screenshots: Path
) -> None:
    token = uuid.uuid4().hex[:8]
    wanted = failed_onboarding(console, f"u-{token}", f"CardError: card declined ({token})")
    other = failed_onboarding(console, f"v-{token}", f"TimeoutError: the bank timed out ({token})")
    page.goto("/console/runs/onboarding")
    search = page.get_by_role("searchbox", name="Search")
    search.fill(f'state:failed error:"card declined ({token})"')
    search.press("Enter")
    runs = page.locator("table.runs tbody tr")
    expect(runs).to_have_count(1)
    expect(runs.first.get_by_role("rowheader")).to_have_text(str(wanted))
    expect(runs.first).to_contain_text(f"CardError: card declined ({token})")
    expect(page.get_by_role("link", name=str(other), exact=True)).to_have_count(0)
    expect(search).to_have_value(f'state:failed error:"card declined ({token})"')
    assert "q=state%3Afailed" in page.url
    accessible(page)
    page.screenshot(path=str(screenshots / "console-search.png"), full_page=True)
    page.get_by_role("link", name=str(wanted), exact=True).click()
    expect(page.locator("#run-state")).to_have_text("failed")


def test_a_search_that_cannot_be_read_is_said_beside_the_box(
    page: Page, accessible: Callable[[Page], None]
) -> None:
    page.goto("/console/runs/onboarding")
    search = page.get_by_role("searchbox", name="Search")
    search.fill("email=someone@example.com")
    search.press("Enter")
    expect(page.get_by_role("alert")).to_contain_text(
        "email is not an indexed column of onboarding"
    )
    expect(search).to_have_attribute("aria-invalid", "true")
    expect(search).to_have_value("email=someone@example.com")
    expect(page.locator("table.runs")).to_have_count(0)
    accessible(page)
