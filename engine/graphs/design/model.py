"""A template version's graph in memory: what validation checks and the moves walk.

A saved version never changes, so its `Graph` is read once per process
(`load_graph`, cached by template id).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.base.errors import NotFoundError
from engine.graphs.tables import (
    ANY_SUBMITTER,
    CONDITION,
    END,
    FORK,
    JOIN,
    SINGLE,
    START,
    STATE,
    GraphTables,
)


@dataclass(frozen=True)
class Node:
    """A node of the graph, as stored."""

    id: uuid.UUID
    key: str
    node_type: str
    name: str = ""
    order: int = 0
    state_code: str | None = None
    approval_threshold: str = SINGLE
    assignee_users: tuple[str, ...] = ()
    assignee_groups: tuple[str, ...] = ()
    condition: str | None = None
    matched_join_id: uuid.UUID | None = None
    deadline_seconds: int | None = None
    assignment_template: str | None = None
    notify_originator: bool = False

    @property
    def has_assignees(self) -> bool:
        """Whether anyone is named to move this node."""
        return bool(self.assignee_users or self.assignee_groups)

    @property
    def title(self) -> str:
        """The name people read: the node's name, else its state code, else its key."""
        return self.name or self.state_code or self.key


@dataclass(frozen=True)
class Edge:
    """A transition of the graph, as stored."""

    id: uuid.UUID
    source_id: uuid.UUID
    target_id: uuid.UUID
    label: str = ""
    order: int = 0
    condition: str | None = None
    condition_result: str | None = None  # "true" or "false" on a condition's edges
    comment_required: bool = False
    escalation: bool = False


