"""Searching runs: one filter language through the API's `?q=`, `duly runs --where` and pages.

Thirty payments (tests/apps/search.py), one an hour; a run in five failed (card declined, or
the bank timed out), a run in seven is at `refund`, the rest at `charge`; amounts repeat, so
a page by amount breaks its ties by key.

- each kind of term (state, step, key, error text, an own column with each operator, a time,
  absolute or relative, `since:`), alone and with the single parameters, answers the runs
  the SQL would: test_each_kind_of_term_finds_its_runs
- every mistake is a 400 whose sentence names what is allowed, and reads nothing:
  test_each_mistake_is_refused_naming_what_is_allowed
- pages of a filtered set, by the walked column's index or by key, with a window so small
  that pages stop where it ends, hold every matching run once: test_pages_never_repeat_or_skip
- the console's search box takes the same text, and its value survives paging (each page's
  next link carries it): test_the_console_search_survives_paging
- code other than the doors searches with names imported from `engine`, as the workflows
  guide (docs/how-to/workflows.md) says of everything:
  test_a_filter_read_and_a_page_listed_with_engine_s_names,
  test_the_readme_sends_its_readers_to_engine_alone
- `duly runs --where` reads the same text, with today's flags ANDed, and refuses a mistake
  with exit status 2: test_duly_runs_where_takes_the_same_language
"""

from __future__ import annotations

import html
import json
import re
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import engine
from engine import RunFilter, connect_workflows, find_workflow, list_runs, parse_filter
from engine.views import runs as run_views
from functions.app import create_app
from tests.apps import search
from tests.conftest import Database
from tests.helpers import REPO_ROOT, dev_env, run_duly, serving

RUNS = 30
URL = "/workflows/payment/runs"


def amount_of(i: int) -> Decimal:
    return Decimal((i % 6) * 50 + 10)  # 10, 60, ..., 260: five runs each


def failed(i: int) -> bool:
    return i % 5 == 0


def error_of(i: int) -> str | None:
    if not failed(i):
        return None
    return "CardError: card declined" if i % 10 == 0 else "TimeoutError: the bank timed out"


async def filled(db: Database) -> async_sessionmaker[AsyncSession]:
    """RUNS payments, `i` created `RUNS - i` hours ago; every fifth failed, every seventh
    (not failed) at refund, the rest scheduled at charge."""
    Session = await db.create(search.Base.metadata)
    db.sql(
        f"""
        INSERT INTO payment (id, amount, created_at, customer, urgent, next_step, next_args,
                             wake_at, last_error)
        SELECT i, (i % 6) * 50 + 10, now() - ({RUNS} - i) * interval '1 hour', 'c' || (i % 3),
            i % 4 = 0,
            CASE WHEN i % 5 = 0 THEN NULL WHEN i % 7 = 0 THEN 'refund' ELSE 'charge' END,
            CASE WHEN i % 5 = 0 THEN NULL ELSE '{{}}'::json END,
            CASE WHEN i % 5 = 0 THEN NULL ELSE now() + i * interval '1 minute' END,
            CASE WHEN i % 10 = 0 THEN 'CardError: card declined'
                 WHEN i % 5 = 0 THEN 'TimeoutError: the bank timed out' END
        FROM generate_series(1, {RUNS}) AS i
        """
    )
    db.sql("ANALYZE payment")
    return Session


def by_amount(keys: list[int]) -> list[str]:
    """Keys in a column walk's order: highest amount first, then highest key."""
    return [str(i) for i in sorted(keys, key=lambda i: (amount_of(i), i), reverse=True)]


def newest(keys: list[int]) -> list[str]:
    return [str(i) for i in sorted(keys, reverse=True)]


ALL = range(1, RUNS + 1)


def failed_from(amount: int) -> list[int]:
    """The failed runs of at least `amount`."""
    return [i for i in ALL if failed(i) and amount_of(i) >= amount]


async def keys_of(client: httpx.AsyncClient, **params: Any) -> list[str]:
    reply = await client.get(URL, params={"limit": 500, **params})
    assert reply.status_code == 200, reply.text
    return [run["key"] for run in reply.json()["runs"]]


