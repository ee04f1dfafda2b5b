"""The console's sessions and wrong credentials over real HTTP, against what the server vouches for.

- an issuer's session holds the roles today's DULY_ROLES gives the user and groups its
  token named: a group's role dropped is gone at the next request after a restart (403),
  and a user left with no role has no session; a session ends at its ID token's exp:
  test_an_issuer_session_follows_the_settings_and_its_token
- wrong bearers are counted per socket peer: X-Forwarded-For, rotated from loopback, buys
  no more guesses under `duly dev`'s server options (FORWARDED_ALLOW_IPS unset), and is
  believed only from the proxies it names: test_a_forwarded_address_buys_no_more_guesses
- the issuer callback's code and state stay out of the access log:
  test_the_callback_query_stays_out_of_the_access_log
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import httpx
import pytest

from engine.testing import move_clock
from functions import examples
from functions.app import create_app
from functions.local.server import proxy_options
from tests.conftest import Database
from tests.helpers import serving
from tests.oidc_issuer import CLIENT_ID, TOKEN_SECONDS, LocalIssuer

SECRET = "client-secret-of-the-console"


def issuer_settings(
    monkeypatch: pytest.MonkeyPatch, issuer: LocalIssuer, table: dict[str, list[str]], default: str
) -> None:
    monkeypatch.setenv("DULY_OIDC_ISSUER", issuer.issuer)
    monkeypatch.setenv("DULY_OIDC_CLIENT_ID", CLIENT_ID)
    monkeypatch.setenv("DULY_OIDC_CLIENT_SECRET", SECRET)
    monkeypatch.setenv("DULY_ROLES", json.dumps(table))
    monkeypatch.setenv("DULY_DEFAULT_ROLE", default)


async def log_in_at(client: httpx.AsyncClient, issuer: LocalIssuer) -> str:
    """Log in through the issuer's code flow; the session cookie."""
    issuer.redirect_uris.add(f"{client.base_url}/console/login/callback")
    start = await client.get("/console/login/oidc")
    at_issuer = await client.get(start.headers["location"])
    back = await client.get(at_issuer.headers["location"])
    assert back.status_code == 303, back.text
    return client.cookies["duly_session"]


async def test_an_issuer_session_follows_the_settings_and_its_token(
    db: Database, monkeypatch: pytest.MonkeyPatch, oidc_issuer: LocalIssuer
) -> None:
    oidc_issuer.client_secret = SECRET
    oidc_issuer.preset = "ada"
    Session = await db.create(examples.Base.metadata)
    issuer_settings(monkeypatch, oidc_issuer, {"group:ops": ["operator"]}, "viewer")
    async with serving(create_app(Session, run_worker=False)) as client:
        cookie = await log_in_at(client, oidc_issuer)
        assert (await client.get("/audit")).status_code == 200  # an operator's read
    [(lasts,)] = db.sql("SELECT expires_at - created_at FROM duly_console_sessions")
    assert timedelta(seconds=TOKEN_SECONDS - 5) <= lasts <= timedelta(seconds=TOKEN_SECONDS)

    issuer_settings(monkeypatch, oidc_issuer, {"group:finance": ["operator"]}, "viewer")
    async with serving(create_app(Session, run_worker=False)) as client:
        client.cookies.set("duly_session", cookie)
        dropped = await client.get("/audit")
        assert dropped.status_code == 403 and "needs the operator role" in dropped.text
        assert (await client.get("/console/outbox")).status_code == 200  # still a viewer

    issuer_settings(monkeypatch, oidc_issuer, {"group:finance": ["operator"]}, "none")
    async with serving(create_app(Session, run_worker=False)) as client:
        client.cookies.set("duly_session", cookie)
        none = await client.get("/console/outbox")
        assert none.status_code == 303 and none.headers["location"].startswith("/console/login")

    issuer_settings(monkeypatch, oidc_issuer, {"group:ops": ["operator"]}, "viewer")
    async with serving(create_app(Session, run_worker=False)) as client:
        client.cookies.set("duly_session", cookie)
        assert (await client.get("/audit")).status_code == 200
        await move_clock(Session, timedelta(seconds=TOKEN_SECONDS + 1))
        expired = await client.get("/console/outbox")
        assert expired.status_code == 303
        assert expired.headers["location"].startswith("/console/login")


async def test_a_forwarded_address_buys_no_more_guesses(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_API_TOKEN", "a-token-of-the-identity-tests")
    Session = await db.create(examples.Base.metadata)
    options = proxy_options({})
    async with serving(create_app(Session, run_worker=False), **options) as client:
        statuses = []
        for n in range(11):
            sent = {"Authorization": f"Bearer wrong-{n}", "X-Forwarded-For": f"203.0.113.{n}"}
            statuses.append((await client.get("/workflows", headers=sent)).status_code)
        assert statuses == [401] * 10 + [429]
    trusted = proxy_options({"FORWARDED_ALLOW_IPS": "10.0.0.7"})
    assert trusted == {"proxy_headers": True, "forwarded_allow_ips": "10.0.0.7"}


async def test_the_callback_query_stays_out_of_the_access_log(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    Session = await db.create(examples.Base.metadata)
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        async with serving(create_app(Session, run_worker=False)) as client:
            query = {"code": "the-one-time-code", "state": "the-state-of-it"}
            await client.get("/console/login/callback", params=query)
            await client.get("/console/login", params={"next": "/console/outbox"})
    logged = [r.getMessage() for r in caplog.records if r.name == "uvicorn.access"]
    assert any("GET /console/login/callback HTTP" in line for line in logged), logged
    assert any("/console/login?next=" in line for line in logged)  # other queries stay
    assert not any("the-one-time-code" in line or "the-state" in line for line in logged)
