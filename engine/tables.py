"""One call that maps the engine-owned tables on an application's base.

`declare_engine_tables(Base)` maps the event layer's three tables and the
attempt log (and, when asked, the durable executions', the rate buckets' and
the graph workflows' tables) as classes of `Base`, adds `duly_clock`,
`duly_seen_signatures` and `duly_console_sessions` to its metadata, and returns
the classes; `create_all` and Alembic see them as tables the application
declared itself.
"""

from __future__ import annotations

import importlib
import types
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import MetaData, Table
from sqlalchemy.orm import MappedAsDataclass

import engine.dataclass as dataclass_mixins
from engine.base.errors import ConfigurationError
from engine.base.owned_tables import declare_owned_tables
from engine.events.outbox import WorkflowOutbox
from engine.events.records import WorkflowDeliveryAttempt, WorkflowEventRecord
from engine.executions.durable import WorkflowExecutionRecord
from engine.model.attempt_log import AttemptLog
from engine.model.limits import RateBucket

if TYPE_CHECKING:
    from engine import GraphTables

DEFAULT_PREFIX = "duly_"
MAX_NAME_BYTES = 63  # PostgreSQL's longest identifier

EVENT = "event"
OUTBOX = "outbox"
DELIVERY = "delivery"
ATTEMPT_LOG = "attempt_log"
EXECUTION = "execution"
RATE_BUCKET = "rate_bucket"


@dataclass(frozen=True)
class _Role:
    """One table a part declares: the keyword that asks for it, and its name after the prefix."""

    part: str
    suffix: str


# In the order they are mapped; every name here can be given in `names`.
_ROLES: dict[str, _Role] = {
    EVENT: _Role("events", "events"),
    OUTBOX: _Role("events", "outbox"),
    DELIVERY: _Role("events", "deliveries"),
    ATTEMPT_LOG: _Role("attempts", "attempts"),
    EXECUTION: _Role("executions", "executions"),
    RATE_BUCKET: _Role("rate_buckets", "rate_buckets"),
}
# A mapped class is named after its mixin (WorkflowOutboxRow): a name the app's own classes
# in the base's module are unlikely to have, which SQLAlchemy's lookup by name wants unique.
CLASS_SUFFIX = "Row"
# The graph tables: their names are fixed, since they reference one another by name.
_GRAPH_ROLES: dict[str, str] = {
    "template": "GraphTemplate",
    "node": "GraphNode",
    "transition": "GraphTransition",
    "instance": "GraphInstance",
    "branch": "GraphBranch",
    "visit": "GraphVisit",
    "vote": "GraphVote",
    "history": "GraphHistory",
}
TIMER = "timer"

_declared: weakref.WeakKeyDictionary[type[Any], EngineTables] = weakref.WeakKeyDictionary()


@dataclass(frozen=True, eq=False)
class EngineTables:
    """The engine-owned classes one `declare_engine_tables` call mapped on a base.

    Reading a part the call left out raises ConfigurationError.
    """

    base: type[Any]
    clock: Table  # duly_clock, on the base's metadata
    classes: Mapping[str, type[Any]]  # by role ("outbox", "template", ...), in mapping order
    graph_classes: GraphTables | None = None

    @property
    def event(self) -> type[WorkflowEventRecord]:
        """The event records' class."""
        return cast("type[WorkflowEventRecord]", self._mapped(EVENT))

    @property
    def outbox(self) -> type[WorkflowOutbox]:
        """The outbox's class: give it to DatabaseEventRegistry(outbox=...)."""
        return cast("type[WorkflowOutbox]", self._mapped(OUTBOX))

    @property
    def delivery(self) -> type[WorkflowDeliveryAttempt]:
        """The delivery attempts' class."""
        return cast("type[WorkflowDeliveryAttempt]", self._mapped(DELIVERY))

    @property
    def attempt_log(self) -> type[AttemptLog]:
        """The attempt log's class."""
        return cast("type[AttemptLog]", self._mapped(ATTEMPT_LOG))

    @property
    def execution(self) -> type[WorkflowExecutionRecord]:
        """The durable executions' class."""
        return cast("type[WorkflowExecutionRecord]", self._mapped(EXECUTION))

    @property
    def rate_bucket(self) -> type[RateBucket]:
        """The rate limits' token buckets' class."""
        return cast("type[RateBucket]", self._mapped(RATE_BUCKET))

    @property
    def graphs(self) -> GraphTables:
        """The graph tables' classes: give them to GraphRuntime(...)."""
        if self.graph_classes is None:
            raise self._left_out("graphs")
        return self.graph_classes

    def __iter__(self) -> Iterator[type[Any]]:
        """Every class the call mapped, in mapping order."""
        return iter(self.classes.values())

    def _mapped(self, role: str) -> type[Any]:
        found = self.classes.get(role)
        if found is None:
            raise self._left_out(_ROLES[role].part)
        return found

    def _left_out(self, part: str) -> ConfigurationError:
        return ConfigurationError(
            f"declare_engine_tables({self.base.__name__}) left out the {part.replace('_', ' ')}"
            f" table(s): call it with {part}=True."
        )


