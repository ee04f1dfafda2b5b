"""Starting runs: one run per key, keys given back, bad input writes nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import func, inspect, select

from engine import NotConnectedError, StepError, connect_workflows
from engine.model.registry import ENGINE_COLUMNS
from tests.apps import behaviour
from tests.apps.behaviour import Flaky, Other, Signup, Timer
from tests.conftest import Database
from tests.helpers import fetch


async def count(Session, model) -> int:  # type: ignore[no-untyped-def]
    async with Session() as session:
        return int(await session.scalar(select(func.count()).select_from(model)) or 0)


async def test_start_inserts_the_row_with_its_first_step_and_gives_it_its_key(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Timer]):
        row = Timer(key="k1")
        assert await row.start(Timer.arm)
        assert row.id is not None
        stored = await fetch(Session, Timer, row.id)
        assert stored.next_step == "arm" and stored.next_args == {"args": [], "kwargs": {}}
        assert stored.wake_at is not None and stored.claimed_until is None
        assert stored.attempts == 0 and stored.wf_version == 0


async def test_a_row_that_hits_a_unique_constraint_starts_no_run(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Timer]):
        assert await Timer(key="same").start(Timer.arm)
        second = Timer(key="same")
        assert not await second.start(Timer.arm)
        assert second.id is None
        assert await count(Session, Timer) == 1


@pytest.mark.parametrize(
    "target",
    [
        lambda: Flaky.needs,  # a bare step that needs arguments
        lambda: Other.elsewhere,  # another workflow's step
    ],
    ids=["bare-step-needing-arguments", "another-workflows-step"],
)
async def test_bad_targets_are_refused_and_write_nothing(db: Database, target) -> None:  # type: ignore[no-untyped-def]
    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Flaky, Other]):
        with pytest.raises(StepError) as raised:
            await Flaky().start(target())
        assert "Flaky.needs" in str(raised.value) or "Other.elsewhere" in str(raised.value)
        assert await count(Session, Flaky) == 0


async def test_wrong_and_non_json_arguments_write_nothing(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Flaky]):
        with pytest.raises(TypeError, match=r"Flaky\.needs"):
            await Flaky().start(Flaky.needs("one", "two"))  # type: ignore[call-arg]
        with pytest.raises(TypeError, match=r"Flaky\.needs.*JSON"):
            await Flaky().start(Flaky.needs({1, 2}))  # type: ignore[arg-type]
        assert await count(Session, Flaky) == 0


async def test_start_without_a_connection_is_a_clear_error() -> None:
    with pytest.raises(NotConnectedError, match="connect_workflows"):
        await Timer().start(Timer.arm)


async def test_dataclass_models_take_the_same_engine(db: Database) -> None:
    Session = await db.create(behaviour.DataBase.metadata)
    async with connect_workflows(Session, workflows=[Signup]):
        row = Signup(email="x@example.com")
        assert await row.start(Signup.nudge)
        assert row.id is not None and row.next_step == "nudge"


def test_both_spellings_declare_the_same_engine_columns() -> None:
    def shape(model: type) -> dict[str, tuple[str, bool, str | None]]:
        table = inspect(model).local_table
        return {
            name: (
                str(table.c[name].type),
                table.c[name].nullable,
                str(table.c[name].server_default.arg) if table.c[name].server_default else None,
            )
            for name in ENGINE_COLUMNS
        }

    def columns(model: type) -> dict[str, tuple[str, bool]]:
        return {c.name: (str(c.type), bool(c.nullable)) for c in inspect(model).local_table.c}

    assert shape(Signup) == shape(Timer)
    assert columns(behaviour.SignupAttempt) == columns(behaviour.Attempt)
