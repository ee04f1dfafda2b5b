"""The dev app (functions/local/dev.py) over real HTTP: the clock, the example's runs, bad input."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from engine.testing import move_clock, read_clock_shift
from functions import examples
from functions.app import create_app
from functions.examples import Onboarding
from functions.local.command import exposure_warning
from functions.local.dev import create_dev_app
from tests.conftest import Database
from tests.helpers import csrf_of, onboarding, serving, wait_until

SETTLE = 5.0  # seconds a run may take to reach a state before the test fails
FAST_WORKER = {"workflows": [Onboarding], "max_idle_interval": timedelta(seconds=0.5)}
BIG = 5_000_000  # characters in a request body that must not come back


async def test_dev_clock_moves_the_clock_and_the_check_step_runs(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    app = create_dev_app(Session, worker_options=FAST_WORKER)
    async with serving(app) as client:
        row = Onboarding(user_id="u-clock", email="clock@example.com")
        assert await row.start(Onboarding.welcome)

        async def waiting() -> bool:
            return (await onboarding(Session, "u-clock")).status == "waiting"

        await wait_until(waiting, timeout=SETTLE)
        assert (await onboarding(Session, "u-clock")).nudges == 0
        reply = await client.post("/dev/clock", json={"days": 3})
        assert reply.status_code == 200
        assert reply.json() == {"shift_seconds": 3 * 24 * 3600.0}

        async def nudged() -> bool:
            return (await onboarding(Session, "u-clock")).nudges == 1

        await wait_until(nudged, timeout=SETTLE)
        history = (await client.get(f"/workflows/onboarding/runs/{row.id}")).json()
        reply = await client.post("/dev/clock", json={"hours": 1.5, "minutes": 30})
        assert reply.json() == {"shift_seconds": (3 * 24 + 2) * 3600.0}
    assert [(a["step"], a["outcome"]) for a in history["history"]] == [
        ("welcome", "ok"),
        ("check", "ok"),
    ]


async def test_dev_clock_refuses_bad_moves(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_dev_app(Session, run_worker=False)) as client:
        statuses = [
            (await client.post("/dev/clock", json=body)).status_code
            for body in ({"days": "soon"}, {"day": 3}, {"days": 1e300}, {"years": 1})
        ]
        not_json = await client.post(
            "/dev/clock", content="days=3", headers={"content-type": "text/plain"}
        )
    assert statuses == [422, 422, 400, 422]
    assert not_json.status_code == 422


async def test_the_clock_moves_at_most_a_century_in_total(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    century = {"days": -36_500}
    async with serving(create_dev_app(Session, run_worker=False)) as client:
        assert (
            await client.post("/dev/onboarding", json={"user_id": "u", "email": "e"})
        ).is_success
        replies = [await client.post("/dev/clock", json=century) for _ in range(75)]
        token = csrf_of(await client.get("/console"))
        form = {"csrf_token": token, "amount": "1", "unit": "days", "direction": "back"}
        console = await client.post("/console/clock", data=form)
        pages = [
            (await client.get(path)).status_code
            for path in ("/console", "/console/runs/onboarding", "/runs/onboarding", "/overview")
        ]
        assert await read_clock_shift(Session) == timedelta(days=-36_500), "nothing moved"
        assert (await client.post("/dev/clock", json={"days": 36_500})).status_code == 200
    assert [r.status_code for r in replies] == [200] + [400] * 74
    assert "more than 36500 days from PostgreSQL's own time" in replies[1].json()["detail"]
    assert console.status_code == 400 and "more than 36500 days" in console.text
    assert pages == [200] * 4


async def test_dev_onboarding_starts_a_run_once(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_dev_app(Session, run_worker=False)) as client:
        body = {"user_id": "u-dev", "email": "dev@example.com"}
        first = await client.post("/dev/onboarding", json=body)
        second = await client.post("/dev/onboarding", json=body)
        empty = await client.post("/dev/onboarding", json={"user_id": "", "email": "x"})
        runs = [r["row"] for r in (await client.get("/workflows/onboarding/runs")).json()["runs"]]
    assert first.status_code == 200 and first.json()["started"] is True
    assert second.status_code == 200
    assert second.json() == {"started": False, "id": first.json()["id"]}
    assert empty.status_code == 422
    assert [(run["id"], run["user_id"]) for run in runs] == [(first.json()["id"], "u-dev")]


async def test_dev_routes_exist_only_in_dev(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        clock = await client.post("/dev/clock", json={"days": 3})
        start = await client.post("/dev/onboarding", json={"user_id": "u", "email": "e"})
    assert (clock.status_code, start.status_code) == (404, 404)


async def test_the_examples_routes_exist_only_for_the_examples(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    Session = await db.create(examples.Base.metadata)
    claim = {"title": "Trip", "amount": 1, "submitted_by": "sam"}
    replies = {}
    monkeypatch.setenv("DULY_APP", "myapp.workflows")  # a user's own app
    for serving_examples in (False, True):
        if serving_examples:
            monkeypatch.delenv("DULY_APP")  # unset: duly's examples
        async with serving(create_dev_app(Session, run_worker=False)) as client:
            replies[serving_examples] = [
                (await client.post("/dev/clock", json={"hours": 1})).status_code,
                (
                    await client.post("/dev/onboarding", json={"user_id": "u", "email": "e"})
                ).status_code,
                (
                    await client.post("/dev/expenses", json={"expense_id": 1, "amount": 1})
                ).status_code,
                (await client.post("/dev/expense-claims", json=claim)).status_code,
            ]
    # The clock serves any app; the routes that make the examples' rows serve only the examples.
    assert replies == {False: [200, 404, 404, 404], True: [200, 200, 200, 201]}


async def test_dev_clock_reset_puts_the_clock_back(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    await move_clock(Session, timedelta(days=2))
    async with serving(create_dev_app(Session, run_worker=False)) as client:
        reply = await client.post("/dev/clock/reset")
        again = await client.post("/dev/clock/reset")
    assert (reply.status_code, reply.json()) == (200, {"shift_seconds": 0.0})
    assert again.status_code == 200
    assert await read_clock_shift(Session) == timedelta(0)


async def test_infinity_and_nan_are_refused_with_a_message(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_dev_app(Session, run_worker=False)) as client:
        # Raw text: Python's json module reads Infinity and NaN, which JSON itself has not.
        replies = [
            await client.post(
                "/dev/clock", content=body, headers={"content-type": "application/json"}
            )
            for body in ('{"days": Infinity}', '{"hours": -Infinity}', '{"minutes": NaN}')
        ]
    for reply in replies:
        assert reply.status_code == 422, reply.text
        [error] = reply.json()["detail"]
        assert error["type"] == "finite_number"
        assert error["msg"] == "Input should be a finite number"
        assert error["loc"][0] == "body"
        assert "input" not in error
    assert await read_clock_shift(Session) == timedelta(0)


async def test_a_nul_byte_is_refused_and_nothing_is_written(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_dev_app(Session, run_worker=False)) as client:
        nul_user = await client.post(
            "/dev/onboarding", json={"user_id": "a\u0000b", "email": "nul@example.com"}
        )
        nul_email = await client.post(
            "/dev/onboarding", json={"user_id": "u-nul", "email": "nul\u0000@example.com"}
        )
    for reply in (nul_user, nul_email):
        assert reply.status_code == 400, reply.text
        assert reply.json()["detail"] == (
            "The database refused a value in this request: "
            "PostgreSQL text fields cannot contain NUL (0x00) bytes."
        )
    async with Session() as session:
        assert await session.scalar(select(func.count()).select_from(Onboarding)) == 0


async def test_a_422_does_not_echo_a_large_body(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bodies this large pass the size limit only when it is raised (413 otherwise).
    monkeypatch.setenv("DULY_MAX_BODY_BYTES", str(10 * BIG))
    Session = await db.create(examples.Base.metadata)
    async with serving(create_dev_app(Session, run_worker=False)) as client:
        big_value = await client.post("/dev/clock", json={"days": "x" * BIG})
        big_field = await client.post("/dev/clock", json={"x" * BIG: 1})
        big_list = await client.post("/dev/onboarding", json=[{"user_id": 1}] * 500_000)
    for reply in (big_value, big_field, big_list):
        assert reply.status_code == 422, reply.text[:300]
        assert len(reply.content) < 5_000, reply.text[:300]
        for error in reply.json()["detail"]:
            assert set(error) == {"loc", "msg", "type"}
    [error] = big_value.json()["detail"]
    assert (error["loc"], error["type"]) == (["body", "days"], "float_type")  # text is no number
    [error] = big_field.json()["detail"]
    assert error["type"] == "extra_forbidden"
    assert error["loc"][1].startswith("xxx") and error["loc"][1].endswith("…")


def test_duly_dev_warns_when_it_listens_beyond_this_machine_with_writes_open() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert exposure_warning(host, {}) is None, host
    said = exposure_warning("0.0.0.0", {})
    assert said is not None and "0.0.0.0" in said and "DULY_API_TOKEN" in said
    assert exposure_warning("192.0.2.7", {}) is not None
    assert exposure_warning("0.0.0.0", {"DULY_API_TOKEN": "a-key-of-sixteen-or-more"}) is None
    assert (
        exposure_warning("0.0.0.0", {"DULY_WEBHOOK_SECRET": "a-secret-of-sixteen-or-more"}) is None
    )


async def test_with_writes_open_a_page_of_another_site_cannot_write(db: Database) -> None:
    """No token, no secret: a page on another local port (or a sandboxed one, Origin null)
    sending no-cors POSTs is refused; the same origin, and curl (no Origin), may write."""
    Session = await db.create(examples.Base.metadata)
    async with serving(create_dev_app(Session, run_worker=False)) as client:
        here = f"http://{client.base_url.netloc.decode()}"
        moved = await client.post("/dev/clock", json={"hours": 1})  # curl: no Origin
        assert moved.status_code == 200, moved.text
        for origin in ("http://127.0.0.1:1", "http://evil.example", "null"):
            # What a page's fetch(url, {method: "POST", mode: "no-cors"}) sends.
            headers = {"Origin": origin, "Content-Type": "text/plain"}
            refused = await client.post("/dev/clock/reset", headers=headers)
            assert refused.status_code == 403, (origin, refused.text)
            assert "a page of another site may not write" in refused.json()["detail"]
            assert await read_clock_shift(Session) == timedelta(hours=1), origin
        same = await client.post("/dev/clock/reset", headers={"Origin": here})
        assert same.status_code == 200, same.text
    assert await read_clock_shift(Session) == timedelta(0)
