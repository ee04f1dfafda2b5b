"""Bulk actions in the console, in a real Chromium: retry every failed run a filter matches.

- from the runs page's filter, the bulk form counts the failed runs (a dry run that
  changes nothing), asks to confirm that count, then applies and shows its progress to
  the end; the runs leave the failed state: test_failed_runs_are_retried_after_a_dry_run
- the form, the confirmation and the progress page pass axe-core (no serious or critical
  violation), checked as the test opens them.

The runs are written failed straight into the shared database, each test with an
error text of its own, so no other test's runs match its filter.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import psycopg
import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import LiveConsole

RUNS = 3  # failed runs the test retries


def libpq_url(console: LiveConsole) -> str:
    return console.database_url.replace("postgresql+psycopg://", "postgresql://", 1)


def still_failed(console: LiveConsole, mark: str) -> int:
    """How many of the test's runs are failed still, nothing scheduled."""
    with psycopg.connect(libpq_url(console), autocommit=True) as conn:
        query = "SELECT count(*) FROM onboarding WHERE last_error LIKE %s AND next_step IS NULL"
        row = conn.execute(query, (f"%{mark}%",)).fetchone()
    assert row is not None
    return int(row[0])


def add_failed_runs(console: LiveConsole, mark: str) -> None:
    """RUNS onboarding runs that gave up with an error naming `mark`."""
    with psycopg.connect(libpq_url(console), autocommit=True) as conn:
        for n in range(RUNS):
            conn.execute(
                "INSERT INTO onboarding (user_id, email, nudges, status, attempts, wf_version,"
                " last_error) VALUES (%s, %s, 0, 'failed', 0, 0, %s)",
                (f"{mark}-{n}", f"{mark}-{n}@example.com", f"ConnectionError: {mark} down"),
            )


def test_failed_runs_are_retried_after_a_dry_run(
    page: Page,
    console: LiveConsole,
    accessible: Callable[[Page], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A batch a run, a batch a request: the progress page posts on (htmx) twice by itself.
    monkeypatch.setattr("engine.bulk.runs.BATCH_SIZE", 1)
    monkeypatch.setattr("functions.requests.bulk.BUDGET", 0.0)
    mark = f"bulk-{uuid.uuid4().hex[:10]}"
    add_failed_runs(console, mark)
    page.goto(f"/console/runs/onboarding?state=failed&error={mark}")
    expect(page.locator("table.runs tbody tr")).to_have_count(RUNS)
    page.get_by_role("link", name="Act on the runs that match").click()
    expect(page.get_by_role("heading", name="Act on many onboarding runs")).to_be_visible()
    expect(page.get_by_label("State")).to_have_value("failed")
    expect(page.get_by_label("Last error contains")).to_have_value(mark)
    expect(page.get_by_label("Action")).to_have_value("retry")
    accessible(page)
    page.get_by_label("Step to run").select_option("activated")
    page.get_by_label("Its arguments (JSON)").fill('{"plan": "pro"}')
    page.get_by_role("button", name="Count them first").click()

    question = page.locator("#confirm-question")
    expect(question).to_contain_text(f"{RUNS} onboarding run(s) match: run activated again")
    accessible(page)
    assert still_failed(console, mark) == RUNS, "the dry run wrote nothing"
    page.get_by_role("button", name=f"Yes, apply to {RUNS} run(s)").click()

    status = page.locator("#bulk-status")
    expect(status).to_contain_text(f"{RUNS} of {RUNS} done, 0 skipped")
    expect(status).to_contain_text("finished")
    expect(page.locator("#bulk-bar")).to_have_attribute("value", str(RUNS))
    expect(page.get_by_text(f"Batches committed: {RUNS}")).to_be_visible()
    accessible(page)
    page.get_by_role("link", name="Back to the runs").click()
    expect(page.get_by_text("No run matches.")).to_be_visible()
    assert still_failed(console, mark) == 0
