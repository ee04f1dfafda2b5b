"""The console's layout at a laptop's size: nothing an operator reads is cut off at 1280x800.

- the overview's "Last hour" column (the sparkline and its counts, failures
  among them) ends inside the viewport, with no sideways scrolling, while runs
  are due and failing: test_the_overview_fits_1280_pixels (screenshot
  `overview-1280.png`)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.sync_api import Page, expect

from tests.browser.conftest import example_app

LAPTOP = {"width": 1280, "height": 800}  # pixels


def right_edge(page: Page, selector: str) -> float:
    """Where the element's box ends on the page's x axis, in CSS pixels."""
    box: Any = page.evaluate(
        "(selector) => document.querySelector(selector).getBoundingClientRect().right", selector
    )
    return float(box)


def test_the_overview_fits_1280_pixels(page: Page, screenshots: Path) -> None:
    # The widest rows an operator sees: steps and failures in the last hour, runs due later.
    example_app().unreachable_companies.add("Nowhere Ltd")
    for n in range(3):
        user = {"user_id": f"layout-{n}", "email": f"layout-{n}@example.com"}
        assert page.request.post("/dev/onboarding", data=user).ok
        row = {"key": f"layout-{n}", "customer": "layout", "company": "Nowhere Ltd"}
        started = page.request.post(
            "/workflows/lookup/start", data={"row": row, "step": "research"}
        )
        assert started.ok, started.text()
    page.set_viewport_size(LAPTOP)
    page.goto("/console")
    expect(page.locator("#overview-live td.spark-cell .warn").first).to_contain_text("failed")
    header = page.get_by_role("columnheader", name="Last hour")
    expect(header).to_be_visible()
    last_cells = "#overview-live table.counts tbody tr:first-child td:last-child"
    # Seen: inside the viewport and inside the box that would scroll the table sideways.
    visible = min(LAPTOP["width"], right_edge(page, "#overview-live .scroll"))
    for selector in ("#overview-live table.counts thead th:last-child", last_cells):
        edge = right_edge(page, selector)
        assert edge <= visible, f"{selector} ends at {edge} px, past {visible} px"
    scrolls: Any = page.evaluate(
        "() => [...document.querySelectorAll('#overview-live .scroll')]"
        ".map((box) => box.scrollWidth - box.clientWidth)"
    )
    assert all(extra <= 0 for extra in scrolls), f"the table scrolls sideways: {scrolls}"
    width: Any = page.evaluate("() => document.documentElement.scrollWidth")
    assert int(width) <= LAPTOP["width"], f"the page is {width} px wide"
    page.screenshot(path=screenshots / "overview-1280.png")
