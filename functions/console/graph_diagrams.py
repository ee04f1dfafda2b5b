"""What the console's graph diagrams mark: where branches stand, what was visited, which
edges were taken, and which node or edge each validation problem names."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from engine import (
    ASSIGNMENT,
    CONDITION,
    STATUS_CHANGE,
    BranchSnapshot,
    Graph,
    HistoryEntry,
    Problem,
)


def instance_marks(
    graph: Graph,
    branches: Sequence[BranchSnapshot],
    history: Sequence[HistoryEntry],
    visits: Mapping[uuid.UUID, uuid.UUID],
) -> dict[str, Any]:
    """What the diagram marks: where each active branch stands, what was visited, which
    edges were taken (by node keys).

    The edges come from the audit trail, whose metadata names them: a move or an
    escalation names its visit (whose node is the source) and its target; a fork
    takes all its edges; a join's continuation its one edge; a condition names its
    result (and, by its title, itself).
    """
    taken: set[tuple[uuid.UUID, uuid.UUID]] = set()
    start = graph.start
    if start is not None and history:
        taken.update((start.id, edge.target_id) for edge in graph.outgoing(start.id))
    for entry in history:
        taken.update(_edges_of(graph, entry, visits))
    visited = {node_id for pair in taken for node_id in pair} | set(visits.values())
    current: dict[str, list[int]] = {}
    for branch in branches:
        if branch.node_key is not None:
            current.setdefault(branch.node_key, []).append(branch.number)
    return {
        "visited": sorted(graph.node(node_id).key for node_id in visited if node_id in graph.nodes),
        "current": current,
        "trail": sorted(
            [graph.node(source).key, graph.node(target).key]
            for source, target in taken
            if source in graph.nodes and target in graph.nodes
        ),
    }


def _edges_of(
    graph: Graph, entry: HistoryEntry, visits: Mapping[uuid.UUID, uuid.UUID]
) -> set[tuple[uuid.UUID, uuid.UUID]]:
    """The edges one history row says were taken."""
    meta = entry.metadata
    if entry.action_type == ASSIGNMENT and meta.get("targets") and meta.get("fork_node"):
        fork = _uuid(meta["fork_node"])  # a fork starts a branch on each of its edges
        return {(e.source_id, e.target_id) for e in graph.outgoing(fork)} if fork else set()
    if entry.action_type != STATUS_CHANGE:
        return set()
    target = _uuid(meta.get("target_state_id"))
    if target is not None and entry.visit_id is not None and entry.visit_id in visits:
        return {(visits[entry.visit_id], target)}
    if meta.get("join_node") and meta.get("to_state"):
        join = _uuid(meta["join_node"])
        return {(e.source_id, e.target_id) for e in graph.outgoing(join)} if join else set()
    if "condition" in meta and "result" in meta:
        wanted = "true" if meta["result"] else "false"
        return {
            (edge.source_id, edge.target_id)
            for node in graph.nodes.values()
            if node.node_type == CONDITION and node.title == entry.step_name
            for edge in graph.outgoing(node.id)
            if edge.condition_result == wanted
        }
    return set()


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value is not None else None
    except ValueError:
        return None


def problem_json(problem: Problem, graph: Graph) -> dict[str, Any]:
    """A validation problem as the pages mark it: its code, message, node key and edge."""
    edge = problem_edge(problem, graph)
    return {
        "code": problem.code,
        "message": str(problem),
        "node": problem.node_key,
        "edge": None if edge is None else {"source": edge[0], "target": edge[1]},
    }


def problem_edge(problem: Problem, graph: Graph) -> tuple[str, str] | None:
    """The (source, target) keys of the edge a problem is about, if it is about one.

    A problem names its node; when it is about one of that node's edges, its
    message names the edge as validation words it ("The transition from 'A'
    to 'B'", "The branch of 'F' to 'B'", "'Start' leads to 'B'").
    """
    source = graph.by_key(problem.node_key) if problem.node_key is not None else None
    if source is None:
        return None
    for edge in graph.outgoing(source.id):
        target = graph.node(edge.target_id)
        pair = f"{source.title!r} to {target.title!r}"
        phrases = (
            f"The transition from {pair}",
            f"The branch of {pair}",
            f"{source.title!r} leads to {target.title!r}",
        )
        if any(phrase in problem.message for phrase in phrases):
            return source.key, target.key
    return None
