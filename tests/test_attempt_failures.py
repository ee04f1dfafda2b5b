"""A failed attempt's traceback and arguments, kept in its own commit and shown where runs are read.

- a failing step's attempts keep their traceback (a configured secret and a URL's
  password scrubbed, from its error line and the worker's log too) and their
  arguments; one that succeeds keeps NULL for both; the API's run and history show
  them: test_the_api_shows_a_failed_attempts_traceback_and_arguments
- a huge message is cut to 8 KiB, its head and tail kept around a marked cut:
  test_a_huge_traceback_is_bounded_at_8_kib
- `duly show` prints the newest failed attempt's arguments and traceback under the
  history, `--failures` each one's: test_duly_show_prints_the_newest_failure
- once `duly prune --apply` deleted a finished run's attempts, `duly show` and the
  console say its history was pruned, not that it has no attempt yet:
  test_a_pruned_history_says_so
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import connect_workflows
from engine.testing import drain, move_clock
from engine.worker.failures import TRACEBACK_LIMIT
from functions.app import create_app
from tests.apps import failing
from tests.apps.failing import Payment
from tests.conftest import Database
from tests.helpers import REPO_ROOT, dev_env, run_duly, serving

TOKEN = "tok-" + "s3cret-value-" * 3  # the API token the failing step names in its error
CARD = {"holder": "Ada", "last4": "4242", "nested": [[["deep"]]]}


async def failed_payment(
    db: Database, monkeypatch: pytest.MonkeyPatch, message: str = ""
) -> async_sessionmaker[AsyncSession]:
    """Payment 1, its charge failed twice (retried, then given up) and logged."""
    monkeypatch.setenv("DULY_API_TOKEN", TOKEN)
    Session = await db.create(failing.Base.metadata)
    async with connect_workflows(Session, workflows=[Payment]):
        assert await Payment(id=1).start(Payment.charge(250, CARD, message=message))
    assert await drain(Session, [Payment]) == 1
    await move_clock(Session, timedelta(seconds=31))  # past the retry's backoff
    assert await drain(Session, [Payment]) == 1
    return Session


async def history_of(client: Any) -> list[dict[str, Any]]:
    response = await client.get(
        "/workflows/card_payment/runs/1", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert response.status_code == 200, response.text
    document = response.json()
    assert document["state"] == "failed"
    history: list[dict[str, Any]] = document["history"]
    return history


async def test_the_api_shows_a_failed_attempts_traceback_and_arguments(
    db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    Session = await failed_payment(db, monkeypatch)
    worker_lines = [r.getMessage() for r in caplog.records if r.name == "duly.worker"]
    assert len(worker_lines) == 2 and "Traceback (most recent call last)" in worker_lines[1]
    assert all(TOKEN not in line and "ledger-pass-7" not in line for line in worker_lines)
    async with serving(create_app(Session, run_worker=False)) as client:
        history = await history_of(client)
        listed = await client.get(
            "/runs/card_payment/1/history", headers={"Authorization": f"Bearer {TOKEN}"}
        )
    assert [a["outcome"] for a in history] == ["retry", "failed"]
    assert listed.json()["history"] == history  # the older path answers the same run
    for attempt in history:
        trace = attempt["traceback"]
        assert trace.startswith("Traceback (most recent call last):")
        assert "in charge" in trace  # the innermost frame: the step's body
        assert trace.rstrip().endswith(
            "ConnectionError: gateway refused 250 with token *** "
            "(ledger postgresql://ledger:***@db:5432/ledger)"
        )
        assert TOKEN not in trace and "ledger-pass-7" not in trace
        assert attempt["args"] == {"args": [250, CARD], "kwargs": {"message": ""}}

    # The run moves on: a step that succeeds logs NULL for both.
    async with connect_workflows(Session, workflows=[Payment]):
        assert await Payment.by(Payment.id == 1).run(Payment.refund(250)) == 1
    assert await drain(Session, [Payment]) == 1
    async with Session() as session:
        rows = (await session.execute(select(failing.Attempt).order_by(failing.Attempt.id))).all()
    ok = rows[-1][0]
    assert (ok.outcome, ok.traceback, ok.args) == ("ok", None, None)


async def test_a_huge_traceback_is_bounded_at_8_kib(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = "start-of-message " + "é" * 20_000 + " end-of-message"
    Session = await failed_payment(db, monkeypatch, message=message)
    async with serving(create_app(Session, run_worker=False)) as client:
        history = await history_of(client)
    for attempt in history:
        trace = attempt["traceback"]
        assert len(trace.encode()) <= TRACEBACK_LIMIT
        assert trace.startswith("Traceback (most recent call last):")
        assert " bytes cut …]" in trace
        assert trace.rstrip().endswith("é end-of-message")  # the exception line's tail
        assert TOKEN not in trace
        assert attempt["args"]["kwargs"]["message"] == message  # the arguments, whole


async def test_duly_show_prints_the_newest_failure(
    db: Database, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    await failed_payment(db, monkeypatch)
    env = dev_env(tmp_path / "pg", DULY_APP="tests.apps.failing", DULY_DATABASE_URL=db.url)
    shown = run_duly("show", "card_payment", "1", cwd=REPO_ROOT, env=env)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    history, _, failures = out.partition("\ncharge attempt ")
    assert "attempts, oldest first:" in history
    assert failures.startswith("2 (failed, ")
    [arguments] = [line for line in failures.splitlines() if line.startswith("  arguments: ")]
    assert json.loads(arguments.removeprefix("  arguments: ")) == {
        "args": [250, CARD],
        "kwargs": {"message": ""},
    }
    assert "  traceback:\n    Traceback (most recent call last):" in failures
    assert "ConnectionError: gateway refused 250 with token ***" in failures
    assert TOKEN not in out and "ledger-pass-7" not in out  # the last error's too
    assert "1 earlier failed attempts: --failures shows each" in out

    every = run_duly("show", "card_payment", "1", "--failures", cwd=REPO_ROOT, env=env).stdout
    assert every.count("  traceback:\n    Traceback (most recent call last):") == 2
    assert "charge attempt 1 (retry, " in every and "charge attempt 2 (failed, " in every
    assert "earlier failed attempts" not in every


async def test_a_pruned_history_says_so(
    db: Database, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    Session = await failed_payment(db, monkeypatch)
    env = dev_env(tmp_path / "pg", DULY_APP="tests.apps.failing", DULY_DATABASE_URL=db.url)
    await move_clock(Session, timedelta(days=31))  # past DULY_RETAIN_ATTEMPTS_DAYS' 30
    pruned = run_duly("prune", "--apply", cwd=REPO_ROOT, env=env)
    assert pruned.returncode == 0, pruned.stderr
    shown = run_duly("show", "card_payment", "1", cwd=REPO_ROOT, env=env).stdout
    assert "No attempt kept: this run is failed and its history was pruned." in shown
    assert "no attempt yet" not in shown.lower()
    async with serving(create_app(Session, run_worker=False)) as client:
        page = await client.get(
            "/console/runs/card_payment/1", headers={"Authorization": f"Bearer {TOKEN}"}
        )
    assert page.status_code == 200, page.text
    assert "this run is failed and its history was pruned" in page.text
