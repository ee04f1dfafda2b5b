"""The console over real HTTP: its pages, its forms, who may use them, and what it refuses.

- every page the console serves answers HTML over the example app, and the
  outbox table's runs are read-only: test_every_page_answers
- a client's mistake is a 4xx page saying so, never JSON or a 500: bad or
  unknown keys, workflows, steps, filters, cursors and events:
  test_client_mistakes_are_4xx_pages
- a console write without its CSRF token is refused and writes nothing;
  with it, the form starts a run through the API's own route:
  test_a_write_needs_the_csrf_token
- a form's values are checked by the API's own models, each refusal shown
  beside its field, and nothing is written: test_a_refused_form_shows_each_error_at_its_field
- a run that fanned out lists its children as links, each child links its
  parent, and a run waiting with a timeout says until when:
  test_children_parent_and_waits_are_shown
- cancel, run and deliver ask for a confirmation first and act only once
  confirmed: test_actions_ask_for_a_confirmation_first
- with DULY_API_TOKEN set, pages redirect to the login form (htmx gets
  HX-Redirect), a wrong token is refused, the right one sets an HttpOnly,
  SameSite=Lax session cookie (Secure over https), and the session then
  opens the pages: test_with_a_token_pages_need_a_login
- a session's CSRF token is bound to it: another session's (or the
  pre-login one) is refused, and the session cookie authorizes no API
  write: test_the_csrf_token_is_bound_to_the_session
- with only DULY_WEBHOOK_SECRET set the console reads but never writes:
  test_with_only_a_secret_the_console_reads_only
- the dev app's clock control moves the clock and resets it; the deployed
  app has none: test_the_clock_control_is_in_the_dev_app_only
- console pages send no-store, a content security policy and no framing:
  test_pages_send_their_security_headers
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import WorkflowEvent
from engine.testing import drain, read_clock_shift
from functions import examples
from functions.app import create_app
from functions.examples import Expense, Onboarding, Research
from functions.local.dev import create_dev_app
from tests.conftest import Database
from tests.helpers import csrf_of, serving

TOKEN = "s3cret-token-for-the-console"


@asynccontextmanager
async def console(
    db: Database, *, dev: bool = False
) -> AsyncIterator[tuple[httpx.AsyncClient, async_sessionmaker[AsyncSession]]]:
    Session = await db.create(examples.Base.metadata)
    app = (
        create_dev_app(Session, run_worker=False) if dev else create_app(Session, run_worker=False)
    )
    async with serving(app) as client:
        yield client, Session


async def count_onboarding(Session: async_sessionmaker[AsyncSession]) -> int:
    async with Session() as session:
        return int(
            (await session.execute(select(func.count()).select_from(Onboarding))).scalar_one()
        )


async def test_every_page_answers(db: Database) -> None:
    async with console(db) as (client, Session):
        row = Onboarding(user_id="u-pages", email="pages@example.com")
        assert await row.start(Onboarding.welcome)
        await publish(Session)
        pages = [
            "/console",
            "/console/overview/live",
            "/console/runs/onboarding",
            "/console/runs/onboarding?order=soonest&state=scheduled",
            f"/console/runs/onboarding/{row.id}",
            f"/console/runs/onboarding/{row.id}/live",
            f"/console/runs/onboarding/{row.id}/run?step=check",
            f"/console/runs/onboarding/{row.id}/deliver?step=activated",
            "/console/runs/onboarding/start",
            "/console/runs/expense/start?step=decide",
            "/console/runs/duly_outbox",
            "/console/outbox",
            "/console/outbox?status=pending",
            "/console/outbox/events/console-event-1",
            "/console/login",
        ]
        for url in pages:
            reply = await client.get(url)
            assert reply.status_code == 200, (url, reply.text[:500])
            assert reply.headers["content-type"].startswith("text/html"), url
        run = (await client.get(f"/console/runs/onboarding/{row.id}")).text
        assert "welcome" in run and "scheduled" in run and "pages@example.com" in run
        outbox_runs = (await client.get("/console/runs/duly_outbox")).text
        assert "Start a run" not in outbox_runs
        refused = await client.get("/console/runs/duly_outbox/start")
        assert refused.status_code == 404


async def publish(Session: async_sessionmaker[AsyncSession]) -> None:
    """One event in the outbox, published in a transaction (no worker drains it here)."""
    event = WorkflowEvent(event_type="console.test", event_id="console-event-1")
    async with Session() as session, session.begin():
        await examples.event_registry.publish(event, session=session)


async def test_client_mistakes_are_4xx_pages(db: Database) -> None:
    async with console(db) as (client, _):
        row = Onboarding(user_id="u-mistakes", email="m@example.com")
        assert await row.start(Onboarding.welcome)
        expected = {
            "/console/runs/nope": 404,
            "/console/runs/nope/1": 404,
            "/console/runs/onboarding/abc": 422,  # the URL names no key of onboarding
            f"/console/runs/onboarding/{10**30}": 400,
            f"/console/runs/onboarding/{row.id + 1000}": 404,
            "/console/runs/onboarding?state=asleep": 400,
            "/console/runs/onboarding?order=oldest": 400,
            "/console/runs/onboarding?after=not-a-cursor": 400,
            "/console/runs/onboarding?key=x": 400,
            "/console/runs/onboarding/start?step=nope": 404,
            f"/console/runs/onboarding/{row.id}/run?step=nope": 404,
            f"/console/runs/onboarding/{row.id}/explode": 404,
            "/console/outbox/events/no-such-event": 404,
            "/console/outbox?status=asleep": 400,
            "/console/outbox?before=no-such-event": 404,
        }
        for url, status in expected.items():
            reply = await client.get(url)
            assert reply.status_code == status, (url, reply.status_code, reply.text[:300])
            assert reply.headers["content-type"].startswith("text/html"), url
            assert 'role="alert"' in reply.text, url
        unknown = (await client.get("/console/runs/nope")).text
        assert "No workflow named &#39;nope&#39;. This app maps: digest, " in unknown
        # A cursor of the newest order is not one of the soonest order.
        for n in range(3):
            assert await Onboarding(user_id=f"u-m{n}", email="x@example.com").start(
                Onboarding.welcome
            )
        api = (await client.get("/workflows/onboarding/runs", params={"limit": 1})).json()
        cursor = api["next_after"]
        mixed = await client.get(
            "/console/runs/onboarding", params={"after": cursor, "order": "soonest"}
        )
        assert mixed.status_code == 400


async def test_a_write_needs_the_csrf_token(db: Database) -> None:
    async with console(db) as (client, Session):
        form = {"step": "welcome", "row.user_id": "u-csrf", "row.email": "csrf@example.com"}
        refused = await client.post("/console/runs/onboarding/start", data=form)
        assert refused.status_code == 403
        assert "CSRF" in refused.text and refused.headers["content-type"].startswith("text/html")
        forged = await client.post(
            "/console/runs/onboarding/start", data={**form, "csrf_token": "0" * 64}
        )
        assert forged.status_code == 403
        assert await count_onboarding(Session) == 0

        token = csrf_of(await client.get("/console/runs/onboarding/start"))
        started = await client.post(
            "/console/runs/onboarding/start", data={**form, "csrf_token": token}
        )
        assert started.status_code == 303
        assert started.headers["location"].endswith("?done=started")
        assert await count_onboarding(Session) == 1
        # The header works as the field does (htmx and fetch send it so).
        again = await client.post(
            "/console/runs/onboarding/start",
            data={**form, "row.user_id": "u-csrf-2"},
            headers={"X-CSRF-Token": token},
        )
        assert again.status_code == 303
        assert await count_onboarding(Session) == 2


async def test_a_refused_form_shows_each_error_at_its_field(db: Database) -> None:
    async with console(db) as (client, Session):
        token = csrf_of(await client.get("/console/runs/onboarding/start"))
        bad = {
            "csrf_token": token,
            "step": "welcome",
            "row.id": "twelve",
            "row.email": "e@example.com",
        }
        reply = await client.post("/console/runs/onboarding/start", data=bad)
        assert reply.status_code == 400
        page = reply.text
        # Each refusal beside its own field, from the API's own model.
        assert 'id="field-row-id-error"' in page and "valid integer" in page
        assert 'id="field-row-user_id-error"' in page and "Field required" in page
        assert 'aria-invalid="true"' in page and 'value="twelve"' in page
        # A step's arguments: a choice outside its Literal.
        expense = await client.post(
            "/console/runs/expense/start",
            data={
                "csrf_token": token,
                "step": "decide",
                "row.amount": "12",
                "args.verdict": "maybe",
                "args.by": "ann",
            },
        )
        assert expense.status_code == 400
        assert 'id="field-args-verdict-error"' in expense.text
        # A duplicate unique value: the API's 409, said on the form.
        ok = {"csrf_token": token, "step": "welcome", "row.user_id": "u-1", "row.email": "e"}
        assert (await client.post("/console/runs/onboarding/start", data=ok)).status_code == 303
        twice = await client.post("/console/runs/onboarding/start", data=ok)
        assert twice.status_code == 409 and "exists" in twice.text
        bad_json = await client.post(
            "/console/runs/research/start",
            data={
                "csrf_token": token,
                "step": "research_all",
                "row.name": "r",
                "row.companies": "[1,",
            },
        )
        assert bad_json.status_code == 400 and "not JSON" in bad_json.text
        assert await count_onboarding(Session) == 1


async def test_children_parent_and_waits_are_shown(db: Database) -> None:
    async with console(db) as (client, Session):
        research = Research(name="acme", companies=["alpha", "beta"])
        assert await research.start(Research.research_all)
        expense = Expense(id=7, amount=120)
        assert await expense.start(Expense.request_approval)
        # The example workflows by name: another test module may map a table `lookup` too.
        await drain(Session, [Research, examples.Lookup, Expense])
        page = (await client.get(f"/console/runs/research/{research.id}")).text
        links = re.findall(r'href="(/console/runs/lookup/\d+)"', page)
        assert len(links) == 2, page
        # A child names its parent in `parent`; its page links there (shown on an Onboarding
        # row here: another test module may map a table `lookup` of its own in this process).
        child = Onboarding(user_id="u-child", email="c@example.com")
        assert await child.start(Onboarding.welcome)
        async with Session() as session, session.begin():
            reference = {"table": "research", "key": [research.id]}
            await session.execute(
                update(Onboarding).where(Onboarding.id == child.id).values(parent=reference)
            )
        shown = (await client.get(f"/console/runs/onboarding/{child.id}")).text
        assert f'href="/console/runs/research/{research.id}"' in shown
        waiting = (await client.get("/console/runs/expense/7")).text
        assert 'id="run-waits"' in waiting and "an event for <strong>decide</strong>" in waiting
        assert "in 1 day" in waiting and "then escalate" in waiting


async def test_actions_ask_for_a_confirmation_first(db: Database) -> None:
    async with console(db) as (client, _):
        row = Onboarding(user_id="u-act", email="act@example.com")
        assert await row.start(Onboarding.welcome)
        base = f"/console/runs/onboarding/{row.id}"
        token = csrf_of(await client.get(base))

        asked = await client.post(f"{base}/cancel", data={"csrf_token": token})
        assert asked.status_code == 200 and "Yes, cancel it" in asked.text
        assert (await state_of(client, row.id)) == "scheduled"
        done = await client.post(f"{base}/cancel", data={"csrf_token": token, "confirmed": "yes"})
        assert done.status_code == 303 and "done=cancel" in done.headers["location"]
        assert (await state_of(client, row.id)) == "cancelled"
        landed = await client.get(done.headers["location"])
        assert "Cancelled: 1 run(s)" in landed.text

        form = {"csrf_token": token, "step": "activated", "args.plan": "pro"}
        asked = await client.post(f"{base}/run", data=form)
        assert asked.status_code == 200 and "Yes, run it now" in asked.text
        assert 'name="args.plan" value="pro"' in asked.text
        # Each value under its label, its form field's name beside it.
        assert '<dt>Plan <span class="hint">(<code>args.plan</code>)</span></dt>' in asked.text
        options = {"options.idempotency_key": "k-0"}
        asked_delivery = await client.post(f"{base}/deliver", data={**form, **options})
        assert "<dt>Idempotency key: a key delivered before is refused " in asked_delivery.text
        assert (await state_of(client, row.id)) == "cancelled"
        bad = await client.post(f"{base}/run", data={**form, "args.plan": "gold"})
        assert bad.status_code == 400 and 'id="field-args-plan-error"' in bad.text
        ran = await client.post(f"{base}/run", data={**form, "confirmed": "yes"})
        assert ran.status_code == 303
        run = (await client.get(f"/workflows/onboarding/runs/{row.id}")).json()
        assert (run["state"], run["row"]["next_step"]) == ("scheduled", "activated")

        delivered = await client.post(
            f"{base}/deliver",
            data={**form, "confirmed": "yes", "options.idempotency_key": "k-1"},
        )
        assert delivered.status_code == 303 and "count=" in delivered.headers["location"]


async def state_of(client: httpx.AsyncClient, key: int) -> str:
    reply = await client.get(f"/workflows/onboarding/runs/{key}")
    state: str = reply.json()["state"]
    return state


async def test_with_a_token_pages_need_a_login(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_API_TOKEN", TOKEN)
    async with console(db) as (client, _):
        page = await client.get("/console/runs/onboarding")
        assert page.status_code == 303
        assert page.headers["location"] == "/console/login?next=%2Fconsole%2Fruns%2Fonboarding"
        fragment = await client.get("/console/overview/live", headers={"HX-Request": "true"})
        assert fragment.status_code == 401 and fragment.headers["hx-redirect"].startswith(
            "/console/login"
        )
        login = await client.get("/console/login")
        assert login.status_code == 200
        token = csrf_of(login)
        wrong = await client.post(
            "/console/login", data={"csrf_token": token, "token": "guess", "next": "/console"}
        )
        assert wrong.status_code == 401 and "duly_session" not in wrong.headers.get(
            "set-cookie", ""
        )
        no_csrf = await client.post("/console/login", data={"token": TOKEN})
        assert no_csrf.status_code == 403
        right = await client.post(
            "/console/login",
            data={"csrf_token": token, "token": TOKEN, "next": "/console/runs/onboarding"},
        )
        assert right.status_code == 303 and right.headers["location"] == "/console/runs/onboarding"
        cookie = right.headers["set-cookie"]
        assert "duly_session=" in cookie and "HttpOnly" in cookie
        assert "SameSite=lax" in cookie  # Lax: the issuer's redirect back must carry it
        assert "Secure" not in cookie and TOKEN not in cookie
        assert (await client.get("/console/runs/onboarding")).status_code == 200
        elsewhere = await client.post(
            "/console/login",
            data={"csrf_token": token, "token": TOKEN, "next": "https://evil.example/"},
        )
        assert elsewhere.headers["location"] == "/console"
        secure = await client.post(
            "/console/login",
            data={"csrf_token": token, "token": TOKEN},
            headers={"X-Forwarded-Proto": "https"},
        )
        assert "Secure" in secure.headers["set-cookie"]


async def test_the_csrf_token_is_bound_to_the_session(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_API_TOKEN", TOKEN)
    async with console(db) as (client, Session):
        anonymous = csrf_of(await client.get("/console/login"))
        form = {"step": "welcome", "row.user_id": "u-bound", "row.email": "b@example.com"}
        no_session = await client.post(
            "/console/runs/onboarding/start", data={**form, "csrf_token": anonymous}
        )
        assert no_session.status_code == 401
        await client.post("/console/login", data={"csrf_token": anonymous, "token": TOKEN})
        first = csrf_of(await client.get("/console/runs/onboarding/start"))
        assert first != anonymous
        # Another session (a second login) has another token; the first one's is refused.
        await client.post("/console/login", data={"csrf_token": anonymous, "token": TOKEN})
        second = csrf_of(await client.get("/console/runs/onboarding/start"))
        assert second != first
        stale = await client.post(
            "/console/runs/onboarding/start", data={**form, "csrf_token": first}
        )
        assert stale.status_code == 403
        assert await count_onboarding(Session) == 0
        ok = await client.post(
            "/console/runs/onboarding/start", data={**form, "csrf_token": second}
        )
        assert ok.status_code == 303
        # The session is the console's: the JSON API's writes still need the bearer token.
        api = await client.post(
            "/workflows/onboarding/cancel", json={"key": 1}, headers={"X-CSRF-Token": second}
        )
        assert api.status_code == 401
        out = await client.post("/console/logout", data={"csrf_token": second})
        assert out.status_code == 303
        assert (await client.get("/console")).status_code == 303


async def test_with_only_a_secret_the_console_is_closed(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signing secret is a credential: the console's pages need a login like every read,
    and with no token, key or issuer to log in with, a form write is refused."""
    monkeypatch.setenv("DULY_WEBHOOK_SECRET", "hook-secret-of-sixteen")
    async with console(db) as (client, Session):
        page = await client.get("/console/runs/onboarding/start")
        assert page.status_code == 303
        assert page.headers["location"].startswith("/console/login")
        form = {"step": "welcome", "row.user_id": "u", "row.email": "e"}
        refused = await client.post("/console/runs/onboarding/start", data=form)
        assert refused.status_code in (401, 403)
        assert await count_onboarding(Session) == 0


