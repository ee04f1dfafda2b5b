"""Branches, forks and joins, and the other dispatch paths, rule by rule.

- a fork completes the arriving branch at the fork and starts one child per
  outgoing edge, sharing a fresh fork_scope, each with its parent, fork and
  matched join; children on states get visits, votes and notifications; an
  ASSIGNMENT lists them with fork_scope, fork_node, join_node and targets:
  test_a_fork_starts_one_child_per_edge
- the subject's state is the oldest active branch's (started_at, number):
  the same test, and test_the_join_waits_for_the_last_branch_then_continues
- a join completes each arriving branch and waits while its scope has an
  active branch; the last arrival merges them into a branch that inherits the
  parent's scope chain and continues through the join's one edge
  ("continued automatically"): test_the_join_waits_for_the_last_branch_then_continues
- a fork needs at least two outgoing edges: test_a_fork_with_one_edge_is_refused
- the parent completed at the fork is no longer active: test_the_forked_parent_cannot_move
- a branch may end at END instead of its join: the join still fires when the
  other branch arrives: test_a_branch_ending_at_end_lets_the_join_fire_on_the_next_arrival
- ... and when it ends after the others arrived, it releases the join:
  test_a_branch_ending_at_end_after_the_arrivals_releases_the_join
- nested forks: the inner join's merged branch restores the outer scope, and
  the outer join fires once everything is in: test_a_nested_join_restores_the_outer_scope
- the outer join waits for branches of a fork nested inside its scope (by
  scope uuid and parents, never by node): test_the_outer_join_waits_for_a_nested_fork
- a fork fired again (a loop) has a fresh scope, and its join fires once per
  firing: test_a_fork_fired_again_has_a_fresh_scope
- a join with other than one outgoing edge keeps the merged branch at the
  join, with a visit, the subject's state kept: test_a_join_without_one_edge_waits_there
- a condition reached by a move routes on its predicate (subject row and
  instance mapping): test_a_condition_routes_on_its_predicate
- a condition without a registered predicate, and a node of no known type,
  refuse the move and write nothing: test_an_undecidable_node_refuses_the_move
- a move to an END ends the branch and finishes the instance in the last
  business state: test_graph_runtime.test_an_end_finalizes_the_instance
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from engine.base.errors import StateWorkflowError
from engine.graphs.design.model import Graph
from engine.graphs.moves.conditions import ConditionRegistry
from engine.graphs.moves.snapshots import InstanceSnapshot
from engine.graphs.tables import CONDITION, END, FORK, JOIN, START, STATE
from tests.apps import graphs as app
from tests.conftest import Database
from tests.graph_helpers import FORKED, FORKED_EDGES, graph_of
from tests.graph_world import World, make_world, node_id, only_branch


def is_large(claim: app.Claim, instance: Mapping[str, Any]) -> bool:
    return bool(claim.amount > 1000) and instance["subject_type"] == "claims"


@pytest.fixture
async def world(db: Database) -> AsyncIterator[World]:
    conditions = ConditionRegistry()
    conditions.register("large", is_large)
    async for made in make_world(db, conditions=conditions):
        yield made


async def start(
    world: World, nodes: Any = None, edges: Any = None, amount: str = "10"
) -> tuple[Graph, app.Claim, InstanceSnapshot]:
    graph = await world.store(graph_of(nodes or FORKED, edges or FORKED_EDGES, name="forked"))
    claim = await world.claim(amount)
    return graph, claim, await world.runtime.submit(claim, "sam", template_name="forked")


async def move(
    world: World, instance_id: uuid.UUID, graph: Graph, source: str, target: str, user: str
) -> InstanceSnapshot:
    """Move the active branch on `source` to `target`."""
    current = await world.runtime.instance(instance_id)
    [branch] = [b for b in current.branches if b.node_id == node_id(graph, source)]
    outcome = await world.runtime.transition_branch(
        instance_id, branch.id, node_id(graph, target), user
    )
    assert outcome.moved
    return outcome.instance


def on(instance: InstanceSnapshot) -> list[str | None]:
    return [b.node_key for b in instance.branches]


async def test_a_fork_starts_one_child_per_edge(world: World) -> None:
    graph, claim, instance = await start(world)
    parent = only_branch(instance)
    forked = await move(world, instance.id, graph, "draft", "fork", "ann")
    legal, finance = forked.branches
    assert (legal.node_key, finance.node_key) == ("legal", "finance")
    assert (legal.number, finance.number) == (2, 3)
    assert legal.fork_scope is not None and legal.fork_scope == finance.fork_scope
    for child in (legal, finance):
        assert (child.parent_branch_id, child.fork_node_id, child.join_node_id) == (
            parent,
            node_id(graph, "fork"),
            node_id(graph, "join"),
        )
    [parent_row] = await world.rows(app.Branch, app.Branch.id == parent)
    assert (parent_row.status, parent_row.current_node_id) == ("completed", node_id(graph, "fork"))
    votes = await world.rows(app.Vote, app.Vote.status == "pending", app.Vote.is_available)
    assert sorted(v.approver for v in votes) == ["fin", "lea"]
    spawn = (await world.runtime.history(instance.id))[-1]
    assert spawn.action_type == "assignment"
    assert spawn.metadata["fork_scope"] == str(legal.fork_scope)
    assert spawn.metadata["fork_node"] == str(node_id(graph, "fork"))
    assert spawn.metadata["join_node"] == str(node_id(graph, "join"))
    assert [(t["name"], t["assignees"]) for t in spawn.metadata["targets"]] == [
        ("legal", ["lea"]),
        ("finance", ["fin"]),
    ]
    assert len(await world.events("duly.graph.state_assignment")) == 3
    # The oldest active branch (by started_at, then number) is legal's.
    assert forked.state_code == "legal" and await world.subject_state(claim) == "legal"


async def test_the_join_waits_for_the_last_branch_then_continues(world: World) -> None:
    graph, claim, instance = await start(world)
    await move(world, instance.id, graph, "draft", "fork", "ann")
    after_legal = await move(world, instance.id, graph, "legal", "join", "lea")
    assert on(after_legal) == ["finance"]
    assert await world.subject_state(claim) == "finance"
    waiting = (await world.runtime.history(instance.id))[-1]
    assert waiting.action_type == "status_change" and "still running" in waiting.message
    merged = await move(world, instance.id, graph, "finance", "join", "fin")
    [branch] = merged.branches
    assert (branch.node_key, branch.number) == ("final", 4)
    # The parent entered the fork at the top level: the merged branch is at the top level.
    assert (branch.fork_scope, branch.parent_branch_id, branch.fork_node_id) == (None,) * 3
    messages = [h.message for h in await world.runtime.history(instance.id)][-3:]
    assert messages[:2] == [
        "Join 'join' activated.",
        "Join 'join' continued automatically to 'final'.",
    ]
    joined = await world.rows(app.Branch, app.Branch.current_node_id == node_id(graph, "join"))
    assert sorted((b.number, b.status) for b in joined) == [(2, "completed"), (3, "completed")]
    assert await world.subject_state(claim) == "final"
    done = await move(world, instance.id, graph, "final", "end", "boss")
    assert done.state_status == "completed" and await world.subject_state(claim) == "final"


async def test_a_fork_with_one_edge_is_refused(world: World) -> None:
    nodes = {**FORKED, "fork": FORK}
    edges = [e for e in FORKED_EDGES if e != ("fork", "finance")]
    graph, _, instance = await start(world, nodes, edges)
    with pytest.raises(StateWorkflowError, match="at least two outgoing"):
        await move(world, instance.id, graph, "draft", "fork", "ann")
    assert on(await world.runtime.instance(instance.id)) == ["draft"]
    assert len(await world.rows(app.Branch)) == 1


async def test_the_forked_parent_cannot_move(world: World) -> None:
    nodes = {**FORKED}
    edges = [*FORKED_EDGES, ("draft", "final")]
    graph, _, instance = await start(world, nodes, edges)
    parent = only_branch(instance)
    await move(world, instance.id, graph, "draft", "fork", "ann")
    with pytest.raises(StateWorkflowError, match="no longer active"):
        await world.runtime.transition_branch(instance.id, parent, node_id(graph, "final"), "ann")


async def test_a_branch_ending_at_end_lets_the_join_fire_on_the_next_arrival(
    world: World,
) -> None:
    graph, claim, instance = await start(world)
    await move(world, instance.id, graph, "draft", "fork", "ann")
    after_end = await move(world, instance.id, graph, "finance", "end", "fin")
    assert on(after_end) == ["legal"] and after_end.state_status == "active"
    merged = await move(world, instance.id, graph, "legal", "join", "lea")
    assert on(merged) == ["final"]
    assert await world.subject_state(claim) == "final"


async def test_a_branch_ending_at_end_after_the_arrivals_releases_the_join(
    world: World,
) -> None:
    graph, claim, instance = await start(world)
    await move(world, instance.id, graph, "draft", "fork", "ann")
    waiting = await move(world, instance.id, graph, "legal", "join", "lea")
    assert on(waiting) == ["finance"]
    released = await move(world, instance.id, graph, "finance", "end", "fin")
    assert on(released) == ["final"] and released.state_status == "active"
    assert "Join 'join' activated." in [h.message for h in await world.runtime.history(instance.id)]
    assert await world.subject_state(claim) == "final"


# draft -> outer -> (a, inner -> (b, c) -> inner_join -> d) -> outer_join -> final -> end
NESTED: dict[str, Any] = {
    "start": START,
    "draft": (STATE, "draft", ["ann"]),
    "outer": {"type": FORK, "matched_join": "outer_join"},
    "a": (STATE, "a", ["amy"]),
    "inner": {"type": FORK, "matched_join": "inner_join"},
    "b": (STATE, "b", ["ben"]),
    "c": (STATE, "c", ["cy"]),
    "inner_join": JOIN,
    "d": (STATE, "d", ["dan"]),
    "outer_join": JOIN,
    "final": (STATE, "final", ["boss"]),
    "end": END,
}
NESTED_EDGES: list[Any] = [
    ("start", "draft"),
    ("draft", "outer"),
    ("outer", "a"),
    ("outer", "inner"),
    ("inner", "b"),
    ("inner", "c"),
    ("b", "inner_join"),
    ("c", "inner_join"),
    ("inner_join", "d"),
    ("d", "outer_join"),
    ("a", "outer_join"),
    ("final", "end"),
    ("outer_join", "final"),
]


async def test_a_nested_join_restores_the_outer_scope(world: World) -> None:
    graph, claim, instance = await start(world, NESTED, NESTED_EDGES)
    top = only_branch(instance)
    forked = await move(world, instance.id, graph, "draft", "outer", "ann")
    assert on(forked) == ["a", "b", "c"]
    a, b, c = forked.branches
    assert b.fork_scope == c.fork_scope != a.fork_scope
    [inner_parent] = await world.rows(
        app.Branch, app.Branch.current_node_id == node_id(graph, "inner")
    )
    assert (inner_parent.fork_scope, inner_parent.parent_branch_id) == (a.fork_scope, top)
    assert b.parent_branch_id == inner_parent.id and b.join_node_id == node_id(graph, "inner_join")
    await move(world, instance.id, graph, "b", "inner_join", "ben")
    restored = await move(world, instance.id, graph, "c", "inner_join", "cy")
    assert on(restored) == ["a", "d"]
    d = restored.branches[1]
    # The inner join's merged branch is back in the outer fork's scope, as its parent was.
    assert (d.fork_scope, d.parent_branch_id, d.fork_node_id, d.join_node_id) == (
        a.fork_scope,
        top,
        node_id(graph, "outer"),
        node_id(graph, "outer_join"),
    )
    assert (await move(world, instance.id, graph, "a", "outer_join", "amy")).branches == (
        restored.branches[1],
    )
    final = await move(world, instance.id, graph, "d", "outer_join", "dan")
    [branch] = final.branches
    assert (branch.node_key, branch.fork_scope, branch.parent_branch_id) == ("final", None, None)
    assert await world.subject_state(claim) == "final"


async def test_the_outer_join_waits_for_a_nested_fork(world: World) -> None:
    graph, _, instance = await start(world, NESTED, NESTED_EDGES)
    await move(world, instance.id, graph, "draft", "outer", "ann")
    # a reaches the outer join while the inner fork's branches (another scope) still run.
    waiting = await move(world, instance.id, graph, "a", "outer_join", "amy")
    assert on(waiting) == ["b", "c"]
    await move(world, instance.id, graph, "b", "inner_join", "ben")
    after_inner = await move(world, instance.id, graph, "c", "inner_join", "cy")
    assert on(after_inner) == ["d"]
    assert on(await move(world, instance.id, graph, "d", "outer_join", "dan")) == ["final"]


async def test_a_fork_fired_again_has_a_fresh_scope(world: World) -> None:
    edges = [*FORKED_EDGES, ("final", "draft")]
    graph, _, instance = await start(world, FORKED, edges)
    scopes = []
    for _ in range(2):
        forked = await move(world, instance.id, graph, "draft", "fork", "ann")
        scopes.append(forked.branches[0].fork_scope)
        await move(world, instance.id, graph, "legal", "join", "lea")
        await move(world, instance.id, graph, "finance", "join", "fin")
        await move(world, instance.id, graph, "final", "draft", "boss")
    assert scopes[0] != scopes[1]
    history = await world.runtime.history(instance.id)
    assert [h.message for h in history].count("Join 'join' activated.") == 2
    finals = await world.rows(app.Visit, app.Visit.node_id == node_id(graph, "final"))
    assert sorted(v.iteration for v in finals) == [1, 2]


async def test_a_join_without_one_edge_waits_there(world: World) -> None:
    nodes = {**FORKED, "other": (STATE, "other", ["oz"])}
    edges = [*FORKED_EDGES, ("join", "other")]
    graph, claim, instance = await start(world, nodes, edges)
    await move(world, instance.id, graph, "draft", "fork", "ann")
    await move(world, instance.id, graph, "legal", "join", "lea")
    stuck = await move(world, instance.id, graph, "finance", "join", "fin")
    assert on(stuck) == ["join"] and stuck.state_status == "active"
    [visit] = await world.rows(app.Visit, app.Visit.node_id == node_id(graph, "join"))
    assert visit.is_current
    # A join is not a business state: the subject keeps its last one.
    assert await world.subject_state(claim) == "finance"
    assert stuck.current_node_id == node_id(graph, "join")


ROUTED: dict[str, Any] = {
    "start": START,
    "draft": (STATE, "draft", ["ann"]),
    "check": {"type": CONDITION, "condition": "large"},
    "board": (STATE, "board", ["bea"]),
    "manager": (STATE, "manager", ["max"]),
    "end": END,
}
ROUTED_EDGES: list[Any] = [
    ("start", "draft"),
    ("draft", "check"),
    ("check", "board", {"condition_result": "true"}),
    ("check", "manager", {"condition_result": "false"}),
    ("board", "end"),
    ("manager", "end"),
]


async def test_a_condition_routes_on_its_predicate(world: World) -> None:
    graph, claim, instance = await start(world, ROUTED, ROUTED_EDGES, amount="5000")
    routed = await move(world, instance.id, graph, "draft", "check", "ann")
    assert on(routed) == ["board"] and await world.subject_state(claim) == "board"
    small = await world.runtime.submit(await world.claim("5"), "sam", template_name="forked")
    assert on(await move(world, small.id, graph, "draft", "check", "ann")) == ["manager"]
    route = [h for h in await world.runtime.history(instance.id) if h.step_name == "check"]
    assert [(h.action_type, h.metadata["to_state"]) for h in route] == [("status_change", "board")]


@pytest.mark.parametrize(
    "check",
    [{"type": CONDITION, "condition": "unregistered"}, {"type": "approval"}],
    ids=["unregistered-predicate", "unknown-type"],
)
async def test_an_undecidable_node_refuses_the_move(world: World, check: Any) -> None:
    graph, claim, instance = await start(world, {**ROUTED, "check": check}, ROUTED_EDGES)
    before = await world.runtime.history(instance.id)
    with pytest.raises(StateWorkflowError):
        await move(world, instance.id, graph, "draft", "check", "ann")
    assert await world.runtime.history(instance.id) == before
    assert on(await world.runtime.instance(instance.id)) == ["draft"]
    assert await world.subject_state(claim) == "draft"
