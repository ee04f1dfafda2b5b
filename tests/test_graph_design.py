"""The designer's load, save and activation of graph templates (engine.graphs.design.document
and engine.graphs.design.versions), one test per rule of the designer's load, save and
versioning.

Save
- a save is version 1 of a new name, inactive and latest, its nodes ordered from 1 and
  its transitions by connection index: test_a_first_save_is_version_one_inactive_and_latest
- a second save is the next version, cloned from the latest, which stops being latest;
  vocabulary and description are copied when not given:
  test_a_second_save_is_the_next_version_cloned_from_the_latest
- a base template given is what the save clones, even when it is not the latest:
  test_a_given_base_template_is_the_one_cloned
- validation errors come back without blocking the save:
  test_validation_errors_are_returned_without_blocking_the_save
- the response is the designer's body, exactly: test_the_response_is_the_designers_body
- bad input is a ConfigurationError and writes nothing (no node, a repeated node id, a
  connection to a missing node, a long label, an unknown type or threshold, text for a
  number): test_bad_input_is_refused_and_writes_nothing
- an unknown base template is a NotFoundError and writes nothing:
  test_an_unknown_base_template_is_not_found_and_writes_nothing
- one transition per (source, target) pair, the first kept:
  test_duplicate_connections_collapse_to_the_first
- forks get their matched joins from the drawing: test_forks_get_their_matched_joins_on_save
- the design is stored as given, unknown node keys included, and the graph ignores them;
  state fields stay on states only: test_the_design_is_stored_as_given_and_extra_keys_ignored
- two concurrent saves of one name get distinct versions (the second waits for the
  first): test_concurrent_saves_of_a_name_get_distinct_versions
- forbidding self-approval is saved with the version, read into its graph, loaded
  back, and kept by a save that does not say: test_forbidding_self_approval_is_saved_and_loaded

Load
- the stored layout while it matches the graph (positions and designer keys kept), with
  the version's facts: test_load_returns_the_stored_layout_while_it_matches
- a rebuilt column layout after drift (a node row added, a state code changed, a
  transition dropped): test_load_rebuilds_the_layout_after_drift
- save -> load -> save gives the same graph: test_a_round_trip_gives_the_same_graph

Activation
- refused while invalid, with the errors, and nothing written:
  test_activation_is_refused_while_invalid_and_writes_nothing
- activation deactivates the other versions of the name, and active_template_id finds
  it: test_activation_deactivates_the_other_versions
- no active version is a NotFoundError: test_no_active_version_is_not_found

Listing
- every version, with its node count: test_list_templates_lists_every_version
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.base.errors import ConfigurationError, NotFoundError, TemplateInvalidError
from engine.graphs.design.model import Graph, read_graph
from engine.graphs.design.versions import (
    SavedDesign,
    activate_template,
    active_template_id,
    list_templates,
    load_design,
    save_design,
)
from engine.graphs.tables import JOIN, graph_tables
from tests.apps.graphs import Base
from tests.conftest import Database
from tests.helpers import sessions_waiting_for_a_lock, wait_until

TABLES = graph_tables(Base)
TEMPLATES = TABLES.table("template")
NODES = TABLES.table("node")
TRANSITIONS = TABLES.table("transition")
CONDITIONS = frozenset({"amount_over_1000"})
VOCABULARY = ["review", "finance", "legal", "approved", "closed"]


def node(key: str, node_type: str, **fields: Any) -> dict[str, Any]:
    """A designer node at a position of its own."""
    place = sum(map(ord, key))
    return {"id": key, "type": node_type, "name": key.title(), "x": place, "y": 2 * place, **fields}


def connection(source: str, target: str, **fields: Any) -> dict[str, Any]:
    return {"source": source, "target": target, **fields}


def expense_design(name: str = "expenses", **top: Any) -> dict[str, Any]:
    """A valid graph: review, a fork into finance and legal, join, a condition on amount."""
    nodes = [
        node("start", "start"),
        node("review", "state", stateCode="review", assigneeUserIds=["ann"]),
        node("split", "fork"),
        node("finance", "state", stateCode="finance", assigneeGroupIds=["finance"]),
        node("legal", "state", stateCode="legal", assigneeUserIds=["lee"], threshold="majority"),
        node("merge", "join"),
        node("large", "condition", condition="amount_over_1000"),
        node("approve", "state", stateCode="approved", assigneeUserIds=["cfo"], deadlineSeconds=60),
        node("end", "end"),
    ]
    connections = [
        connection("start", "review"),
        connection("review", "split", label="Send to finance and legal"),
        connection("split", "finance"),
        connection("split", "legal"),
        connection("finance", "merge"),
        connection("legal", "merge"),
        connection("merge", "large"),
        connection("large", "approve", conditionResult="true"),
        connection("large", "end", conditionResult="false"),
        connection("approve", "end", label="Approve", commentRequired=True),
        connection("approve", "review", label="Escalate", escalation=True),
    ]
    return {
        "name": name,
        "description": "Expense approval",
        "stateChoices": VOCABULARY,
        "nodes": nodes,
        "connections": connections,
        **top,
    }


def invalid_design(name: str = "expenses") -> dict[str, Any]:
    """A graph whose 'Closed' state has no assignees (the designer's example error)."""
    return {
        "name": name,
        "stateChoices": VOCABULARY,
        "nodes": [
            node("start", "start"),
            node("closed", "state", stateCode="closed"),
            node("end", "end"),
        ],
        "connections": [connection("start", "closed"), connection("closed", "end")],
    }


@pytest.fixture
async def engine(db: Database) -> AsyncIterator[AsyncEngine]:
    await db.create(Base.metadata)
    yield db.engine()


async def save(engine: AsyncEngine, body: Mapping[str, Any]) -> SavedDesign:
    async with engine.begin() as connection:
        return await save_design(connection, TABLES, body, CONDITIONS)


async def load(engine: AsyncEngine, template_id: uuid.UUID) -> dict[str, Any]:
    async with engine.begin() as connection:
        return await load_design(connection, TABLES, template_id)


async def graph_of(engine: AsyncEngine, template_id: uuid.UUID) -> Graph:
    async with engine.begin() as connection:
        return await read_graph(connection, TABLES, template_id)


async def versions(engine: AsyncEngine) -> list[dict[str, Any]]:
    """Every template row, by name and version."""
    async with engine.begin() as connection:
        rows = await connection.execute(
            select(TEMPLATES).order_by(TEMPLATES.c.name, TEMPLATES.c.version)
        )
        return [dict(row._mapping) for row in rows]


async def count_rows(engine: AsyncEngine) -> tuple[int, int, int]:
    async with engine.begin() as connection:
        counts = []
        for table in (TEMPLATES, NODES, TRANSITIONS):
            found = await connection.execute(select(func.count()).select_from(table))
            counts.append(found.scalar_one())
        return (counts[0], counts[1], counts[2])


def shape(graph: Graph) -> tuple[Any, ...]:
    """A graph without its ids: nodes and edges named by keys, to compare two versions."""
    key = {n.id: n.key for n in graph.nodes.values()}
    nodes = sorted(
        (
            n.key,
            n.node_type,
            n.name,
            n.order,
            n.state_code,
            n.approval_threshold,
            n.assignee_users,
            n.assignee_groups,
            n.condition,
            key.get(n.matched_join_id) if n.matched_join_id else None,
            n.deadline_seconds,
            n.assignment_template,
            n.notify_originator,
        )
        for n in graph.nodes.values()
    )
    edges = sorted(
        (
            key[e.source_id],
            key[e.target_id],
            e.label,
            e.order,
            e.condition,
            e.condition_result,
            e.comment_required,
            e.escalation,
        )
        for e in graph.edges
    )
    return (graph.name, graph.state_choices, nodes, edges)


def edges_by_key(graph: Graph) -> dict[tuple[str, str], Any]:
    return {(graph.node(e.source_id).key, graph.node(e.target_id).key): e for e in graph.edges}


# Save


async def test_a_first_save_is_version_one_inactive_and_latest(engine: AsyncEngine) -> None:
    saved = await save(engine, expense_design())

    [row] = await versions(engine)
    assert (row["id"], row["name"], row["version"]) == (saved.template_id, "expenses", 1)
    assert (row["is_latest"], row["is_active"], row["cloned_from"]) == (True, False, None)
    assert row["state_choices"] == VOCABULARY
    assert row["description"] == "Expense approval"
    graph = await graph_of(engine, saved.template_id)
    assert [n.key for n in sorted(graph.nodes.values(), key=lambda n: n.order)] == [
        "start", "review", "split", "finance", "legal", "merge", "large", "approve", "end",
    ]  # fmt: skip
    assert sorted(n.order for n in graph.nodes.values()) == list(range(1, 10))
    edges = edges_by_key(graph)
    assert edges["start", "review"].order == 0
    assert edges["approve", "review"].order == 10
    assert edges["large", "approve"].condition_result == "true"
    assert edges["approve", "end"].comment_required
    assert edges["approve", "review"].escalation
    legal = graph.by_key("legal")
    assert legal is not None and legal.approval_threshold == "majority"
    assert saved.errors == []


async def test_a_second_save_is_the_next_version_cloned_from_the_latest(
    engine: AsyncEngine,
) -> None:
    first = await save(engine, expense_design())
    body = expense_design()
    del body["stateChoices"], body["description"]
    second = await save(engine, body)

    assert (first.version, second.version) == (1, 2)
    one, two = await versions(engine)
    assert (one["is_latest"], two["is_latest"]) == (False, True)
    assert (one["is_active"], two["is_active"]) == (False, False)
    assert two["cloned_from"] == first.template_id
    assert two["state_choices"] == VOCABULARY  # copied from the base
    assert two["description"] == "Expense approval"
    assert second.errors == []


async def test_a_given_base_template_is_the_one_cloned(engine: AsyncEngine) -> None:
    first = await save(engine, expense_design(stateChoices=[*VOCABULARY, "extra"]))
    await save(engine, expense_design())
    body = expense_design(baseTemplateId=str(first.template_id))
    del body["stateChoices"]
    third = await save(engine, body)

    rows = await versions(engine)
    assert third.version == 3
    assert rows[2]["cloned_from"] == first.template_id
    assert rows[2]["state_choices"] == [*VOCABULARY, "extra"]
    assert [row["is_latest"] for row in rows] == [False, False, True]


async def test_validation_errors_are_returned_without_blocking_the_save(
    engine: AsyncEngine,
) -> None:
    saved = await save(engine, invalid_design())

    assert saved.errors == [
        "S16: 'Closed' has no assignees. Name at least one user or group who may move this state."
    ]
    assert [p.node_key for p in saved.problems] == ["closed"]
    assert await count_rows(engine) == (1, 3, 2)


async def test_the_response_is_the_designers_body(engine: AsyncEngine) -> None:
    await save(engine, expense_design())
    saved = await save(engine, invalid_design())

    assert saved.response() == {
        "success": True,
        "message": "Workflow saved successfully",
        "step_count": 3,
        "template_id": str(saved.template_id),
        "version": 2,
        "errors": [
            "S16: 'Closed' has no assignees. "
            "Name at least one user or group who may move this state."
        ],
    }


def _without_nodes(body: dict[str, Any]) -> None:
    body["nodes"] = []


def _repeated_id(body: dict[str, Any]) -> None:
    body["nodes"][2]["id"] = "review"


def _missing_target(body: dict[str, Any]) -> None:
    body["connections"].append(connection("review", "nowhere"))


def _long_label(body: dict[str, Any]) -> None:
    body["connections"][0]["label"] = "x" * 151


def _unknown_type(body: dict[str, Any]) -> None:
    body["nodes"][1]["type"] = "approval"


def _unknown_threshold(body: dict[str, Any]) -> None:
    body["nodes"][1]["threshold"] = "most"


def _text_for_a_number(body: dict[str, Any]) -> None:
    body["nodes"][1]["x"] = "12"


def _no_name(body: dict[str, Any]) -> None:
    body["name"] = "  "


def _text_for_self_approval(body: dict[str, Any]) -> None:
    body["forbidSelfApproval"] = "yes"


@pytest.mark.parametrize(
    ("spoil", "named"),
    [
        (_without_nodes, "nodes"),
        (_repeated_id, "'review' is used by more than one node"),
        (_missing_target, "names node 'nowhere'"),
        (_long_label, "connections.0.label"),
        (_unknown_type, "nodes.1.type"),
        (_unknown_threshold, "nodes.1.threshold"),
        (_text_for_a_number, "nodes.1.x"),
        (_no_name, "name"),
        (_text_for_self_approval, "forbidSelfApproval"),
    ],
)
async def test_bad_input_is_refused_and_writes_nothing(
    engine: AsyncEngine, spoil: Any, named: str
) -> None:
    await save(engine, expense_design())
    before = await count_rows(engine)
    body = expense_design()
    spoil(body)

    async with engine.begin() as connection:  # committed: a partial write would stay
        with pytest.raises(ConfigurationError, match="The workflow design is not valid") as bad:
            await save_design(connection, TABLES, body, CONDITIONS)
    assert named in str(bad.value)
    assert await count_rows(engine) == before
    assert [row["is_latest"] for row in await versions(engine)] == [True]


async def test_an_unknown_base_template_is_not_found_and_writes_nothing(
    engine: AsyncEngine,
) -> None:
    await save(engine, expense_design())
    async with engine.begin() as connection:
        with pytest.raises(NotFoundError):
            await save_design(
                connection,
                TABLES,
                expense_design(baseTemplateId=str(uuid.uuid4())),
                CONDITIONS,
            )
    assert await count_rows(engine) == (1, 9, 11)
    assert [row["is_latest"] for row in await versions(engine)] == [True]


async def test_duplicate_connections_collapse_to_the_first(engine: AsyncEngine) -> None:
    body = expense_design()
    body["connections"].insert(1, connection("start", "review", label="the second"))
    body["connections"].append(connection("approve", "end", label="again"))
    saved = await save(engine, body)

    graph = await graph_of(engine, saved.template_id)
    edges = edges_by_key(graph)
    assert len(graph.edges) == 11
    assert edges["start", "review"].label == ""
    assert edges["approve", "end"].label == "Approve"
    assert sorted(e.order for e in graph.edges) == list(range(11))
    [row] = await versions(engine)
    assert len(row["design"]["connections"]) == 11
    assert saved.errors == []


async def test_forks_get_their_matched_joins_on_save(engine: AsyncEngine) -> None:
    saved = await save(engine, expense_design())

    graph = await graph_of(engine, saved.template_id)
    fork, join = graph.by_key("split"), graph.by_key("merge")
    assert fork is not None and join is not None and join.node_type == JOIN
    assert fork.matched_join_id == join.id
    assert saved.graph.by_key("split").matched_join_id == join.id  # type: ignore[union-attr]


async def test_the_design_is_stored_as_given_and_extra_keys_ignored(engine: AsyncEngine) -> None:
    body = expense_design()
    body["nodes"][1]["color"] = "#ffcc00"
    body["nodes"][1]["ports"] = {"in": [1], "out": [2]}
    body["nodes"][2]["stateCode"] = "review"  # a leftover on a fork: not kept
    body["connections"][0]["vertices"] = [{"x": 1, "y": 2}]
    saved = await save(engine, body)

    [row] = await versions(engine)
    assert row["design"] == {
        "nodes": body["nodes"],
        "connections": body["connections"],
        "submitters": "any",  # who may submit: anyone, as no save said otherwise
    }
    graph = await graph_of(engine, saved.template_id)
    fork = graph.by_key("split")
    assert fork is not None and fork.state_code is None
    assert saved.errors == []


async def test_concurrent_saves_of_a_name_get_distinct_versions(engine: AsyncEngine) -> None:
    async with engine.connect() as first, engine.connect() as second:
        await first.begin()
        await second.begin()
        one = await save_design(first, TABLES, expense_design(), CONDITIONS)
        racing = asyncio.create_task(save_design(second, TABLES, expense_design(), CONDITIONS))
        await wait_until(lambda: sessions_waiting_for_a_lock(engine))
        assert not racing.done()  # waiting for the first save's lock on the name
        await first.commit()
        two = await racing
        await second.commit()

    assert (one.version, two.version) == (1, 2)
    rows = await versions(engine)
    assert [(r["version"], r["is_latest"]) for r in rows] == [(1, False), (2, True)]
    assert rows[1]["cloned_from"] == one.template_id


async def test_forbidding_self_approval_is_saved_and_loaded(engine: AsyncEngine) -> None:
    plain = await save(engine, expense_design())
    forbidding = await save(engine, expense_design(forbidSelfApproval=True))
    kept = await save(engine, expense_design())  # not said: as the version it is based on
    allowed = await save(engine, expense_design(forbid_self_approval=False))

    rows = await versions(engine)
    assert [row["forbid_self_approval"] for row in rows] == [False, True, True, False]
    assert (await graph_of(engine, plain.template_id)).forbid_self_approval is False
    assert (await graph_of(engine, forbidding.template_id)).forbid_self_approval is True
    assert forbidding.graph.forbid_self_approval is True
    assert (await load(engine, kept.template_id))["forbid_self_approval"] is True
    assert (await load(engine, allowed.template_id))["forbid_self_approval"] is False


# Load


async def test_load_returns_the_stored_layout_while_it_matches(engine: AsyncEngine) -> None:
    first = await save(engine, expense_design())
    body = expense_design()
    body["nodes"][1]["color"] = "#ffcc00"
    body["nodes"][1]["zIndex"] = 7
    saved = await save(engine, body)

    loaded = await load(engine, saved.template_id)

    assert [(n["id"], n["x"], n["y"]) for n in loaded["nodes"]] == [
        (n["id"], n["x"], n["y"]) for n in body["nodes"]
    ]
    review = loaded["nodes"][1]
    assert (review["color"], review["zIndex"]) == ("#ffcc00", 7)
    assert review["stateCode"] == "review" and review["assigneeUserIds"] == ["ann"]
    assert [(c["source"], c["target"]) for c in loaded["connections"]] == [
        (c["source"], c["target"]) for c in body["connections"]
    ]
    assert {k: v for k, v in loaded.items() if k not in ("nodes", "connections")} == {
        "workflow_kind": "state_based",
        "name": "expenses",
        "description": "Expense approval",
        "state_choices": VOCABULARY,
        "forbid_self_approval": False,
        "submitters": "any",
        "version": 2,
        "is_latest": True,
        "is_active": False,
        "template_id": str(saved.template_id),
        "cloned_from_version": first.version,
    }


async def _add_a_node(engine: AsyncEngine, template_id: uuid.UUID) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            insert(NODES).values(
                id=uuid.uuid4(), template_id=template_id, key="extra", node_type="end", order=10
            )
        )


