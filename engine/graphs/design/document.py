"""The designer's JSON graph: read into a `Graph`, and drawn back from one.

`parse_design` checks the designer's body (camelCase) with pydantic, so bad
input is a `ConfigurationError` before anything is written; a stored layout
is drawn while it still matches the graph, else rebuilt as one column.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from engine.base.errors import ConfigurationError
from engine.graphs.design.model import SUBMITTERS_KEY, Edge, Graph, Node
from engine.graphs.tables import ANY_SUBMITTER, CONDITION, END, JOIN, SINGLE, STATE

# The rebuilt layout: one column, in node order.
COLUMN_X = 360  # pixels
FIRST_Y = 60  # pixels
ROW_HEIGHT = 170  # pixels between two nodes
LABEL_LENGTH = 150  # characters, as the transitions' label column
MAX_SHOWN_ERRORS = 5  # pydantic errors named in one ConfigurationError

NodeType = Literal["start", "state", "condition", "fork", "join", "end"]
Threshold = Literal["single", "majority", "unanimous"]
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]

# Node keys that are layout, not graph: kept from the stored design when it matches.
LAYOUT_KEYS = ("x", "y", "zIndex")


def _blank_is_none(value: Any) -> Any:
    """The designer sends "" for a field left empty; the graph says None."""
    return None if value == "" else value


class DesignNode(BaseModel):
    """A node as the designer sends it; unknown keys (layout data) are kept, not used."""

    model_config = ConfigDict(
        strict=True, extra="allow", alias_generator=to_camel, populate_by_name=True
    )

    id: Name
    type: NodeType
    name: str
    x: int | float
    y: int | float
    z_index: int | None = None
    state_code: str | None = None
    threshold: Threshold | None = None
    assignee_user_ids: list[str] = Field(default_factory=list)
    assignee_group_ids: list[str] = Field(default_factory=list)
    condition: str | None = None  # a registered predicate's name
    deadline_seconds: int | None = Field(default=None, gt=0)
    state_assignment_template_code: str | None = None
    notify_originator_on_assignment: bool = False

    @field_validator(
        "state_code", "threshold", "condition", "state_assignment_template_code", mode="before"
    )
    @classmethod
    def _blanks_are_none(cls, value: Any) -> Any:
        return _blank_is_none(value)


class DesignConnection(BaseModel):
    """A connection as the designer sends it; unknown keys are kept, not used."""

    model_config = ConfigDict(
        strict=True, extra="allow", alias_generator=to_camel, populate_by_name=True
    )

    source: str
    target: str
    label: str = Field(default="", max_length=LABEL_LENGTH)
    condition_result: Literal["true", "false"] | None = None
    comment_required: bool = False
    escalation: bool = False
    condition: str | None = None  # a manual guard's name

    @field_validator("condition", mode="before")
    @classmethod
    def _blank_condition_is_none(cls, value: Any) -> Any:
        return _blank_is_none(value)

    @field_validator("condition_result", mode="before")
    @classmethod
    def _result_as_text(cls, value: Any) -> Any:
        """A JSON true/false is the text the column keeps."""
        if isinstance(value, bool):
            return "true" if value else "false"
        return _blank_is_none(value)

    @property
    def pair(self) -> tuple[str, str]:
        """The (source, target) node ids: one transition per pair."""
        return (self.source, self.target)


class Design(BaseModel):
    """A save's body: a named graph, its vocabulary and the version it starts from.

    Keys a load adds (`version`, `is_active`, ...) are ignored, so a designer
    may post back what it loaded. Connections repeating a (source, target)
    pair are dropped, the first kept: a graph has one transition per pair.
    """

    model_config = ConfigDict(
        strict=True, extra="ignore", alias_generator=to_camel, populate_by_name=True
    )

    name: Name
    description: str | None = None
    state_choices: list[str] | None = None
    # Refuse an instance's submitter every move and vote of it (None: as the base version).
    forbid_self_approval: bool | None = None
    # Who may submit: "any", "owner" (the subject's owner column) or a role (None: as the base).
    submitters: str | None = None
    # A uuid arrives as text in JSON: the one field read leniently.
    base_template_id: Annotated[uuid.UUID | None, Field(strict=False)] = None
    nodes: list[DesignNode] = Field(min_length=1)
    connections: list[DesignConnection] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_references(self) -> Self:
        # ConfigurationError is a ValueError: pydantic reports it as a validation error.
        seen: set[str] = set()
        for node in self.nodes:
            if node.id in seen:
                raise ConfigurationError(f"Node id {node.id!r} is used by more than one node.")
            seen.add(node.id)
        kept: dict[tuple[str, str], DesignConnection] = {}
        for connection in self.connections:
            for end in connection.pair:
                if end not in seen:
                    raise ConfigurationError(
                        f"The connection {connection.source!r} -> {connection.target!r} "
                        f"names node {end!r}, which is not in the design."
                    )
            kept.setdefault(connection.pair, connection)
        self.connections = list(kept.values())
        return self


def _field_names(model: type[BaseModel]) -> frozenset[str]:
    """A model's keys, by name and by alias: what the graph, not the layout, says."""
    return frozenset(model.model_fields) | {
        field.alias for field in model.model_fields.values() if field.alias
    }


