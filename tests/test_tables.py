"""declare_engine_tables: the engine-owned tables mapped on an app's base in one call.

- by default the event layer's three tables and the attempt log, `duly_`-prefixed, and
  `duly_clock`; classes named after their mixins, in the base's module:
  test_the_default_parts_and_names
- a prefix and single names override the tables' names; the graph tables' stay fixed:
  test_a_prefix_and_names_override_the_table_names
- parts left out are not mapped, and reading one says how to ask for it:
  test_parts_left_out_are_not_mapped
- a table mapped by hand beside the call (an extra column) keeps working:
  test_a_table_mapped_by_hand_sits_beside_the_call
- bad input (twice on one base, unknown or fixed names, a name taken or too long, a
  dataclass base with events, not a base) is a ConfigurationError that maps nothing:
  test_bad_input_is_refused_and_maps_nothing
- the classes it returns publish an event and drain it through its route:
  test_the_returned_outbox_publishes_and_drains
- an app of graph tables and a subject only (no workflow, no timer on its base), its
  schema created from that base alone, submits an instance: the call declares
  `duly_clock`: test_graph_tables_and_a_subject_alone_submit_an_instance
- the graph timers' table comes with the graphs and takes a deadline's timer:
  test_the_graph_timers_table_takes_a_deadline
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import String, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedAsDataclass, mapped_column

from engine import (
    AttemptLog,
    ConfigurationError,
    DatabaseEventRegistry,
    EngineTables,
    EventSettings,
    GraphRuntime,
    GraphSubject,
    WorkflowEvent,
    configure_event_registry,
    connect_workflows,
    declare_engine_tables,
    graph_tables,
)
from engine.graphs.tables import END, START, STATE
from engine.model.connection import session_engine
from engine.model.registry import registered_workflows
from engine.testing import drain
from tests.conftest import Database
from tests.graph_helpers import graph_of, stored

EVENT_TYPE = "parcel.sent"
handled: list[str] = []  # event ids the route below was called for


def record(event: WorkflowEvent) -> None:
    handled.append(event.event_id)


class EventsBase(DeclarativeBase):
    """An app whose engine tables are the default parts under a prefix of its own."""


EVENTS = declare_engine_tables(EventsBase, prefix="parcel_")
events_registry = DatabaseEventRegistry(
    outbox=EVENTS.outbox, settings=EventSettings(mode="production", async_delivery=True)
)
events_registry.register(EVENT_TYPE, record)


class SubjectBase(DeclarativeBase):
    """Graph tables and a subject, and nothing else: no workflow maps the clock here."""


GRAPHS_ONLY = declare_engine_tables(
    SubjectBase, events=False, attempts=False, graphs=True, graph_timers=False
)


class Ticket(SubjectBase, GraphSubject):
    __tablename__ = "tables_tickets"

    id: Mapped[int] = mapped_column(primary_key=True)


class TimedBase(DeclarativeBase):
    """Graph tables with their timers, and a subject."""


TIMED = declare_engine_tables(TimedBase, events=False, attempts=False, graphs=True)


class TimedTicket(TimedBase, GraphSubject):
    __tablename__ = "tables_timed_tickets"

    id: Mapped[int] = mapped_column(primary_key=True)


REVIEW_NODES: dict[str, Any] = {"start": START, "review": (STATE, "review", ["ann"]), "end": END}
REVIEW_EDGES: list[Any] = [("start", "review"), ("review", "end")]


@pytest.fixture
def routes() -> Iterator[None]:
    handled.clear()
    configure_event_registry(events_registry)
    yield
    configure_event_registry(None)


def fresh_base() -> type[DeclarativeBase]:
    class Base(DeclarativeBase):
        pass

    return Base


def test_the_default_parts_and_names() -> None:
    Base = fresh_base()

    class Event(Base):  # type: ignore[misc, valid-type]
        """An app's own class of a common name: the mapped classes' names do not clash."""

        __tablename__ = "calendar_events"
        id: Mapped[int] = mapped_column(primary_key=True)

    tables = declare_engine_tables(Base)
    assert sorted(Base.metadata.tables) == [
        "calendar_events",
        "duly_attempts",
        "duly_audit",
        "duly_clock",
        "duly_console_sessions",
        "duly_deliveries",
        "duly_events",
        "duly_outbox",
        "duly_seen_signatures",
    ]
    assert [cls.__name__ for cls in tables] == [
        "WorkflowEventRecordRow",
        "WorkflowOutboxRow",
        "WorkflowDeliveryAttemptRow",
        "AttemptLogRow",
    ]
    assert tables.outbox.__table__.name == "duly_outbox"  # type: ignore[attr-defined]
    assert tables.clock is Base.metadata.tables["duly_clock"]
    # Each class is the app's own, as if written `class WorkflowOutboxRow(Base, WorkflowOutbox)`.
    assert all(issubclass(cls, Base) and cls.__module__ == __name__ for cls in tables)


def test_a_prefix_and_names_override_the_table_names() -> None:
    Base = fresh_base()
    tables = declare_engine_tables(
        Base,
        executions=True,
        rate_buckets=True,
        graphs=True,
        prefix="shop_",
        names={"attempt_log": "shop_history", "outbox": "shop_mailbox"},
    )
    assert sorted(name for name in Base.metadata.tables if not name.startswith("duly_")) == [
        "shop_deliveries",
        "shop_events",
        "shop_executions",
        "shop_history",
        "shop_mailbox",
        "shop_rate_buckets",
    ]
    assert tables.outbox.__table__.name == "shop_mailbox"  # type: ignore[attr-defined]
    assert tables.graphs.table("instance").name == "duly_graph_instances"
    assert tables.graphs.timer is not None
    assert tables.graphs.timer.__table__.name == "duly_graph_timers"
    # graph_tables(Base) finds the same classes the call returned.
    assert graph_tables(Base) == tables.graphs


def test_parts_left_out_are_not_mapped() -> None:
    Base = fresh_base()
    tables = declare_engine_tables(Base, events=False, names={"attempt_log": "audit"})
    assert sorted(Base.metadata.tables) == [
        "audit",
        "duly_audit",
        "duly_clock",
        "duly_console_sessions",
        "duly_seen_signatures",
    ]
    assert tables.attempt_log.__table__.name == "audit"  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match=r"left out the events table\(s\).*events=True"):
        _ = tables.outbox
    with pytest.raises(ConfigurationError, match="graphs=True"):
        _ = tables.graphs


def test_a_table_mapped_by_hand_sits_beside_the_call() -> None:
    Base = fresh_base()

    class Attempt(Base, AttemptLog):  # type: ignore[misc, valid-type]
        __tablename__ = "duly_attempts"
        host: Mapped[str | None] = mapped_column(String, default=None)

    tables = declare_engine_tables(Base, attempts=False)
    assert "host" in Base.metadata.tables["duly_attempts"].c
    assert [cls.__name__ for cls in tables] == [
        "WorkflowEventRecordRow",
        "WorkflowOutboxRow",
        "WorkflowDeliveryAttemptRow",
    ]


class DataBase(MappedAsDataclass, DeclarativeBase):
    pass


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"names": {"outbx": "x"}}, "names no engine table: the roles are event, outbox"),
        ({"names": {"template": "x"}}, "graph tables' names are fixed"),
        ({"events": False, "names": {"outbox": "x"}}, "renames a table the call leaves out"),
        ({"names": {"outbox": "o" * 64}}, "is not a table name"),
        ({"names": {"outbox": ""}}, "is not a table name"),
        ({"names": {"outbox": "duly_events"}}, "two tables named 'duly_events'"),
        ({"names": {"event": "taken"}}, "already maps a table named 'taken'"),
        ({"graphs": True, "names": {"event": "duly_graph_votes"}}, "two tables named"),
    ],
)
def test_bad_input_is_refused_and_maps_nothing(arguments: dict[str, Any], message: str) -> None:
    Base = fresh_base()

    class Taken(Base):  # type: ignore[misc, valid-type]
        __tablename__ = "taken"
        id: Mapped[int] = mapped_column(primary_key=True)

    mapped_before = len(Base.registry.mappers)
    with pytest.raises(ConfigurationError, match=message):
        declare_engine_tables(Base, **arguments)
    assert sorted(Base.metadata.tables) == ["taken"]
    assert len(Base.registry.mappers) == mapped_before
    declare_engine_tables(Base)  # refused, it took nothing: the right call still works


def test_twice_on_one_base_and_bases_it_cannot_use_are_refused() -> None:
    Base = fresh_base()
    declare_engine_tables(Base)
    before = sorted(Base.metadata.tables)
    with pytest.raises(ConfigurationError, match="was called before: call it once per base"):
        declare_engine_tables(Base, events=False)
    assert sorted(Base.metadata.tables) == before
    with pytest.raises(ConfigurationError, match="MappedAsDataclass base"):
        declare_engine_tables(DataBase)
    assert DataBase.metadata.tables == {}
    with pytest.raises(ConfigurationError, match="is not a declarative base"):
        declare_engine_tables(object)
    # A dataclass base takes the attempt log and the rate buckets, as dataclass mixins.
    Data = type("Data", (MappedAsDataclass, DeclarativeBase), {})
    data = declare_engine_tables(Data, events=False, rate_buckets=True)
    assert sorted(Data.metadata.tables) == [
        "duly_attempts",
        "duly_audit",
        "duly_clock",
        "duly_console_sessions",
        "duly_rate_buckets",
        "duly_seen_signatures",
    ]
    assert data.rate_bucket.__init__.__code__.co_argcount == 1  # engine rows: nothing to pass


async def test_the_returned_outbox_publishes_and_drains(db: Database, routes: None) -> None:
    Session = await db.create(EventsBase.metadata)
    async with Session() as session:
        event = WorkflowEvent(EVENT_TYPE, "sent", {"parcel": 7})
        await events_registry.publish(event, session=session)
        await session.commit()
    assert await drain(Session, [EVENTS.outbox]) == 1
    async with Session() as session:
        statuses = (await session.scalars(select(EVENTS.outbox.status))).all()
        delivered = (await session.scalars(select(EVENTS.delivery.status))).all()
        recorded = await session.scalar(select(func.count()).select_from(EVENTS.event))
    assert handled == [event.event_id]
    assert (statuses, delivered, recorded) == (["processed"], ["succeeded"], 1)


async def submit_one(Session: Any, tables: EngineTables, subject: Any, nodes: Any) -> Any:
    """Store `nodes` as the active graph "g", add `subject`, and submit it: the instance."""
    async with session_engine(Session).begin() as conn:
        await stored(conn, tables.graphs, graph_of(nodes, REVIEW_EDGES, name="g"))
    async with Session() as session:
        session.add(subject)
        await session.commit()
    runtime = GraphRuntime(tables.graphs, engine=session_engine(Session))
    return await runtime.submit(subject, "sam", template_name="g")


async def test_graph_tables_and_a_subject_alone_submit_an_instance(db: Database) -> None:
    # The premise: nothing on this base is a workflow, so only the call declares the clock.
    assert not any(info.table.metadata is SubjectBase.metadata for info in registered_workflows())
    assert "duly_clock" in SubjectBase.metadata.tables
    Session = await db.create(SubjectBase.metadata)  # this base's schema and nothing else
    instance = await submit_one(Session, GRAPHS_ONLY, Ticket(id=1), REVIEW_NODES)
    assert instance.state_code == "review"
    async with Session() as session:
        found = await session.get(Ticket, 1)
        assert found is not None and found.workflow_state == "review"


async def test_the_graph_timers_table_takes_a_deadline(db: Database) -> None:
    Session = await db.create(TimedBase.metadata)
    nodes = {**REVIEW_NODES, "review": {"type": STATE, "state_code": "review",
             "assignee_users": ["ann"], "deadline_seconds": 3600}}  # fmt: skip
    async with connect_workflows(Session):
        instance = await submit_one(Session, TIMED, TimedTicket(id=1), nodes)
    timer = TIMED.graphs.timer
    assert timer is not None
    async with Session() as session:
        timers = (await session.scalars(select(timer.instance_id))).all()
    assert timers == [instance.id]
