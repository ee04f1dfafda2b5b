"""A failed run in the console, in a real Chromium: its traceback, its arguments, its page live.

- a failed attempt opens onto its arguments and its traceback, escaped, and
  "Run a step now" preselects the step that failed, not the workflow's first:
  test_a_failed_run_shows_its_traceback_and_arguments
- once a step is run through the API, the page shows the run moving on without a
  reload, and neither the form being filled nor the opened attempt is reset (same test)

Every page passes axe-core with no serious or critical violation, a failure shown.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
from playwright.sync_api import Page, expect
from sqlalchemy.engine import make_url

from tests.browser.conftest import LiveConsole

SETTLE = 20_000  # ms a run may take to reach a state the page shows (it polls every 5 s at rest)
# Stored arguments the step `activated(self, plan)` cannot take: one failed attempt at once.
MISFIT_ARGS = '{"args": ["pro", "<b>extra</b>"], "kwargs": {}}'
ISO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")  # a <time datetime> value


def fail_onboarding(page: Page, console: LiveConsole) -> str:
    """An Onboarding run whose welcome succeeded and whose `activated` then failed; its key."""
    user = f"u-{uuid.uuid4().hex[:8]}"
    started = page.request.post(
        "/workflows/onboarding/start",
        data={"row": {"user_id": user, "email": f"{user}@example.com"}, "step": "welcome"},
    )
    assert started.status == 201, started.text()
    key = str(started.json()["key"])
    page.goto(f"/console/runs/onboarding/{key}")
    expect(page.locator("#run-next-step")).to_have_text("check", timeout=SETTLE)
    # Arguments stored for an older signature, as a deploy can leave them, due now.
    conninfo = make_url(console.database_url).set(drivername="postgresql")
    with psycopg.connect(conninfo.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute(
            "UPDATE onboarding SET next_step = 'activated', next_args = %s::jsonb, "
            "wake_at = now() - interval '1 second' WHERE id = %s",
            (MISFIT_ARGS, int(key)),
        )
    return key


def test_a_failed_run_shows_its_traceback_and_arguments(
    page: Page, console: LiveConsole, accessible: Callable[[Page], None], screenshots: Path
) -> None:
    key = fail_onboarding(page, console)
    page.evaluate("window.notReloaded = true")
    # The page shows the failure by itself: it polls while one watches.
    expect(page.locator("#run-state")).to_have_text("failed", timeout=SETTLE)
    assert page.evaluate("window.notReloaded") is True, "the page was reloaded"
    page.reload()  # a fresh page, so the actions' forms are drawn for a failed run
    rows = page.locator("table.attempts tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(1)).to_contain_text("activated")
    expect(rows.nth(1).locator("time")).to_have_attribute("datetime", ISO_TIME)
    expect(rows.nth(1).locator("time")).to_contain_text(" UTC")  # the date and the time

    failure = rows.nth(1).locator("details.failure")
    expect(page.locator("details.failure")).to_have_count(1)  # welcome succeeded: none
    failure.locator("summary").click()
    arguments = failure.locator("pre.attempt-args")
    expect(arguments).to_contain_text('"<b>extra</b>"')  # shown as text, never as markup
    expect(arguments).to_contain_text('"pro"')
    assert arguments.locator("b").count() == 0
    trace = failure.locator("pre.attempt-traceback")
    expect(trace).to_contain_text("Traceback (most recent call last):")
    expect(trace).to_contain_text("TypeError")
    expect(trace).to_contain_text("Stored arguments for Onboarding.activated no longer fit")

    # Run a step now: the step that failed is chosen already.
    chooser = page.get_by_label("Run a step now")
    expect(chooser).to_have_value("activated")
    accessible(page)
    page.screenshot(path=screenshots / "run-failure.png", full_page=True)

    # The operator starts to fill a form; meanwhile the run moves (a step run through the API).
    chooser.select_option("welcome")
    page.evaluate("window.notReloaded = true")
    moved = page.request.post("/workflows/onboarding/run", data={"key": key, "step": "check"})
    assert moved.ok and moved.json()["addressed"] == 1, moved.text()
    expect(page.locator("#run-state")).to_have_text("scheduled", timeout=SETTLE)
    expect(rows).to_have_count(3)
    expect(rows.nth(2)).to_contain_text("check")
    assert page.evaluate("window.notReloaded") is True, "the page was reloaded"
    expect(chooser).to_have_value("welcome")  # the form as the operator left it
    expect(rows.nth(1).locator("details.failure")).to_have_attribute("open", "")
    accessible(page)
