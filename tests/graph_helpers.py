"""Graphs for tests, written compactly: nodes by key, edges as (source, target[, options]).

    graph = graph_of(
        {"start": START, "review": (STATE, "review", ["ann"]), "done": END},
        [("start", "review"), ("review", "done")],
    )

A node is its type, or (type, state code, users), or a dict of `Node` fields
(`node_type` given as `type`). `stored(connection, tables, graph)` writes it
as an active template version, as a save and an activation would. `FORKED` and
`FORKED_EDGES` are the forked graph several modules move through.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.graphs.design.model import Edge, Graph, Node, edge_values, node_values
from engine.graphs.tables import END, FORK, JOIN, START, STATE, GraphTables

NodeSpec = str | tuple[Any, ...] | Mapping[str, Any]
EdgeSpec = tuple[str, str] | tuple[str, str, Mapping[str, Any]]

# draft -> fork -> (legal, finance) -> join -> final -> end
FORKED: dict[str, Any] = {
    "start": START,
    "draft": (STATE, "draft", ["ann"]),
    "fork": {"type": FORK, "matched_join": "join"},
    "legal": (STATE, "legal", ["lea"]),
    "finance": (STATE, "finance", ["fin"]),
    "join": JOIN,
    "final": (STATE, "final", ["boss"]),
    "end": END,
}
FORKED_EDGES: list[Any] = [
    ("start", "draft"),
    ("draft", "fork"),
    ("fork", "legal"),
    ("fork", "finance"),
    ("legal", "join"),
    ("finance", "join"),
    ("finance", "end"),
    ("join", "final"),
    ("final", "end"),
]


def graph_of(
    nodes: Mapping[str, NodeSpec],
    edges: Iterable[EdgeSpec],
    *,
    name: str = "test-graph",
    version: int = 1,
    state_choices: Iterable[str] | None = None,
) -> Graph:
    """A `Graph` with fresh ids; the vocabulary defaults to every state code used."""
    built: dict[str, Node] = {}
    for order, (key, spec) in enumerate(nodes.items(), start=1):
        built[key] = _node(key, spec, order)
    # matched_join given by key in a dict spec becomes the join's id.
    for key, node in list(built.items()):
        spec = nodes[key]
        if isinstance(spec, Mapping) and "matched_join" in spec:
            built[key] = _replace(node, matched_join_id=built[spec["matched_join"]].id)
    made_edges = []
    for order, spec in enumerate(edges):
        source, target = spec[0], spec[1]
        options = dict(spec[2]) if len(spec) == 3 else {}
        made_edges.append(
            Edge(
                id=uuid.uuid4(),
                source_id=built[source].id,
                target_id=built[target].id,
                order=options.pop("order", order),
                **options,
            )
        )
    codes = [n.state_code for n in built.values() if n.state_code]
    return Graph(
        template_id=uuid.uuid4(),
        name=name,
        version=version,
        nodes={node.id: node for node in built.values()},
        edges=tuple(made_edges),
        state_choices=tuple(state_choices if state_choices is not None else dict.fromkeys(codes)),
    )


def _node(key: str, spec: NodeSpec, order: int) -> Node:
    if isinstance(spec, str):
        return Node(id=uuid.uuid4(), key=key, node_type=spec, name=key, order=order)
    if isinstance(spec, tuple):
        node_type, code, users = (*spec, None, None)[:3]
        return Node(
            id=uuid.uuid4(),
            key=key,
            node_type=node_type,
            name=key,
            order=order,
            state_code=code,
            assignee_users=tuple(users or ()),
        )
    fields = {k: v for k, v in spec.items() if k not in ("type", "matched_join")}
    for many in ("assignee_users", "assignee_groups"):
        if many in fields:
            fields[many] = tuple(fields[many])
    fields.setdefault("name", key)
    return Node(id=uuid.uuid4(), key=key, node_type=spec["type"], order=order, **fields)


def _replace(node: Node, **changes: Any) -> Node:
    values = {**node.__dict__, **changes}
    return Node(**values)


async def stored(
    connection: AsyncConnection, tables: GraphTables, graph: Graph, *, active: bool = True
) -> Graph:
    """Write `graph` as a template version (active unless told otherwise); the graph back."""
    await connection.execute(
        insert(tables.table("template")).values(
            id=graph.template_id,
            name=graph.name,
            version=graph.version,
            is_latest=True,
            is_active=active,
            state_choices=list(graph.state_choices),
            design={},
            description="",
            forbid_self_approval=graph.forbid_self_approval,
        )
    )
    # Nodes first without their matched joins (a fork may come before its join).
    rows = [node_values(graph.template_id, n) for n in graph.nodes.values()]
    await connection.execute(
        insert(tables.table("node")), [{**row, "matched_join_id": None} for row in rows]
    )
    for row in rows:
        if row["matched_join_id"] is not None:
            node_table = tables.table("node")
            await connection.execute(
                node_table.update()
                .where(node_table.c.id == row["id"])
                .values(matched_join_id=row["matched_join_id"])
            )
    if graph.edges:
        await connection.execute(
            insert(tables.table("transition")),
            [edge_values(graph.template_id, e) for e in graph.edges],
        )
    return graph


DEADLINE = 3600  # seconds a reviewer has


def escalating(deadline: int = DEADLINE, manager_deadline: int | None = None) -> Graph:
    nodes: dict[str, Any] = {
        "start": START,
        "review": {
            "type": STATE,
            "state_code": "review",
            "assignee_users": ["ann", "abe"],
            "deadline_seconds": deadline,
        },
        "manager": {
            "type": STATE,
            "state_code": "manager",
            "assignee_users": ["max"],
            "deadline_seconds": manager_deadline,
        },
        "director": (STATE, "director", ["dee"]),
        "done": (STATE, "done", ["ann"]),
        "end": END,
    }
    edges = [
        ("start", "review"),
        ("review", "done"),
        ("review", "manager", {"escalation": True}),
        ("manager", "director", {"escalation": True}),
        ("manager", "done"),
        ("director", "done"),
        ("done", "end"),
    ]
    return graph_of(nodes, edges, name="escalating")
