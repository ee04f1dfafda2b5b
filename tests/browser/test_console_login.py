"""Logging in to the console in a real Chromium, at a local OpenID Connect issuer.

A console of its own (an issuer, a client id and a named key configured),
beside the session's open one: the login page's button goes to the issuer's
page, its user's button comes back to the console, whose header then shows
the user; logging out ends the session, and the old cookie, put back into the
browser, gets the login page: test_a_person_logs_in_at_the_issuer_and_out.
The login page passes axe-core.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from functions.identity.keys import digest_of, new_key
from infra.testing.pytest_plugin import Server
from tests.browser.conftest import LiveConsole
from tests.helpers import examples_configured
from tests.oidc_issuer import CLIENT_ID, LocalIssuer

SETTLE = 15_000  # ms a page may take to answer


@pytest.fixture(scope="module")
def issuer() -> Iterator[LocalIssuer]:
    found = LocalIssuer(users={"ada": {"name": "Ada Lovelace", "groups": ["ops"]}}).start()
    try:
        yield found
    finally:
        found.stop()


@pytest.fixture(scope="module")
def login_console(server: Server, issuer: LocalIssuer) -> Iterator[LiveConsole]:
    """The dev app with the issuer, its client and one named key configured."""
    environ = {
        "DULY_OIDC_ISSUER": issuer.issuer,
        "DULY_OIDC_CLIENT_ID": CLIENT_ID,
        "DULY_ROLES": json.dumps({"group:ops": ["operator"]}),
        "DULY_API_KEYS": json.dumps(
            [{"name": "bot", "roles": ["viewer"], "sha256": digest_of(new_key())}]
        ),
    }
    with examples_configured():
        live = LiveConsole(server)
        try:
            with pytest.MonkeyPatch.context() as patch:
                for name, value in environ.items():
                    patch.setenv(name, value)
                live.start()  # the app reads its settings once, as it is made
            issuer.redirect_uris.add(f"{live.url}/console/login/callback")
            yield live
        finally:
            live.stop()


def test_a_person_logs_in_at_the_issuer_and_out(
    login_console: LiveConsole,
    issuer: LocalIssuer,
    page: Page,
    context: BrowserContext,
    accessible: Callable[[Page], None],
) -> None:
    console = login_console.url
    page.goto(f"{console}/console/outbox")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    assert urlsplit(page.url).path == "/console/login"
    accessible(page)
    issuer_name = urlsplit(issuer.url).netloc
    page.get_by_role("link", name=f"Log in with {issuer_name}").click()
    expect(page.get_by_role("heading", name="Local issuer")).to_be_visible(timeout=SETTLE)
    page.get_by_role("button", name="Sign in as ada").click()

    expect(page.locator("#signed-in-as")).to_have_text("Ada Lovelace", timeout=SETTLE)
    assert urlsplit(page.url).path == "/console/outbox"  # back where the login began
    [session] = [c for c in context.cookies() if c["name"] == "duly_session"]
    assert session["httpOnly"] and session["sameSite"] == "Lax"

    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Log in")).to_be_visible(timeout=SETTLE)
    assert not [c for c in context.cookies() if c["name"] == "duly_session"]
    context.add_cookies([session])  # the old cookie, kept by someone: it opens nothing
    page.goto(f"{console}/console")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    assert re.search(r"/console/login\?next=", page.url)
    expect(page.locator("#signed-in-as")).to_have_count(0)