def declare_engine_tables(
    base: type[Any],
    *,
    events: bool = True,
    attempts: bool = True,
    executions: bool = False,
    rate_buckets: bool = False,
    graphs: bool = False,
    graph_timers: bool = True,
    prefix: str = DEFAULT_PREFIX,
    names: Mapping[str, str] | None = None,
) -> EngineTables:
    """Map the engine-owned tables the app uses on `base`, and duly's own two; once per base.

    events: `{prefix}events`, `{prefix}outbox`, `{prefix}deliveries`; attempts:
    `{prefix}attempts`; executions: `{prefix}executions`; rate_buckets:
    `{prefix}rate_buckets`; graphs: the `duly_graph_*` tables (names fixed), with
    the timers' table unless graph_timers=False. `names` renames single tables by
    role (`{"attempt_log": "workflow_attempt"}`). A table may still be mapped by
    hand (to add a column, say): leave its part out here. Bad arguments raise
    ConfigurationError and map nothing.
    """
    parts = {
        "events": events,
        "attempts": attempts,
        "executions": executions,
        "rate_buckets": rate_buckets,
    }
    _check_base(base, events or executions or graphs)
    table_names = _table_names(base, parts, prefix, dict(names or {}))
    graph_mixins = _graph_mixins(graph_timers) if graphs else {}
    _check_free(base, [*table_names.values(), *(m.__tablename__ for m in graph_mixins.values())])

    dataclass_base = issubclass(base, MappedAsDataclass)
    classes: dict[str, type[Any]] = {}
    for role, table_name in table_names.items():
        classes[role] = _map(base, _mixin(role, dataclass_base), table_name)
    for role, mixin in graph_mixins.items():
        classes[role] = _map(base, mixin, None)
    declared = EngineTables(
        base=base,
        clock=declare_owned_tables(base.metadata),
        classes=classes,
        graph_classes=_graph_tables(classes) if graphs else None,
    )
    _declared[base] = declared
    return declared


def _check_base(base: type[Any], needs_plain_base: bool) -> None:
    if not isinstance(getattr(base, "metadata", None), MetaData) or not hasattr(base, "registry"):
        raise ConfigurationError(
            f"{getattr(base, '__name__', base)!r} is not a declarative base: pass the class "
            "your models subclass (class Base(DeclarativeBase))."
        )
    if base in _declared:
        raise ConfigurationError(
            f"declare_engine_tables({base.__name__}) was called before: call it once per base, "
            "with every part the app uses, and keep what it returns."
        )
    if needs_plain_base and issubclass(base, MappedAsDataclass):
        raise ConfigurationError(
            f"{base.__name__} is a MappedAsDataclass base: on it declare_engine_tables maps only "
            "the attempt log and the rate buckets (events=False, and no executions or graphs)."
        )


