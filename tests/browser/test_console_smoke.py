"""The console's first page opens in a real Chromium, with its stylesheet and no CDN."""

from __future__ import annotations

from playwright.sync_api import Page, expect


def test_the_console_opens_offline(page: Page) -> None:
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto("/console")
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    outside = [url for url in requested if not url.startswith(page.url.split("/console")[0])]
    assert outside == [], f"the console loads nothing from outside: {outside}"
