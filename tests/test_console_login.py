"""Logging in to the console over real HTTP: a typed key or token, the issuer's code flow, logout.

- a named API key typed into the login form starts a session: a row of
  duly_console_sessions holding the cookie's SHA-256 (never the cookie), the
  key's name, roles and way in; logging in again ends the session before; the
  header shows who is logged in; the session's principal is held to its roles:
  test_an_api_key_logs_in
- a session lasts only while what was typed is configured: a key's roles are read as they
  are now, and a removed or rotated key, or a changed token, ends its sessions:
  test_a_session_ends_with_its_credential
- logout ends the session on the server: the old cookie gets the login page,
  and its CSRF token writes nothing: test_logout_ends_the_session_on_the_server
- ten wrong logins from one client are refused one by one, the eleventh is a
  429 with Retry-After, and then even the right key waits:
  test_wrong_logins_are_slowed_per_client
- the issuer's way: login -> the issuer's /authorize (PKCE S256, state,
  nonce) -> the callback -> a session of the user the ID token names, with
  the groups' roles: test_the_issuer_logs_a_person_in
- a callback with another state, without the flow's cookie, or with a code
  used already starts no session: test_a_bad_callback_starts_no_session
- expired sessions are no good, and `find_session` reads the database clock:
  test_an_expired_session_is_no_good
- with a credential but no way to log in (a metrics token alone) the console is
  closed: its pages go to a login page that says so, its writes are refused:
  test_with_no_way_to_log_in_the_console_is_closed
- `duly prune` deletes sessions a day after they expired; a logged-out one that has not
  expired yet stays: test_prune_deletes_sessions_a_day_past_their_expiry
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import RetentionSettings, connect_workflows, count_prunable, prune
from engine.testing import move_clock
from functions import examples
from functions.app import create_app
from functions.console.sessions import end_session, find_session, start_session
from functions.identity.keys import digest_of, new_key
from functions.identity.principal import Principal, Role, Via
from tests.conftest import Database
from tests.helpers import csrf_of, serving
from tests.oidc_issuer import CLIENT_ID, LocalIssuer

OPERATOR_KEY = new_key()
VIEWER_KEY = new_key()
KEYS = [
    {"name": "deploy-bot", "roles": ["operator"], "sha256": digest_of(OPERATOR_KEY)},
    {"name": "dashboard", "roles": ["viewer"], "sha256": digest_of(VIEWER_KEY)},
]


@asynccontextmanager
async def console(
    db: Database, monkeypatch: pytest.MonkeyPatch, keys: bool = True, **environ: str
) -> AsyncIterator[tuple[httpx.AsyncClient, async_sessionmaker[AsyncSession]]]:
    if keys:
        monkeypatch.setenv("DULY_API_KEYS", json.dumps(KEYS))
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        yield client, Session


async def log_in(client: httpx.AsyncClient, typed: str) -> httpx.Response:
    token = csrf_of(await client.get("/console/login"))
    return await client.post(
        "/console/login", data={"csrf_token": token, "token": typed, "next": "/console/outbox"}
    )


def sessions(db: Database) -> list[tuple[object, ...]]:
    return db.sql(
        "SELECT id, principal_id, name, roles, groups, via, ended_at IS NOT NULL, "
        "expires_at - created_at FROM duly_console_sessions ORDER BY created_at"
    )


async def test_an_api_key_logs_in(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    async with console(db, monkeypatch) as (client, _):
        assert (await client.get("/console")).status_code == 303
        login = await client.get("/console/login")
        assert 'name="token"' in login.text and 'id="login-oidc"' not in login.text
        done = await log_in(client, OPERATOR_KEY)
        assert done.status_code == 303 and done.headers["location"] == "/console/outbox"
        secret = done.cookies["duly_session"]
        [row] = sessions(db)
        assert row[0] == hashlib.sha256(secret.encode()).hexdigest()
        assert row[1:] == ("deploy-bot", None, ["operator", "viewer"], [], "api-key", False,
                           timedelta(hours=12))  # fmt: skip
        assert secret not in json.dumps([str(v) for v in row])
        again = await log_in(client, OPERATOR_KEY)  # logging in again ends the first session
        assert [r[6] for r in sessions(db)] == [True, False]
        assert again.cookies["duly_session"] != secret
        page = await client.get("/console/outbox")
        assert page.status_code == 200
        assert 'id="signed-in-as">deploy-bot<' in page.text and "Log out" in page.text
        # The session acts as the key's principal: an operator, not an admin.
        assert (await client.get("/console/runs/onboarding/start")).status_code == 200
    async with console(db, monkeypatch) as (client, _):
        await log_in(client, VIEWER_KEY)
        form = {"step": "welcome", "row.user_id": "u-v", "row.email": "v@example.com"}
        token = csrf_of(await client.get("/console/outbox"))
        refused = await client.post(
            "/console/runs/onboarding/start", data={**form, "csrf_token": token}
        )
        assert refused.status_code == 403 and "operator" in refused.text
        assert db.sql("SELECT count(*) FROM onboarding") == [(0,)]


async def test_logout_ends_the_session_on_the_server(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_text = "a-token-of-twenty-characters"
    async with console(db, monkeypatch, DULY_API_TOKEN=token_text) as (client, _):
        done = await log_in(client, token_text)
        secret = done.cookies["duly_session"]
        [row] = sessions(db)
        assert (row[1], row[3], row[5]) == ("api-token", sorted(r.value for r in Role), "token")
        page = await client.get("/console/outbox")
        token = csrf_of(page)
        out = await client.post("/console/logout", data={"csrf_token": token})
        assert out.status_code == 303 and out.headers["location"] == "/console/login"
        assert [r[6] for r in sessions(db)] == [True]  # ended_at is set
        # The old cookie, sent again, opens nothing and writes nothing.
        client.cookies.set("duly_session", secret)
        again = await client.get("/console/outbox")
        assert again.status_code == 303 and again.headers["location"].startswith("/console/login")
        form = {"csrf_token": token, "step": "welcome", "row.user_id": "u", "row.email": "e"}
        refused = await client.post("/console/runs/onboarding/start", data=form)
        assert refused.status_code == 401
        assert db.sql("SELECT count(*) FROM onboarding") == [(0,)]


async def test_wrong_logins_are_slowed_per_client(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with console(db, monkeypatch) as (client, _):
        token = csrf_of(await client.get("/console/login"))
        statuses = []
        for n in range(11):
            wrong = await client.post(
                "/console/login", data={"csrf_token": token, "token": f"duly_wrong{n}"}
            )
            statuses.append(wrong.status_code)
        assert statuses == [401] * 10 + [429]
        assert 1 <= int(wrong.headers["retry-after"]) <= 60
        assert "Too many wrong logins" in wrong.text
        right = await client.post(
            "/console/login", data={"csrf_token": token, "token": OPERATOR_KEY}
        )
        assert right.status_code == 429 and "duly_session" not in right.cookies
        assert sessions(db) == []


def issuer_environ(issuer: LocalIssuer) -> dict[str, str]:
    return {
        "DULY_OIDC_ISSUER": issuer.issuer,
        "DULY_OIDC_CLIENT_ID": CLIENT_ID,
        "DULY_OIDC_CLIENT_SECRET": "client-secret-of-the-console",
        "DULY_ROLES": json.dumps({"group:ops": ["operator"]}),
    }


async def test_the_issuer_logs_a_person_in(
    db: Database, monkeypatch: pytest.MonkeyPatch, oidc_issuer: LocalIssuer
) -> None:
    oidc_issuer.client_secret = "client-secret-of-the-console"
    oidc_issuer.preset = "ada"
    async with console(db, monkeypatch, **issuer_environ(oidc_issuer)) as (client, _):
        oidc_issuer.redirect_uris.add(f"{client.base_url}/console/login/callback")
        login = await client.get("/console/login?next=/console/outbox")
        assert f"Log in with {urlsplit(oidc_issuer.url).netloc}" in login.text
        start = await client.get("/console/login/oidc", params={"next": "/console/outbox"})
        assert start.status_code == 303
        sent = urlsplit(start.headers["location"])
        query = {k: v[0] for k, v in parse_qs(sent.query).items()}
        assert f"{sent.scheme}://{sent.netloc}{sent.path}" == f"{oidc_issuer.url}/authorize"
        assert query["code_challenge_method"] == "S256" and len(query["code_challenge"]) == 43
        assert query["state"] and query["nonce"] and query["client_id"] == CLIENT_ID
        flow_cookie = start.headers["set-cookie"]
        assert "duly_oidc=" in flow_cookie and "SameSite=lax" in flow_cookie
        assert "HttpOnly" in flow_cookie
        at_issuer = await client.get(start.headers["location"])
        assert at_issuer.status_code == 302
        back = await client.get(at_issuer.headers["location"])
        assert back.status_code == 303, back.text
        assert back.headers["location"] == "/console/outbox"
        page = await client.get("/console/outbox")
        assert page.status_code == 200 and 'id="signed-in-as">Ada Lovelace<' in page.text
        [row] = sessions(db)
        assert row[1:6] == ("ada", "Ada Lovelace", ["operator", "viewer"], ["ops"], "oidc")
        assert oidc_issuer.codes == {}  # the code was spent


async def test_a_bad_callback_starts_no_session(
    db: Database, monkeypatch: pytest.MonkeyPatch, oidc_issuer: LocalIssuer
) -> None:
    oidc_issuer.client_secret = "client-secret-of-the-console"
    oidc_issuer.preset = "ada"
    async with console(db, monkeypatch, **issuer_environ(oidc_issuer)) as (client, _):
        oidc_issuer.redirect_uris.add(f"{client.base_url}/console/login/callback")

        async def code_and_state() -> tuple[str, str]:
            start = await client.get("/console/login/oidc")
            answer = await client.get(start.headers["location"])
            back = parse_qs(urlsplit(answer.headers["location"]).query)
            return back["code"][0], back["state"][0]

        code, _ = await code_and_state()
        other = await client.get("/console/login/callback", params={"code": code, "state": "x"})
        assert other.status_code == 401 and "state does not match" in other.text
        code, state = await code_and_state()
        flow = client.cookies["duly_oidc"]
        del client.cookies["duly_oidc"]
        lost = await client.get("/console/login/callback", params={"code": code, "state": state})
        assert lost.status_code == 400 and "log in again" in lost.text
        client.cookies.set("duly_oidc", flow)
        used = await client.get("/console/login/callback", params={"code": code, "state": state})
        assert used.status_code == 303  # the code works once...
        client.cookies.clear()
        client.cookies.set("duly_oidc", flow)
        replay = await client.get("/console/login/callback", params={"code": code, "state": state})
        assert replay.status_code == 401 and "did not exchange" in replay.text  # ...not twice
        denied = await client.get("/console/login/callback", params={"error": "access_denied"})
        assert denied.status_code == 401
        assert len(sessions(db)) == 1


async def test_an_expired_session_is_no_good(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    engine = db.engine()
    principal = Principal(id="ada", roles=frozenset({Role.VIEWER}), via=Via.OIDC, name="Ada")
    started = await start_session(engine, principal)
    found = await find_session(engine, started.secret)
    assert found is not None and (found.principal.id, found.principal.via) == ("ada", Via.SESSION)
    assert found.principal.roles == {Role.VIEWER} and found.principal.shown == "Ada"
    assert await find_session(engine, "another-secret") is None
    await move_clock(Session, timedelta(hours=12, seconds=1))
    assert await find_session(engine, started.secret) is None
    await engine.dispose()


async def test_prune_deletes_sessions_a_day_past_their_expiry(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    engine = db.engine()
    principal = Principal(id="ada", roles=frozenset({Role.VIEWER}), via=Via.OIDC)
    old = await start_session(engine, principal)
    await move_clock(Session, timedelta(hours=12 + 24, minutes=1))  # a day past its expiry
    logged_out = await start_session(engine, principal)
    assert await end_session(engine, logged_out.secret)
    assert not await end_session(engine, logged_out.secret)  # ended once
    async with connect_workflows(Session) as connection:
        found = await count_prunable(connection, RetentionSettings())
        [sessions_found] = [t for t in found.tables if t.table == "duly_console_sessions"]
        assert (sessions_found.kind, sessions_found.rows, sessions_found.days) == ("sessions", 1, 1)
        done = await prune(connection, RetentionSettings())
    assert {t.table: t.rows for t in done.tables}["duly_console_sessions"] == 1
    left = db.sql("SELECT id FROM duly_console_sessions")
    assert left == [(hashlib.sha256(logged_out.secret.encode()).hexdigest(),)]
    assert await find_session(engine, old.secret) is None


async def test_with_no_way_to_log_in_the_console_is_closed(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = {"DULY_METRICS_TOKEN": "a-metrics-token-of-twenty"}
    async with console(db, monkeypatch, keys=False, **metrics) as (client, _):
        page = await client.get("/console/outbox")
        assert page.status_code == 303 and page.headers["location"].startswith("/console/login")
        login = await client.get("/console/login")
        assert "Nobody can log in to the console here" in login.text
        form = {"csrf_token": "0" * 64, "step": "welcome", "row.user_id": "u", "row.email": "e"}
        refused = await client.post("/console/runs/onboarding/start", data=form)
        assert refused.status_code == 403 and "nobody can log in here" in refused.text
        assert db.sql("SELECT count(*) FROM onboarding") == [(0,)]


async def test_a_session_ends_with_its_credential(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "the-console-admin-token-one"
    Session = await db.create(examples.Base.metadata)

    async def served(keys: list[dict[str, object]], admin: str) -> httpx.AsyncClient:
        monkeypatch.setenv("DULY_API_KEYS", json.dumps(keys))
        monkeypatch.setenv("DULY_API_TOKEN", admin)
        return serving(create_app(Session, run_worker=False))  # type: ignore[return-value]

    async with await served(KEYS, token) as client:
        assert (await log_in(client, OPERATOR_KEY)).status_code == 303
        as_key = dict(client.cookies)
        client.cookies.clear()
        assert (await log_in(client, token)).status_code == 303
        as_token = dict(client.cookies)
    demoted = [{**KEYS[0], "roles": ["viewer"]}, KEYS[1]]
    async with await served(demoted, token) as client:
        client.cookies.update(as_key)
        page = await client.get("/console/runs/onboarding/start")
        assert page.status_code == 200
        form = {"csrf_token": csrf_of(page), "step": "welcome", "row.user_id": "u"}
        refused = await client.post("/console/runs/onboarding/start", data=form)
        assert refused.status_code == 403 and "needs the operator role" in refused.text
        client.cookies.clear()
        client.cookies.update(as_token)
        assert (await client.get("/console/outbox")).status_code == 200
    async with await served(KEYS[1:], "the-console-admin-token-two") as client:
        for cookies in (as_key, as_token):
            client.cookies.clear()
            client.cookies.update(cookies)
            gone = await client.get("/console/outbox")
            assert gone.status_code == 303 and gone.headers["location"].startswith("/console/login")