async def _change_a_state_code(engine: AsyncEngine, template_id: uuid.UUID) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            update(NODES)
            .where(NODES.c.template_id == template_id, NODES.c.key == "approve")
            .values(state_code="closed")
        )


async def _drop_a_transition(engine: AsyncEngine, template_id: uuid.UUID) -> None:
    graph = await graph_of(engine, template_id)
    edge = edges_by_key(graph)["approve", "review"]
    async with engine.begin() as connection:
        await connection.execute(delete(TRANSITIONS).where(TRANSITIONS.c.id == edge.id))


@pytest.mark.parametrize("drift", [_add_a_node, _change_a_state_code, _drop_a_transition])
async def test_load_rebuilds_the_layout_after_drift(engine: AsyncEngine, drift: Any) -> None:
    saved = await save(engine, expense_design())
    await drift(engine, saved.template_id)
    graph = await graph_of(engine, saved.template_id)

    loaded = await load(engine, saved.template_id)

    ordered = sorted(graph.nodes.values(), key=lambda n: n.order)
    assert [(n["id"], n["x"], n["y"], n["zIndex"]) for n in loaded["nodes"]] == [
        (n.key, 360, 60 + index * 170, index + 1) for index, n in enumerate(ordered)
    ]
    keys = {n.key for n in graph.nodes.values()}
    assert len(loaded["connections"]) == len(graph.edges)
    assert all(c["source"] in keys and c["target"] in keys for c in loaded["connections"])
    by_id = {n["id"]: n for n in loaded["nodes"]}
    assert by_id["approve"]["stateCode"] == graph.by_key("approve").state_code  # type: ignore[union-attr]
    assert by_id["large"]["condition"] == "amount_over_1000"