NODE_KEYS = _field_names(DesignNode)
CONNECTION_KEYS = _field_names(DesignConnection)


def parse_design(body: Mapping[str, Any]) -> Design:
    """The designer's body, checked; a ConfigurationError naming what is wrong."""
    try:
        return Design.model_validate(body)
    except ValidationError as exc:
        reasons = describe_design_error(exc).rstrip(".")
        raise ConfigurationError(f"The workflow design is not valid: {reasons}.") from exc


def describe_design_error(exc: ValidationError) -> str:
    """pydantic's errors as `where: why`, the first few."""
    shown = []
    for error in exc.errors()[:MAX_SHOWN_ERRORS]:
        where = ".".join(str(part) for part in error["loc"]) or "the design"
        shown.append(f"{where}: {error['msg']}")
    more = exc.error_count() - len(shown)
    return "; ".join(shown) + (f" (and {more} more)" if more > 0 else "")


def build_graph(
    design: Design,
    *,
    template_id: uuid.UUID,
    name: str,
    version: int,
    state_choices: tuple[str, ...],
    forbid_self_approval: bool = False,
    submitters: str = ANY_SUBMITTER,
) -> Graph:
    """The graph a save writes: fresh ids, nodes ordered from 1, edges from 0.

    Only a state keeps a state code, threshold, deadline
    and notification settings, and only a condition its predicate: leftovers
    of a node whose type changed. What validation reports where it does not
    belong (assignees on any node, a condition result on any edge) is kept as
    given, so the save's errors say so. Forks' matched joins are left to
    `resolve_matched_joins`.
    """
    nodes: dict[str, Node] = {}
    for index, spec in enumerate(design.nodes):
        is_state = spec.type == STATE
        nodes[spec.id] = Node(
            id=uuid.uuid4(),
            key=spec.id,
            node_type=spec.type,
            name=spec.name,
            order=index + 1,
            # An END may name the code its subject ends with.
            state_code=spec.state_code if spec.type in (STATE, END) else None,
            approval_threshold=(spec.threshold or SINGLE) if is_state else SINGLE,
            assignee_users=tuple(spec.assignee_user_ids),
            assignee_groups=tuple(spec.assignee_group_ids),
            condition=spec.condition if spec.type == CONDITION else None,
            deadline_seconds=spec.deadline_seconds if is_state else None,
            assignment_template=spec.state_assignment_template_code if is_state else None,
            notify_originator=spec.notify_originator_on_assignment if is_state else False,
        )
    edges = tuple(
        Edge(
            id=uuid.uuid4(),
            source_id=nodes[spec.source].id,
            target_id=nodes[spec.target].id,
            label=spec.label,
            order=index,
            condition=spec.condition,
            condition_result=spec.condition_result,
            comment_required=spec.comment_required,
            escalation=spec.escalation,
        )
        for index, spec in enumerate(design.connections)
    )
    return Graph(
        template_id=template_id,
        name=name,
        version=version,
        nodes={node.id: node for node in nodes.values()},
        edges=edges,
        state_choices=state_choices,
        forbid_self_approval=forbid_self_approval,
        submitters=submitters,
    )


def stored_design(design: Design, submitters: str = ANY_SUBMITTER) -> dict[str, Any]:
    """The design JSON kept with the version: nodes and kept connections, as given, and who
    may submit (`read_graph` reads it back)."""
    return {
        "nodes": [_as_given(node) for node in design.nodes],
        "connections": [_as_given(connection) for connection in design.connections],
        SUBMITTERS_KEY: submitters,
    }


def _as_given(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True)