async def test_the_clock_control_is_in_the_dev_app_only(db: Database) -> None:
    async with console(db, dev=True) as (client, Session):
        page = await client.get("/console")
        assert 'action="/console/clock"' in page.text
        token = csrf_of(page)
        moved = await client.post(
            "/console/clock",
            data={"csrf_token": token, "amount": "3", "unit": "days", "direction": "forward"},
            headers={"HX-Request": "true"},
        )
        assert moved.status_code == 200 and moved.headers["hx-trigger"] == "clock-moved"
        assert "+3 days" in moved.text
        assert await read_clock_shift(Session) == timedelta(days=3)
        back = await client.post(
            "/console/clock",
            data={"csrf_token": token, "amount": "90", "unit": "minutes", "direction": "back"},
        )
        assert back.status_code == 303
        assert await read_clock_shift(Session) == timedelta(days=3, minutes=-90)
        nonsense = await client.post(
            "/console/clock",
            data={"csrf_token": token, "amount": "soon", "direction": "forward"},
            headers={"HX-Request": "true"},
        )
        assert nonsense.status_code == 200 and "is not a number" in nonsense.text
        too_far = await client.post(
            "/console/clock", data={"csrf_token": token, "amount": "1e9", "unit": "days"}
        )
        assert too_far.status_code == 400
        reset = await client.post(
            "/console/clock", data={"csrf_token": token, "direction": "reset"}
        )
        assert reset.status_code == 303
        assert await read_clock_shift(Session) == timedelta(0)
    async with serving(create_app(Session, run_worker=False)) as client:
        assert 'action="/console/clock"' not in (await client.get("/console")).text
        token = csrf_of(await client.get("/console/runs/onboarding/start"))
        assert (await client.post("/console/clock", data={"csrf_token": token})).status_code == 404