def _table_names(
    base: type[Any], parts: Mapping[str, bool], prefix: str, names: dict[str, str]
) -> dict[str, str]:
    """Each wanted role's table name: from `names`, else the prefix and the role's suffix."""
    for role in names:
        if role in _GRAPH_ROLES or role == TIMER:
            raise ConfigurationError(
                f"names={{{role!r}: ...}}: the graph tables' names are fixed (duly_graph_*), "
                "since they reference one another by name."
            )
        if role not in _ROLES:
            raise ConfigurationError(
                f"names={{{role!r}: ...}} names no engine table: the roles are {', '.join(_ROLES)}."
            )
        if not parts[_ROLES[role].part]:
            raise ConfigurationError(
                f"names={{{role!r}: ...}} renames a table the call leaves out: "
                f"{_ROLES[role].part}=False."
            )
    chosen = {
        role: names.get(role, f"{prefix}{spec.suffix}")
        for role, spec in _ROLES.items()
        if parts[spec.part]
    }
    for role, name in chosen.items():
        if not isinstance(name, str) or not name or len(name.encode()) > MAX_NAME_BYTES:
            raise ConfigurationError(
                f"The {role} table's name {name!r} on {base.__name__} is not a table name: "
                f"give 1 to {MAX_NAME_BYTES} bytes of text."
            )
    return chosen


def _check_free(base: type[Any], table_names: list[str]) -> None:
    """Refuse names given twice, or already mapped on the base's metadata."""
    seen: set[str] = set()
    for name in table_names:
        if name in seen:
            raise ConfigurationError(
                f"declare_engine_tables({base.__name__}) would map two tables named {name!r}: "
                "give them different names."
            )
        seen.add(name)
        if name in base.metadata.tables:
            raise ConfigurationError(
                f"{base.__name__} already maps a table named {name!r}: leave its part out of "
                "declare_engine_tables (or rename it with names=...) and keep your own class."
            )


def _mixin(role: str, dataclass_base: bool) -> type[Any]:
    if role == ATTEMPT_LOG:
        return dataclass_mixins.AttemptLog if dataclass_base else AttemptLog
    if role == RATE_BUCKET:
        return dataclass_mixins.RateBucket if dataclass_base else RateBucket
    return {
        EVENT: WorkflowEventRecord,
        OUTBOX: WorkflowOutbox,
        DELIVERY: WorkflowDeliveryAttempt,
        EXECUTION: WorkflowExecutionRecord,
    }[role]


# The graph layer is imported when an app asks for its tables, as `engine` imports its graph
# names when first asked for: a process that maps no graph never loads it.
GRAPH_TABLES_MODULE = "engine.graphs.tables"
GRAPH_TIMERS_MODULE = "engine.graphs.moves.timers"


def _graph_mixins(with_timers: bool) -> dict[str, type[Any]]:
    """The graph mixins by role, imported now."""
    tables = importlib.import_module(GRAPH_TABLES_MODULE)
    mixins = {role: getattr(tables, name) for role, name in _GRAPH_ROLES.items()}
    if with_timers:
        mixins[TIMER] = importlib.import_module(GRAPH_TIMERS_MODULE).GraphTimer
    return mixins


def _graph_tables(classes: Mapping[str, type[Any]]) -> GraphTables:
    graph_tables_class = importlib.import_module(GRAPH_TABLES_MODULE).GraphTables
    tables = graph_tables_class(
        **{role: classes[role] for role in _GRAPH_ROLES}, timer=classes.get(TIMER)
    )
    return cast("GraphTables", tables)


def _map(base: type[Any], mixin: type[Any], table_name: str | None) -> type[Any]:
    """A class of `base` and `mixin`, as `class MixinRow(Base, Mixin)` in the base's module."""
    name = f"{mixin.__name__}{CLASS_SUFFIX}"
    namespace: dict[str, Any] = {
        "__module__": base.__module__,
        "__qualname__": name,
        "__doc__": f"{mixin.__name__}, mapped on {base.__name__} by declare_engine_tables.",
    }
    if table_name is not None:
        namespace["__tablename__"] = table_name
    return types.new_class(name, (base, mixin), exec_body=lambda body: body.update(namespace))