def design_matches(stored: Mapping[str, Any], graph: Graph) -> bool:
    """Whether a stored layout still draws this graph (else the layout is rebuilt).

    As many nodes as node rows, as many connections as
    transitions, the same multiset of node types, the same set of state
    codes. Also the node ids must be the node keys and the connections the
    transitions' pairs, since the stored layout is drawn by those names.
    """
    nodes, connections = stored.get("nodes"), stored.get("connections")
    if not isinstance(nodes, list) or not isinstance(connections, list):
        return False
    if not all(isinstance(item, Mapping) for item in [*nodes, *connections]):
        return False
    if len(nodes) != len(graph.nodes) or len(connections) != len(graph.edges):
        return False
    if Counter(node.get("type") for node in nodes) != Counter(
        node.node_type for node in graph.nodes.values()
    ):
        return False
    stored_codes = {
        node.get("stateCode")
        for node in nodes
        if node.get("type") in (STATE, END) and node.get("stateCode")
    }
    if stored_codes != {node.state_code for node in graph.nodes.values() if node.state_code}:
        return False
    if {node.get("id") for node in nodes} != {node.key for node in graph.nodes.values()}:
        return False
    return {(c.get("source"), c.get("target")) for c in connections} == set(_pairs(graph))


def drawn_design(stored: Mapping[str, Any], graph: Graph) -> dict[str, Any]:
    """The nodes and connections a load shows: the stored layout while it matches, else rebuilt."""
    if not design_matches(stored, graph):
        return rebuilt_design(graph)
    by_key = {node.key: node for node in graph.nodes.values()}
    nodes = []
    for given in stored["nodes"]:
        kept = {k: v for k, v in given.items() if k in LAYOUT_KEYS or k not in NODE_KEYS}
        nodes.append({**node_json(by_key[given["id"]]), **kept})
    edges = {pair: edge for pair, edge in zip(_pairs(graph), graph.edges, strict=True)}
    connections = []
    for given in stored["connections"]:
        extra = {k: v for k, v in given.items() if k not in CONNECTION_KEYS}
        pair = (given["source"], given["target"])
        connections.append({**connection_json(graph, edges[pair]), **extra})
    return {"nodes": nodes, "connections": connections}


def rebuilt_design(graph: Graph) -> dict[str, Any]:
    """The fallback layout: one column, in node order, ids the node keys."""
    ordered = sorted(graph.nodes.values(), key=lambda node: (node.order, node.key))
    nodes = [
        {
            **node_json(node),
            "x": COLUMN_X,
            "y": FIRST_Y + index * ROW_HEIGHT,
            "zIndex": index + 1,
        }
        for index, node in enumerate(ordered)
    ]
    edges = sorted(graph.edges, key=lambda edge: (edge.order, str(edge.id)))
    return {"nodes": nodes, "connections": [connection_json(graph, edge) for edge in edges]}


def node_json(node: Node) -> dict[str, Any]:
    """A node's graph fields as the designer names them (no position)."""
    drawn: dict[str, Any] = {"id": node.key, "type": node.node_type, "name": node.name}
    if node.node_type == STATE:
        drawn["stateCode"] = node.state_code
        drawn["threshold"] = node.approval_threshold
        drawn["notifyOriginatorOnAssignment"] = node.notify_originator
        if node.deadline_seconds is not None:
            drawn["deadlineSeconds"] = node.deadline_seconds
        if node.assignment_template is not None:
            drawn["stateAssignmentTemplateCode"] = node.assignment_template
    if node.node_type == END and node.state_code is not None:
        drawn["stateCode"] = node.state_code
    if node.condition is not None:
        drawn["condition"] = node.condition
    # States and joins always show their assignees; others only when wrong.
    if node.node_type in (STATE, JOIN) or node.has_assignees:
        drawn["assigneeUserIds"] = list(node.assignee_users)
        drawn["assigneeGroupIds"] = list(node.assignee_groups)
    return drawn


def connection_json(graph: Graph, edge: Edge) -> dict[str, Any]:
    """An edge as the designer names it, by node keys."""
    drawn: dict[str, Any] = {
        "source": graph.node(edge.source_id).key,
        "target": graph.node(edge.target_id).key,
        "label": edge.label,
        "commentRequired": edge.comment_required,
        "escalation": edge.escalation,
    }
    if edge.condition_result is not None:
        drawn["conditionResult"] = edge.condition_result
    if edge.condition is not None:
        drawn["condition"] = edge.condition
    return drawn


def _pairs(graph: Graph) -> list[tuple[str, str]]:
    """Each edge's (source key, target key), in the graph's edge order."""
    return [
        (graph.node(edge.source_id).key, graph.node(edge.target_id).key) for edge in graph.edges
    ]