@dataclass(frozen=True)
class Graph:
    """One template version: its nodes and edges, with the lookups the runtime needs."""

    template_id: uuid.UUID
    name: str
    version: int
    nodes: Mapping[uuid.UUID, Node]
    edges: tuple[Edge, ...]
    state_choices: tuple[str, ...] = ()
    is_active: bool = False
    forbid_self_approval: bool = False  # the subject's owner (or submitter) may not move it
    submitters: str = ANY_SUBMITTER  # who may submit: any, owner, or a role (SUBMITTERS)
    _outgoing: dict[uuid.UUID, tuple[Edge, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        grouped: dict[uuid.UUID, list[Edge]] = {}
        for edge in self.edges:
            grouped.setdefault(edge.source_id, []).append(edge)
        for source, edges in grouped.items():
            # The picker's order: by `order`, then id.
            self._outgoing[source] = tuple(sorted(edges, key=lambda e: (e.order, str(e.id))))

    def node(self, node_id: uuid.UUID) -> Node:
        """The node with this id (a KeyError is a bug: ids come from this graph)."""
        return self.nodes[node_id]

    def outgoing(self, node_id: uuid.UUID) -> tuple[Edge, ...]:
        """The edges leaving a node, in the picker's order."""
        return self._outgoing.get(node_id, ())

    def edge(self, source_id: uuid.UUID, target_id: uuid.UUID) -> Edge | None:
        """The edge from source to target, if the graph has one."""
        for edge in self.outgoing(source_id):
            if edge.target_id == target_id:
                return edge
        return None

    def of_type(self, node_type: str) -> list[Node]:
        """The nodes of one type, in their order."""
        return sorted(
            (n for n in self.nodes.values() if n.node_type == node_type),
            key=lambda n: (n.order, n.key),
        )

    @cached_property
    def start(self) -> Node | None:
        """The START node (the first, if a broken graph has several)."""
        starts = self.of_type(START)
        return starts[0] if starts else None

    def by_key(self, key: str) -> Node | None:
        """The node the designer calls `key`."""
        return self._by_key.get(key)

    @cached_property
    def _by_key(self) -> dict[str, Node]:
        return {node.key: node for node in self.nodes.values()}


SUBMITTERS_KEY = "submitters"  # the stored design's key for who may submit
NODE_TYPES_WITHOUT_ASSIGNEES = (START, CONDITION, FORK, JOIN, END)
BUSINESS_NODE_TYPES = (STATE,)

_graphs: dict[uuid.UUID, Graph] = {}
_GRAPH_CACHE_SIZE = 256


async def load_graph(
    connection: AsyncConnection, tables: GraphTables, template_id: uuid.UUID
) -> Graph:
    """The graph of one template version, read once per process (versions never change)."""
    found = _graphs.get(template_id)
    if found is not None:
        return found
    graph = await read_graph(connection, tables, template_id)
    if len(_graphs) >= _GRAPH_CACHE_SIZE:
        _graphs.pop(next(iter(_graphs)))  # the oldest read
    _graphs[template_id] = graph
    return graph


async def read_graph(
    connection: AsyncConnection, tables: GraphTables, template_id: uuid.UUID
) -> Graph:
    """The graph of one template version, read from the database (no cache)."""
    templates, nodes, transitions = (
        tables.table("template"),
        tables.table("node"),
        tables.table("transition"),
    )
    template = (
        await connection.execute(select(templates).where(templates.c.id == template_id))
    ).first()
    if template is None:
        raise NotFoundError(f"No graph template has the id {template_id}.")
    node_rows = (
        await connection.execute(select(nodes).where(nodes.c.template_id == template_id))
    ).all()
    edge_rows = (
        await connection.execute(
            select(transitions).where(transitions.c.template_id == template_id)
        )
    ).all()
    return Graph(
        template_id=template.id,
        name=template.name,
        version=template.version,
        state_choices=tuple(template.state_choices or ()),
        is_active=template.is_active,
        forbid_self_approval=bool(template.forbid_self_approval),
        submitters=stored_submitters(template.design),
        nodes={row.id: node_from_row(row._mapping) for row in node_rows},
        edges=tuple(edge_from_row(row._mapping) for row in edge_rows),
    )


def stored_submitters(design: Mapping[str, Any] | None) -> str:
    """Who may submit, as a version keeps it: in its stored design (no column of its own)."""
    return str((design or {}).get(SUBMITTERS_KEY, ANY_SUBMITTER))


def node_from_row(row: Mapping[Any, Any]) -> Node:
    """A `Node` from a row of the nodes table."""
    return Node(
        id=row["id"],
        key=row["key"],
        node_type=row["node_type"],
        name=row["name"] or "",
        order=row["order"] or 0,
        state_code=row["state_code"],
        approval_threshold=row["approval_threshold"] or SINGLE,
        assignee_users=tuple(row["assignee_users"] or ()),
        assignee_groups=tuple(row["assignee_groups"] or ()),
        condition=row["condition"],
        matched_join_id=row["matched_join_id"],
        deadline_seconds=row["deadline_seconds"],
        assignment_template=row["assignment_template"],
        notify_originator=bool(row["notify_originator"]),
    )


def edge_from_row(row: Mapping[Any, Any]) -> Edge:
    """An `Edge` from a row of the transitions table."""
    return Edge(
        id=row["id"],
        source_id=row["source_id"],
        target_id=row["target_id"],
        label=row["label"] or "",
        order=row["order"] or 0,
        condition=row["condition"],
        condition_result=row["condition_result"],
        comment_required=bool(row["comment_required"]),
        escalation=bool(row["escalation"]),
    )


def node_values(template_id: uuid.UUID, node: Node) -> dict[str, Any]:
    """The row that stores `node` in a template version."""
    return {
        "id": node.id,
        "template_id": template_id,
        "key": node.key,
        "node_type": node.node_type,
        "name": node.name,
        "order": node.order,
        "state_code": node.state_code,
        "approval_threshold": node.approval_threshold,
        "assignee_users": list(node.assignee_users),
        "assignee_groups": list(node.assignee_groups),
        "condition": node.condition,
        "matched_join_id": node.matched_join_id,
        "deadline_seconds": node.deadline_seconds,
        "assignment_template": node.assignment_template,
        "notify_originator": node.notify_originator,
    }


def edge_values(template_id: uuid.UUID, edge: Edge) -> dict[str, Any]:
    """The row that stores `edge` in a template version."""
    return {
        "id": edge.id,
        "template_id": template_id,
        "source_id": edge.source_id,
        "target_id": edge.target_id,
        "label": edge.label,
        "order": edge.order,
        "condition": edge.condition,
        "condition_result": edge.condition_result,
        "comment_required": edge.comment_required,
        "escalation": edge.escalation,
    }


def forget_graphs() -> None:
    """Drop every cached graph (tests that reuse ids across databases call it)."""
    _graphs.clear()