async def test_pages_send_their_security_headers(db: Database) -> None:
    async with console(db) as (client, _):
        reply = await client.get("/console")
    assert reply.headers["cache-control"] == "no-store"
    assert reply.headers["x-frame-options"] == "DENY"
    policy = reply.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-eval" not in policy


async def test_every_page_refusal_and_reply_carries_the_security_headers(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The login form, a refusal page and the docs are no more frameable than the
    console's own pages; nothing is sniffed; pages are not cached; https adds HSTS."""
    monkeypatch.setenv("DULY_API_TOKEN", TOKEN)
    async with console(db) as (client, Session):
        login = await client.get("/console/login")
        refusal = await client.post("/console/runs/onboarding/start", data={"step": "welcome"})
        docs = await client.get("/docs", headers={"Authorization": f"Bearer {TOKEN}"})
        missing = await client.get("/console/no-such-page")
        reply = await client.get("/workflows")
        assert "text/html" in refusal.headers["content-type"], refusal.text
        for page in (login, refusal, docs):
            assert "frame-ancestors 'none'" in page.headers["content-security-policy"], page.url
            assert page.headers["x-frame-options"] == "DENY", page.url
            assert page.headers["cache-control"] == "no-store", page.url
            assert page.headers["x-content-type-options"] == "nosniff", page.url
            assert "strict-transport-security" not in page.headers  # plain http: none
        for answer in (reply, missing):  # JSON, an unknown path's 404 too: no page policy
            assert answer.headers["x-content-type-options"] == "nosniff", answer.url
            assert "content-security-policy" not in answer.headers, answer.url
        over_https = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(Session, run_worker=False)),
            base_url="https://duly.example",
        )
        async with over_https:
            secure = await over_https.get("/console/login")
        assert secure.headers["strict-transport-security"] == "max-age=31536000"
