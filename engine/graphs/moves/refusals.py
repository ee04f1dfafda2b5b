"""What a submit or a move is refused for before it decides anything: its graph's shape,
and who is moving."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from sqlalchemy.exc import IntegrityError

from engine.base.errors import SelfApprovalError, StateWorkflowError, WorkflowSubmissionError
from engine.graphs.design.model import Edge, Graph, Node
from engine.graphs.moves.actors import Actor
from engine.graphs.moves.conditions import ConditionRegistry
from engine.graphs.moves.states import InstanceState
from engine.graphs.tables import ACTIVE, CONDITION, INSTANCES, STATE

ACTIVE_SUBJECT_INDEX = f"uq_{INSTANCES}_active_subject"


def initial_node(graph: Graph, conditions: ConditionRegistry) -> Node:
    """The START node's single target: a state with assignees, or a decidable condition."""
    start = graph.start
    if start is None:
        raise StateWorkflowError(f"Template {graph.name!r} v{graph.version} has no START node.")
    edges = graph.outgoing(start.id)
    if len(edges) != 1:
        raise StateWorkflowError(
            f"START of {graph.name!r} v{graph.version} must have exactly one outgoing "
            f"transition; it has {len(edges)}."
        )
    target = graph.nodes.get(edges[0].target_id)
    if target is None:
        raise StateWorkflowError(f"START of {graph.name!r} points nowhere.")
    if target.node_type == STATE:
        if not target.has_assignees:
            raise StateWorkflowError(f"The initial state {target.title!r} has no assignees.")
    elif target.node_type == CONDITION:
        if not target.condition or target.condition not in conditions:
            raise StateWorkflowError(
                f"The initial condition {target.title!r} names no registered predicate."
            )
    else:
        raise StateWorkflowError(
            f"START must lead to a state or a condition, not to {target.node_type} "
            f"{target.title!r}."
        )
    return target


def refuse_move(
    graph: Graph,
    branch_id: uuid.UUID,
    branch_status: str,
    node_id: uuid.UUID | None,
    target_id: uuid.UUID,
    source_node_id: uuid.UUID | None,
) -> tuple[Node, Node, Edge]:
    """The state a branch moves from, the node it moves to and the edge between them;
    StateWorkflowError saying why when the graph allows no such move.

    `source_node_id`, when given, is the state the user saw the branch on.
    """
    if branch_status != ACTIVE:
        raise StateWorkflowError(f"Branch {branch_id} is no longer active ({branch_status}).")
    source = graph.nodes.get(node_id) if node_id is not None else None
    if source is None:
        raise StateWorkflowError(f"Branch {branch_id} sits on no node of its graph.")
    if source_node_id is not None and source.id != source_node_id:
        seen = graph.nodes.get(source_node_id)
        raise StateWorkflowError(
            f"Branch {branch_id} is no longer on {seen.title if seen else source_node_id!r}: "
            f"it is on {source.title!r} now."
        )
    target = graph.nodes.get(target_id)
    edge = graph.edge(source.id, target_id) if target is not None else None
    if target is None or edge is None:
        named = target.title if target is not None else str(target_id)
        raise StateWorkflowError(
            f"No transition leads from {source.title!r} to {named!r}: the branch is on "
            f"{source.title!r}."
        )
    if edge.escalation:
        raise StateWorkflowError(
            f"The transition from {source.title!r} to {target.title!r} is an escalation: "
            "only the engine takes it, when the deadline passes."
        )
    if source.node_type != STATE:
        raise StateWorkflowError(f"{source.title!r} is not a state: nobody moves it.")
    return source, target, edge


def self_approval(actor: Actor, approver: str | None) -> bool:
    """Whether `actor` is the one the template forbids to approve (`submits.self_approver`)."""
    return approver is not None and actor.user == approver


def refuse_actor(
    graph: Graph, source: Node, actor: Actor, assignees: list[str], approver: str | None
) -> None:
    """StateWorkflowError when `actor` is not one of the state's assignees; SelfApprovalError
    when the graph forbids self-approval and `actor` owns (or submitted) the instance."""
    if actor.user not in assignees:
        raise StateWorkflowError(
            f"{actor.user!r} may not move {source.title!r}: not one of its assignees."
        )
    if self_approval(actor, approver):
        raise SelfApprovalError(
            f"{actor.user!r} owns or submitted this instance of {graph.name!r}, which forbids "
            f"self-approval: someone else must move {source.title!r}."
        )


@contextlib.contextmanager
def refused_if_in_a_workflow(instance: InstanceState) -> Iterator[None]:
    """A submission's write, its unique-index conflict (another active instance of the
    subject, perhaps submitted at the same moment) raised as WorkflowSubmissionError."""
    try:
        yield
    except IntegrityError as exc:
        constraint = getattr(getattr(exc.orig, "diag", None), "constraint_name", None)
        if constraint != ACTIVE_SUBJECT_INDEX:
            raise
        raise WorkflowSubmissionError(
            f"{instance.subject_type} {instance.subject_key} already has an active "
            "workflow instance."
        ) from exc
