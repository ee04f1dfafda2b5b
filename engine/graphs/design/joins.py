"""Which join closes which fork: matched from the drawing, and the scopes validation checks.

A save matches each fork to the one join every branch that reaches a join
has in common (`resolve_matched_joins`); a branch that ends at an END takes
no part in the match. Walks step over inner fork/join pairs and end loops.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from engine.graphs.design.model import Edge, Graph, Node
from engine.graphs.tables import END, FORK, JOIN

JoinOf = Callable[[Node], uuid.UUID | None]


@dataclass(frozen=True)
class Reach:
    """Where one branch can go within its scope: the first joins it meets, and whether an END."""

    joins: tuple[uuid.UUID, ...]  # in the order the walk met them
    reaches_end: bool


def resolve_matched_joins(graph: Graph) -> Graph:
    """A copy of `graph` whose forks carry the join the drawing closes them with (else None)."""
    resolver = _Resolver(graph)
    matched = {fork.id: resolver.join_of(fork) for fork in graph.of_type(FORK)}
    nodes = {
        node_id: (
            dataclasses.replace(node, matched_join_id=matched[node_id])
            if node_id in matched
            else node
        )
        for node_id, node in graph.nodes.items()
    }
    return dataclasses.replace(graph, nodes=nodes)


def matched_join(graph: Graph, fork: Node) -> Node | None:
    """The join a fork names as its own, if it names a join node of this graph."""
    if fork.matched_join_id is None:
        return None
    join = graph.nodes.get(fork.matched_join_id)
    return join if join is not None and join.node_type == JOIN else None


def branch_reach(graph: Graph, fork: Node, edge: Edge) -> Reach:
    """Where the branch that `edge` starts can go, inner forks closed by their stored joins."""
    return walk_branch(graph, edge.target_id, stop_forks={fork.id}, join_of=_stored_join(graph))


def walk_branch(
    graph: Graph,
    first_id: uuid.UUID,
    *,
    stop_forks: Collection[uuid.UUID],
    join_of: JoinOf,
) -> Reach:
    """The first joins and ENDs reachable from `first_id`, skipping inner fork/join pairs.

    A walk stops at a join (recorded), at an END, and at a fork of `stop_forks`
    (the branch's own fork: coming back to it starts the scope again, which
    tells nothing new). At another fork it goes on after that fork's join
    (`join_of`), or into its branches when it has none.
    """
    joins: dict[uuid.UUID, None] = {}  # a dict keeps the order met
    reaches_end = False
    seen: set[uuid.UUID] = set()
    pending = [first_id]
    while pending:
        node_id = pending.pop()
        node = graph.nodes.get(node_id)
        if node is None or node_id in seen:
            continue
        seen.add(node_id)
        if node.node_type == JOIN:
            joins[node_id] = None
            continue
        if node.node_type == END:
            reaches_end = True
            continue
        after = node_id
        if node.node_type == FORK:
            if node_id in stop_forks:
                continue
            after = join_of(node) or node_id
        pending.extend(_targets(graph, after))
    return Reach(joins=tuple(joins), reaches_end=reaches_end)


def fork_scope(graph: Graph, fork: Node) -> frozenset[uuid.UUID]:
    """The fork, its matched join, and every node its branches reach before that join.

    ENDs are left out: every scope may end at the same END without sharing
    anything. A fork without a matched join has no scope (validation says why).
    """
    join = matched_join(graph, fork)
    if join is None:
        return frozenset()
    scope = {fork.id, join.id}
    pending = list(_targets(graph, fork.id))
    while pending:
        node_id = pending.pop()
        node = graph.nodes.get(node_id)
        if node is None or node_id in scope or node.node_type == END:
            continue
        scope.add(node_id)
        pending.extend(_targets(graph, node_id))
    return frozenset(scope)


def common_join(reaches: Iterable[Reach]) -> uuid.UUID | None:
    """The one join all branches that reach a join have in common, else None."""
    met = [set(reach.joins) for reach in reaches if reach.joins]
    if not met:
        return None
    common = set.intersection(*met)
    return next(iter(common)) if len(common) == 1 else None


class _Resolver:
    """Matches forks to joins, inner forks first (on demand), each fork once."""

    def __init__(self, graph: Graph) -> None:
        self._graph = graph
        self._resolved: dict[uuid.UUID, uuid.UUID | None] = {}
        self._resolving: list[uuid.UUID] = []  # the forks whose walk is under way

    def join_of(self, fork: Node) -> uuid.UUID | None:
        """The join that closes `fork`, from the drawing."""
        if fork.id in self._resolved:
            return self._resolved[fork.id]
        self._resolving.append(fork.id)
        # A loop back into a fork under way stops there: that fork's scope
        # is what the outer walk is resolving.
        stop = frozenset(self._resolving)
        reaches = [
            walk_branch(self._graph, edge.target_id, stop_forks=stop, join_of=self.join_of)
            for edge in self._graph.outgoing(fork.id)
        ]
        self._resolving.pop()
        found = common_join(reaches)
        self._resolved[fork.id] = found
        return found


def _stored_join(graph: Graph) -> JoinOf:
    def join_of(fork: Node) -> uuid.UUID | None:
        join = matched_join(graph, fork)
        return join.id if join is not None else None

    return join_of


def _targets(graph: Graph, node_id: uuid.UUID) -> list[uuid.UUID]:
    # Reversed, so popping from the end walks in the picker's order.
    return [edge.target_id for edge in reversed(graph.outgoing(node_id))]