async def test_a_round_trip_gives_the_same_graph(engine: AsyncEngine) -> None:
    first = await save(engine, expense_design())
    second = await save(engine, await load(engine, first.template_id))
    one, two = await graph_of(engine, first.template_id), await graph_of(engine, second.template_id)
    assert shape(one) == shape(two)
    assert second.errors == []

    # A rebuilt layout round-trips as well.
    await _add_a_node(engine, second.template_id)
    third = await save(engine, await load(engine, second.template_id))
    three = await graph_of(engine, third.template_id)
    extra = ("extra", "end", "", 10, None, "single", (), (), None, None, None, None, False)
    assert shape(three)[2] == sorted([*shape(one)[2], extra])
    assert shape(three)[3] == shape(one)[3]


# Activation


async def test_activation_is_refused_while_invalid_and_writes_nothing(
    engine: AsyncEngine,
) -> None:
    valid = await save(engine, expense_design())
    async with engine.begin() as connection:
        await activate_template(connection, TABLES, valid.template_id, CONDITIONS)
    invalid = await save(engine, invalid_design())

    async with engine.begin() as connection:  # committed: a partial write would stay
        with pytest.raises(TemplateInvalidError) as refused:
            await activate_template(connection, TABLES, invalid.template_id, CONDITIONS)

    assert refused.value.errors == tuple(invalid.errors)
    assert refused.value.code == "TEMPLATE_INVALID"
    assert "'expenses' version 2 cannot be activated" in str(refused.value)
    assert [r["is_active"] for r in await versions(engine)] == [True, False]


