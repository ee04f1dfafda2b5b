"""`duly drain` and `duly replay-dead-letters` as an operator runs them: processes, a real database.

The app they load is tests/apps/outbox_cli_app.py (handlers registered at
import, no registry configured); events are published from the test, and
what the commands print and leave in the database is checked.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import DatabaseEventRegistry, EventSettings, WorkflowEvent, connect_workflows
from engine.testing import move_clock
from functions.cli import build_parser
from tests.apps import outbox
from tests.conftest import Database
from tests.helpers import REPO_ROOT, dev_env, run_duly, run_duly_on_terminal

APP = "tests.apps.outbox_cli_app"
BACKOFF = timedelta(seconds=30)  # past DULY_RETRY_BACKOFF_SECONDS x the attempts so far


def env_for(db: Database, tmp_path: Path, **more: str) -> dict[str, str]:
    """The command's environment: the app, the test's database, two drains before dead letter."""
    settings = {"DULY_APP": APP, "DULY_DATABASE_URL": db.url, "DULY_MAX_RETRIES": "2"}
    return dev_env(tmp_path / "pg", **(settings | more))


async def publish(Session: async_sessionmaker[AsyncSession], *events: WorkflowEvent) -> None:
    async with connect_workflows(Session, workflows=[outbox.Outbox]):
        registry = DatabaseEventRegistry(outbox=outbox.Outbox, settings=EventSettings())
        assert len(await registry.publish_many(events)) == len(events)


def statuses(db: Database) -> dict[str, str]:
    return {str(e): str(s) for e, s in db.sql("SELECT event_id, status FROM duly_outbox")}


def report(stdout: str) -> dict[str, int]:
    """The counts `duly drain` printed, by name."""
    routed = re.search(r"routed (\d+) of the (\d+) events due in duly_outbox\.", stdout)
    assert routed, stdout
    counts = {"routed": int(routed[1]), "due": int(routed[2])}
    for name in ("processed", "failed", "dead-lettered"):
        found = re.search(rf"^  {name} +(\d+)", stdout, re.MULTILINE)
        assert found, stdout
        counts[name] = int(found[1])
    return counts


async def test_drain_routes_what_is_due_and_replay_brings_dead_letters_back(
    db: Database, tmp_path: Path
) -> None:
    Session = await db.create(outbox.Base.metadata)
    placed = [
        WorkflowEvent("order.placed", "order_placed", {"order": n}, event_id=f"placed-{n}")
        for n in range(3)
    ]
    unnamed = WorkflowEvent("order.placed", "order_placed", {}, event_id="placed-unnamed")
    charged = WorkflowEvent("order.charged", "order_charged", {"order": 1}, event_id="charged-1")
    await publish(Session, *placed, unnamed, charged)

    first = run_duly("drain", cwd=REPO_ROOT, env=env_for(db, tmp_path))
    assert first.returncode == 0, first.stderr
    assert report(first.stdout) == {
        "routed": 5,
        "due": 5,
        "processed": 3,
        "failed": 1,
        "dead-lettered": 1,
    }
    assert "duly drain: 5 of 5 events routed" in first.stderr  # plain lines off a terminal
    assert "\r" not in first.stderr
    assert statuses(db) == {
        "placed-0": "processed",
        "placed-1": "processed",
        "placed-2": "processed",
        "placed-unnamed": "dead_letter",  # the validator refused it: no retry
        "charged-1": "failed",  # one failed drain of two allowed: due again later
    }
    runs = db.sql("SELECT event_id, handler FROM handler_runs ORDER BY event_id")
    assert runs == [("placed-0", "ship"), ("placed-1", "ship"), ("placed-2", "ship")]

    # Nothing is due until the backoff has passed: a drain now routes nothing.
    idle = run_duly("drain", cwd=REPO_ROOT, env=env_for(db, tmp_path))
    assert idle.returncode == 0, idle.stderr
    assert report(idle.stdout)["due"] == 0

    replayed = run_duly("replay-dead-letters", cwd=REPO_ROOT, env=env_for(db, tmp_path))
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 1 dead-lettered events in duly_outbox" in replayed.stdout
    assert statuses(db)["placed-unnamed"] == "pending"

    await move_clock(Session, BACKOFF)
    second = run_duly("drain", cwd=REPO_ROOT, env=env_for(db, tmp_path))
    assert second.returncode == 0, second.stderr
    # The charge fails its second drain (dead now); the unnamed order is refused again.
    assert report(second.stdout) == {
        "routed": 2,
        "due": 2,
        "processed": 0,
        "failed": 0,
        "dead-lettered": 2,
    }
    assert statuses(db)["charged-1"] == "dead_letter"

    chosen = run_duly(
        "replay-dead-letters",
        "charged-1",
        "no-such-event",
        cwd=REPO_ROOT,
        env=env_for(db, tmp_path),
    )
    assert chosen.returncode == 0, chosen.stderr
    assert "replayed 1 dead-lettered events" in chosen.stdout
    assert "not dead-lettered, or unknown: no-such-event" in chosen.stderr
    assert statuses(db)["charged-1"] == "pending"
    assert statuses(db)["placed-unnamed"] == "dead_letter"  # not chosen, not replayed

    fixed = run_duly("drain", cwd=REPO_ROOT, env=env_for(db, tmp_path, OUTBOX_CLI_FIXED="1"))
    assert fixed.returncode == 0, fixed.stderr
    assert report(fixed.stdout) == {
        "routed": 1,
        "due": 1,
        "processed": 1,
        "failed": 0,
        "dead-lettered": 0,
    }
    assert statuses(db)["charged-1"] == "processed"
    assert db.sql("SELECT handler FROM handler_runs WHERE event_id = 'charged-1'") == [("charge",)]
    deliveries = db.sql("SELECT status, attempts FROM duly_deliveries WHERE event_id = 'charged-1'")
    assert deliveries == [("succeeded", 3)]  # two failed drains, then the one that worked


async def test_drain_draws_a_progress_bar_on_a_terminal(db: Database, tmp_path: Path) -> None:
    Session = await db.create(outbox.Base.metadata)
    events = [
        WorkflowEvent("order.placed", "order_placed", {"order": n}, event_id=f"tty-{n}")
        for n in range(4)
    ]
    await publish(Session, *events)
    process, text = run_duly_on_terminal("drain", cwd=REPO_ROOT, env=env_for(db, tmp_path))
    assert process.returncode == 0, text
    assert report(process.stdout)["processed"] == 4
    assert "\rrouting [" in text
    assert text.rstrip().endswith(f"[{'#' * 30}] 4/4")


async def test_commands_refuse_what_they_cannot_run_with_a_sentence(
    db: Database, tmp_path: Path
) -> None:
    no_url = run_duly("drain", cwd=REPO_ROOT, env=dev_env(tmp_path / "pg", DULY_APP=APP))
    assert no_url.returncode == 2
    assert "duly drain needs the workflow database: pass --database-url" in no_url.stderr

    bad_url = run_duly(
        "replay-dead-letters",
        "--database-url",
        "mysql://nobody@localhost/app",
        cwd=REPO_ROOT,
        env=dev_env(tmp_path / "pg", DULY_APP=APP),
    )
    assert bad_url.returncode == 2
    assert "--database-url uses mysql://" in bad_url.stderr

    no_outbox = run_duly(
        "drain", cwd=REPO_ROOT, env=env_for(db, tmp_path, DULY_APP="tests.apps.chain")
    )
    assert no_outbox.returncode == 2
    assert "tests.apps.chain maps no outbox" in no_outbox.stderr

    no_handlers = run_duly(
        "drain", cwd=REPO_ROOT, env=env_for(db, tmp_path, DULY_APP="tests.apps.outbox")
    )
    assert no_handlers.returncode == 2
    assert "tests.apps.outbox registers no event handler" in no_handlers.stderr

    # The database has none of the app's tables yet.
    for command in ("drain", "replay-dead-letters"):
        missing = run_duly(command, cwd=REPO_ROOT, env=env_for(db, tmp_path))
        assert missing.returncode == 2, missing.stderr
        assert "Workflow tables missing from the database: duly_outbox." in missing.stderr
        assert "Traceback" not in missing.stderr

    # The URL given on the command line wins over DULY_DATABASE_URL.
    await db.create(outbox.Base.metadata)
    elsewhere = env_for(db, tmp_path, DULY_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none")
    given = run_duly("drain", "--database-url", db.url, cwd=REPO_ROOT, env=elsewhere)
    assert given.returncode == 0, given.stderr
    unreachable = run_duly("drain", cwd=REPO_ROOT, env=elsewhere)
    assert unreachable.returncode == 1
    assert unreachable.stderr.startswith("duly: the database refused or cannot be reached: ")


def test_the_parser_knows_the_outbox_commands() -> None:
    parser = build_parser()
    drain = parser.parse_args(["drain", "--database-url", "postgresql://h/db"])
    assert (drain.command.__name__, drain.database_url) == ("run_drain", "postgresql://h/db")
    replay = parser.parse_args(["replay-dead-letters", "a", "b"])
    assert (replay.command.__name__, replay.event_ids, replay.database_url) == (
        "run_replay",
        ["a", "b"],
        None,
    )
    assert parser.parse_args(["replay-dead-letters"]).event_ids == []