async def test_each_kind_of_term_finds_its_runs(db: Database) -> None:
    Session = await filled(db)
    [(created_20,)] = db.sql("SELECT created_at FROM payment WHERE id = 20")
    assert isinstance(created_20, datetime)
    cases: list[tuple[dict[str, str], list[str]]] = [
        ({"q": "state:failed"}, newest([i for i in ALL if failed(i)])),
        ({"q": "step:refund"}, newest([i for i in ALL if i % 7 == 0 and not failed(i)])),
        ({"q": "key:7"}, ["7"]),
        ({"q": 'error:"card declined"'}, newest([i for i in ALL if i % 10 == 0])),
        ({"q": "error:TIMED"}, newest([i for i in ALL if failed(i) and i % 10])),
        ({"q": "amount=60"}, by_amount([i for i in ALL if amount_of(i) == 60])),
        ({"q": "amount:60"}, by_amount([i for i in ALL if amount_of(i) == 60])),
        ({"q": "amount!=60"}, newest([i for i in ALL if amount_of(i) != 60])),
        ({"q": "amount<60"}, by_amount([i for i in ALL if amount_of(i) < 60])),
        ({"q": "amount<=60"}, by_amount([i for i in ALL if amount_of(i) <= 60])),
        ({"q": "amount>210"}, by_amount([i for i in ALL if amount_of(i) > 210])),
        ({"q": "amount>=210.5"}, by_amount([i for i in ALL if amount_of(i) >= Decimal("210.5")])),
        ({"q": "amount>=100 amount<200"}, by_amount([i for i in ALL if 100 <= amount_of(i) < 200])),
        ({"q": "id>25"}, newest(list(range(26, RUNS + 1)))),
        ({"q": "urgent=true"}, newest([i for i in ALL if i % 4 == 0])),
        ({"q": "urgent:False state:failed"}, newest([i for i in ALL if i % 4 and failed(i)])),
        ({"q": f"created_at>={created_20.isoformat()}"}, newest(list(range(20, RUNS + 1)))),
        ({"q": "created_at>=-3h"}, newest([28, 29, 30])),  # 2, 1 and 0 hours old
        ({"q": "created_at<-27h30m"}, newest([1, 2])),
        ({"q": "state:failed since:6h"}, newest([25, 30])),  # failed, made in the last 6 hours
        ({"q": "state:failed", "error": "card"}, newest([10, 20, 30])),
        (
            {"q": "amount>=100", "state": "failed"},
            by_amount(failed_from(100)),
        ),
        ({"q": 'error:"bank timed"', "order": "soonest"}, ["5", "15", "25"]),
        (
            {"q": "step:charge amount>=200", "order": "soonest"},
            [str(i) for i in ALL if not failed(i) and i % 7 and amount_of(i) >= 200],
        ),
    ]
    async with serving(create_app(Session, run_worker=False)) as client:
        for params, expected in cases:
            assert await keys_of(client, **params) == expected, params
        # A date alone is midnight UTC; every run here is later than 2020's first.
        assert len(await keys_of(client, q="created_at>2020-01-01")) == RUNS


MISTAKES = [
    (
        {"q": "amont>=5"},
        "amont is not a column of payment: filter on state, step, waiting, key, error, "
        "since or a column that leads an index (id, amount, created_at, urgent).",
    ),
    ({"q": "customer=c1"}, "customer is not an indexed column of payment"),
    ({"q": "amount>=lots"}, "'lots' is not a valid amount for payment: expected Decimal."),
    ({"q": "amount~5"}, "Cannot read 'amount~5': write terms as name:value or column>=value"),
    ({"q": "amount>="}, "Cannot read 'amount>='"),
    ({"q": "state>=failed"}, "state takes state:value, not >=."),
    ({"q": "state:broke"}, "No run state 'broke': use one of running, waiting,"),
    ({"q": "step:ship"}, "payment has no step 'ship': its steps are charge, refund."),
    ({"q": "urgent=maybe"}, "'maybe' is not a valid urgent for payment: expected true or false."),
    ({"q": "key:seven"}, "'seven' is not a valid id for payment: expected int."),
    ({"q": "created_at>=yesterday"}, "expected datetime (ISO 8601, e.g. 2026-12-01"),
    ({"q": "created_at>=-1y"}, "'1y' is not a duration: write it as 90s, 15m, 1h, 1h30m or 2d."),
    ({"q": "since:soon"}, "'soon' is not a duration"),
    ({"q": "state:failed state:finished"}, "The state filter is given twice: give it once."),
    ({"q": "state:failed", "state": "finished"}, "The state filter is given twice"),
    ({"q": "amount>=5", "after": "garbage"}, "is not a page cursor of payment's newest runs"),
]