async def test_activation_deactivates_the_other_versions(engine: AsyncEngine) -> None:
    first = await save(engine, expense_design())
    second = await save(engine, expense_design())
    other = await save(engine, expense_design(name="other"))
    async with engine.begin() as connection:
        await activate_template(connection, TABLES, first.template_id, CONDITIONS)
        await activate_template(connection, TABLES, other.template_id, CONDITIONS)

    async with engine.begin() as connection:
        graph = await activate_template(connection, TABLES, second.template_id, CONDITIONS)
        assert await active_template_id(connection, TABLES, "expenses") == second.template_id

    assert graph.is_active and graph.template_id == second.template_id
    rows = await versions(engine)
    assert [(r["name"], r["version"], r["is_active"]) for r in rows] == [
        ("expenses", 1, False),
        ("expenses", 2, True),
        ("other", 1, True),  # another name keeps its active version
    ]


async def test_no_active_version_is_not_found(engine: AsyncEngine) -> None:
    await save(engine, expense_design())
    async with engine.begin() as connection:
        with pytest.raises(NotFoundError, match="'expenses'"):
            await active_template_id(connection, TABLES, "expenses")


# Listing


async def test_list_templates_lists_every_version(engine: AsyncEngine) -> None:
    first = await save(engine, expense_design())
    second = await save(engine, invalid_design())
    async with engine.begin() as connection:
        await activate_template(connection, TABLES, first.template_id, CONDITIONS)
        listed = await list_templates(connection, TABLES)

    assert [{k: v for k, v in item.items() if k != "created_at"} for item in listed] == [
        {
            "id": str(first.template_id),
            "name": "expenses",
            "version": 1,
            "is_latest": False,
            "is_active": True,
            "cloned_from": None,
            "node_count": 9,
        },
        {
            "id": str(second.template_id),
            "name": "expenses",
            "version": 2,
            "is_latest": True,
            "is_active": False,
            "cloned_from": str(first.template_id),
            "node_count": 3,
        },
    ]
    assert all(isinstance(item["created_at"], str) for item in listed)
