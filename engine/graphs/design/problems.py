"""What the validation rules share: a problem found, the graph a rule reads, graph walks."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass

from engine.graphs.design.joins import matched_join
from engine.graphs.design.model import Edge, Graph, Node
from engine.graphs.tables import FORK


@dataclass(frozen=True)
class Problem:
    """One broken rule: its stable code, a sentence saying what to fix, and the node."""

    code: str
    message: str
    node_key: str | None = None

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass(frozen=True)
class GraphCheck:
    """What a rule reads: the graph, and the names of the registered predicates."""

    graph: Graph
    conditions: Collection[str]

    def nodes(self) -> list[Node]:
        """Every node, in the designer's order."""
        return sorted(self.graph.nodes.values(), key=lambda n: (n.order, n.key))

    def edges(self) -> list[Edge]:
        """Every edge, by its source's order then the picker's order."""
        return [edge for node in self.nodes() for edge in self.graph.outgoing(node.id)]

    def title(self, node_id: uuid.UUID) -> str:
        """A node's title, quoted; an id when the graph lacks the node."""
        node = self.graph.nodes.get(node_id)
        return repr(node.title) if node is not None else repr(str(node_id))

    def transition(self, edge: Edge) -> str:
        """How a message names an edge."""
        return f"The transition from {self.title(edge.source_id)} to {self.title(edge.target_id)}"

    def problem(self, code: str, message: str, node_id: uuid.UUID | None = None) -> Problem:
        """A problem about a node of this graph (or about the whole graph)."""
        node = self.graph.nodes.get(node_id) if node_id is not None else None
        return Problem(code, message, node.key if node is not None else None)


Rule = Callable[[GraphCheck], Iterable[Problem]]


def fork_branches(graph: Graph) -> Iterator[tuple[Node, Node, Edge]]:
    """Each branch of each fork with a valid matched join (S9 speaks for the others)."""
    for fork in graph.of_type(FORK):
        join = matched_join(graph, fork)
        if join is not None:
            for edge in graph.outgoing(fork.id):
                yield fork, join, edge


def reachable_from(graph: Graph, starts: Iterable[uuid.UUID]) -> set[uuid.UUID]:
    """Every node reachable from `starts` (a set of seen nodes ends loops)."""
    seen: set[uuid.UUID] = set()
    pending = list(starts)
    while pending:
        node_id = pending.pop()
        if node_id not in seen:
            seen.add(node_id)
            pending.extend(edge.target_id for edge in graph.outgoing(node_id))
    return seen


def reaching(graph: Graph, targets: Iterable[uuid.UUID]) -> set[uuid.UUID]:
    """Every node that can reach one of `targets`."""
    incoming: dict[uuid.UUID, list[uuid.UUID]] = {}
    for edge in graph.edges:
        incoming.setdefault(edge.target_id, []).append(edge.source_id)
    seen: set[uuid.UUID] = set()
    pending = list(targets)
    while pending:
        node_id = pending.pop()
        if node_id not in seen:
            seen.add(node_id)
            pending.extend(incoming.get(node_id, ()))
    return seen