async def test_each_mistake_is_refused_naming_what_is_allowed(db: Database) -> None:
    Session = await filled(db)
    async with serving(create_app(Session, run_worker=False)) as client:
        for params, message in MISTAKES:
            reply = await client.get(URL, params=params)
            assert reply.status_code == 400, (params, reply.text)
            assert message in reply.json()["detail"], (params, reply.json())
        # A cursor of a page by key is not one of a page by amount.
        by_key = (await client.get(URL, params={"limit": 2})).json()["next_after"]
        reply = await client.get(URL, params={"q": "amount>=5", "after": by_key})
        assert reply.status_code == 400 and "page cursor" in reply.json()["detail"]
        # Nor is a cursor of pages by one column one of pages by another.
        by_amount_cursor = (await client.get(URL, params={"q": "amount>=5", "limit": 2})).json()
        reply = await client.get(
            URL, params={"q": "id>=5", "after": by_amount_cursor["next_after"]}
        )
        assert reply.status_code == 400 and "page cursor" in reply.json()["detail"]


@pytest.mark.parametrize("window", [run_views.SCAN_WINDOW, 4])
async def test_pages_never_repeat_or_skip(
    db: Database, window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    Session = await filled(db)
    monkeypatch.setattr(run_views, "SCAN_WINDOW", window)
    queries = {
        "amount>=60": by_amount([i for i in ALL if amount_of(i) >= 60]),
        "amount<=110 state:failed": by_amount(
            [i for i in ALL if amount_of(i) <= 110 and failed(i)]
        ),
        "created_at>=-20h step:charge": newest(
            [i for i in ALL if i > RUNS - 20 and not failed(i) and i % 7]
        ),
        "amount!=60 state:failed": newest([i for i in ALL if amount_of(i) != 60 and failed(i)]),
    }
    async with serving(create_app(Session, run_worker=False)) as client:
        for q, expected in queries.items():
            seen: list[str] = []
            after: str | None = None
            for _ in range(RUNS * 2):  # more pages than runs would be a loop
                params = {"q": q, "limit": 2, **({"after": after} if after else {})}
                page = (await client.get(URL, params=params)).json()
                seen += [run["key"] for run in page["runs"]]
                after = page["next_after"]
                if after is None:
                    break
            assert seen == expected, q


async def test_the_console_search_survives_paging(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    Session = await filled(db)
    monkeypatch.setattr(run_views, "SCAN_WINDOW", 4)  # each page stops where its window ends
    q = "amount>=60 state:failed"
    seen: list[str] = []
    url: str | None = "/console/runs/payment?" + urlencode({"q": q})
    async with serving(create_app(Session, run_worker=False)) as client:
        for _ in range(RUNS):
            assert url is not None
            reply = await client.get(url)
            assert reply.status_code == 200, reply.text
            assert f'value="{html.escape(q)}"' in reply.text  # the box still holds the search
            seen += re.findall(r'<th scope="row"><a href="/console/runs/payment/(\d+)"', reply.text)
            found = re.search(r'<a href="([^"]+)" rel="next">', reply.text)
            if found is None:
                break
            url = "/console/runs/payment" + html.unescape(found.group(1))
            assert "q=" in url
        refused = await client.get("/console/runs/payment", params={"q": "customer=c1"})
    assert seen == by_amount([i for i in ALL if failed(i) and amount_of(i) >= 60])
    assert refused.status_code == 400
    assert "customer is not an indexed column of payment" in refused.text


def env_for(db: Database, tmp_path: Path) -> dict[str, str]:
    return dev_env(tmp_path / "pg", DULY_APP="tests.apps.search", DULY_DATABASE_URL=db.url)


async def test_duly_runs_where_takes_the_same_language(db: Database, tmp_path: Path) -> None:
    await filled(db)
    env = env_for(db, tmp_path)

    def keys(*args: str) -> list[str]:
        done = run_duly("runs", "payment", *args, "--json", cwd=REPO_ROOT, env=env)
        assert done.returncode == 0, done.stderr
        return [run["key"] for run in json.loads(done.stdout)["runs"]]

    assert keys("--where", 'state:failed error:"card declined"') == ["30", "20", "10"]
    assert keys("--where", "amount>=210", "--state", "failed") == by_amount(
        [i for i in ALL if failed(i) and amount_of(i) >= 210]
    )
    assert keys("--where", "created_at>=-3h") == ["30", "29", "28"]
    assert keys("--where", "state:failed since:6h") == ["30", "25"]
    table = run_duly("runs", "payment", "--where", "amount<60", "--limit", "2", cwd=REPO_ROOT,
                     env=env)  # fmt: skip
    assert table.returncode == 0, table.stderr
    cursor = table.stdout.splitlines()[-1].split("--after ")[1]
    assert keys("--where", "amount<60", "--after", cursor) == by_amount([6, 12, 18, 24, 30])[2:]
    for where, message in [
        ("customer=c1", "customer is not an indexed column of payment"),
        ("since:soon", "'soon' is not a duration"),
        ("state:failed", "The state filter is given twice"),
    ]:
        done = run_duly("runs", "payment", "--where", where, "--state", "finished", cwd=REPO_ROOT,
                        env=env)  # fmt: skip
        assert done.returncode == 2, (where, done.stdout, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (where, done.stderr)


async def test_a_duration_past_the_calendar_is_refused_at_every_door(
    db: Database, tmp_path: Path
) -> None:
    Session = await filled(db)
    huge = "since:99999999999d"
    async with serving(create_app(Session, run_worker=False)) as client:
        api = await client.get(URL, params={"q": huge})
        relative = await client.get(URL, params={"q": "created_at>=-99999999999d"})
        console = await client.get("/console/runs/payment", params={"q": huge})
        bulk = await client.post(
            "/workflows/payment/bulk", json={"action": "cancel", "filter": {"q": huge}}
        )
    said = "'99999999999d' is longer than a search reaches back: at most 36500d."
    assert (api.status_code, relative.status_code, console.status_code) == (400, 400, 400)
    assert said in api.json()["detail"] and said in html.unescape(console.text)
    # A bulk body places its problems, as for every mistake in its `filter.q`.
    assert bulk.status_code == 422 and bulk.json()["detail"][0]["msg"] == said, bulk.text
    done = run_duly("runs", "payment", "--where", huge, cwd=REPO_ROOT, env=env_for(db, tmp_path))
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr
    ninety_nine_years = await client_keys(Session, "since:36135d")
    assert len(ninety_nine_years) == RUNS, "a long reach that fits is answered"


async def client_keys(Session: async_sessionmaker[AsyncSession], q: str) -> list[str]:
    async with serving(create_app(Session, run_worker=False)) as client:
        return await keys_of(client, q=q, limit=RUNS)


async def test_a_filter_read_and_a_page_listed_with_engine_s_names(db: Database) -> None:
    Session = await filled(db)
    async with connect_workflows(Session) as connection:
        info = find_workflow(connection, "payment")
        filters = parse_filter(info, "state:failed amount>=200")
        assert isinstance(filters, RunFilter)
        page = await list_runs(connection, info, filters, limit=100)
        everything = await list_runs(connection, info, limit=100)
    assert sorted(int(run.key) for run in page.runs) == failed_from(200)
    assert [run.key for run in everything.runs] == newest(list(ALL))


def test_the_readme_sends_its_readers_to_engine_alone() -> None:
    guide = (REPO_ROOT / "docs" / "how-to" / "workflows.md").read_text()
    assert "Everything is imported from `engine`" in guide
    # Public submodules only (`engine.testing`, `engine.dataclass`); the rest are private,
    # and what they hold is exported by `engine` (docs/api.md).
    named = set(re.findall(r"`(engine\.[a-z_]+)\.", guide))
    assert named <= {"engine.testing", "engine.dataclass"}
    assert {"find_workflow", "parse_filter", "RunFilter", "list_runs"} <= set(engine.__all__)
