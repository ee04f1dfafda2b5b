"""What entering each kind of node does to a branch, decided in memory.

A state is entered (visit, pending votes, history, notification, timer); a
condition routes at once; a fork starts one child per edge; a join waits for
its scope, then a merged branch goes on; an end completes the branch.
`finish` syncs the subject's state and finalizes an instance left with none.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from engine.base.errors import StateWorkflowError
from engine.graphs.design.model import Node
from engine.graphs.moves.directory import effective_assignees
from engine.graphs.moves.history import state_name
from engine.graphs.moves.notifications import (
    assignment_event,
    assignment_template_of,
    completion_event,
)
from engine.graphs.moves.states import BranchState
from engine.graphs.moves.subjects import subject_class
from engine.graphs.moves.unit import Unit
from engine.graphs.moves.write_document import write
from engine.graphs.moves.writes import KEEP, SubjectWrite, synced_state
from engine.graphs.tables import (
    APPROVED,
    ASSIGNMENT,
    CANCELLED,
    COMPLETED,
    COMPLETION,
    CONDITION,
    END,
    FORK,
    JOIN,
    REJECTED,
    STATE,
    STATUS_CHANGE,
)

log = logging.getLogger("duly.graphs")

MAX_AUTOMATIC_HOPS = 64  # conditions, forks and joins one transaction may pass through
NO_ASSIGNEES = "no_effective_assignees"


async def dispatch(unit: Unit, branch: BranchState, target: Node, hops: int = 0) -> str | None:
    """Send `branch` to `target`; the last business state code if it ended at an END."""
    if hops > MAX_AUTOMATIC_HOPS:
        raise StateWorkflowError(
            f"The graph passes through more than {MAX_AUTOMATIC_HOPS} conditions, forks and "
            f"joins without reaching a state (last: {target.title!r})."
        )
    if target.node_type == STATE:
        await enter_state(unit, branch, target)
        return None
    if target.node_type == CONDITION:
        return await route_condition(unit, branch, target, hops)
    if target.node_type == FORK:
        return await fire_fork(unit, branch, target, hops)
    if target.node_type == JOIN:
        return await arrive_at_join(unit, branch, target, hops)
    if target.node_type == END:
        return await complete_at_end(unit, branch, target, hops)
    raise StateWorkflowError(
        f"A branch cannot move to {target.title!r}: its type {target.node_type!r} is not a "
        "state, condition, fork, join or end."
    )


async def enter_state(unit: Unit, branch: BranchState, node: Node) -> None:
    """Move `branch` to a state: visit, pending votes, history, notification, timer."""
    branch.node_id = node.id
    branch.last_code = node.state_code or branch.last_code
    unit.touch(branch)
    visit_id = unit.enter(branch, node)
    assignees = await effective_assignees(unit.directory, node.assignee_users, node.assignee_groups)
    branch.assignees = assignees
    unit.writes.votes_new.extend((visit_id, person) for person in assignees)
    if unit.starting:
        message = f"Workflow started in state {node.title!r}."
        unit.starting = False
    else:
        message = f"State {node.title!r} assigned to {', '.join(assignees) or 'nobody'}."
    unit.record(
        ASSIGNMENT,
        message,
        node,
        visit_id,
        state_code=node.state_code,
        to_state=state_name(node),
        branch_id=branch.id,
        assignees=assignees,
    )
    if not assignees:
        unit.record(
            STATUS_CHANGE,
            f"State {node.title!r} has no effective assignees: nobody can move it.",
            node,
            visit_id,
            state_code=node.state_code,
            branch_id=branch.id,
            warning=NO_ASSIGNEES,
        )
    if assignees or node.notify_originator:
        template = node.assignment_template
        if not unit.version_active:
            template = await assignment_template_of(unit.conn, unit.tables, unit.graph, node)
        unit.events.append(
            assignment_event(
                unit.instance, unit.graph, node, branch.id, visit_id, assignees, template
            )
        )


async def route_condition(unit: Unit, branch: BranchState, node: Node, hops: int) -> str | None:
    """Ask the condition's predicate and follow its true or false edge."""
    name = node.condition
    if not name or name not in unit.conditions:
        raise StateWorkflowError(
            f"Condition {node.title!r} names no registered predicate ({name!r}): register it "
            "with ConditionRegistry.predicate."
        )
    answer = unit.conditions.evaluate(name, await unit.subject(), unit.instance.mapping())
    wanted = "true" if answer else "false"
    edge = next(
        (e for e in unit.graph.outgoing(node.id) if (e.condition_result or "") == wanted), None
    )
    if edge is None:
        raise StateWorkflowError(f"Condition {node.title!r} has no {wanted} transition.")
    target = unit.graph.node(edge.target_id)
    branch.node_id = node.id
    unit.touch(branch)
    unit.record(
        STATUS_CHANGE,
        f"Condition {node.title!r} was {wanted}: routed to {target.title!r}.",
        node,
        from_state=state_name(node),
        to_state=state_name(target),
        to_state_type=target.node_type,
        branch_id=branch.id,
        condition=name,
        result=answer,
    )
    return await dispatch(unit, branch, target, hops + 1)


async def fire_fork(unit: Unit, branch: BranchState, fork: Node, hops: int) -> str | None:
    """Complete `branch` at the fork and start one child per outgoing edge."""
    edges = unit.graph.outgoing(fork.id)
    if len(edges) < 2:
        raise StateWorkflowError(
            f"Fork {fork.title!r} needs at least two outgoing transitions; it has {len(edges)}."
        )
    scope = uuid.uuid4()
    unit.complete(branch, fork)
    children = [
        unit.new_branch(
            edge.target_id,
            parent_branch_id=branch.id,
            fork_scope=scope,
            fork_node_id=fork.id,
            join_node_id=fork.matched_join_id,
            last_code=branch.last_code,
        )
        for edge in edges
    ]
    final: str | None = None
    for child in children:
        assert child.node_id is not None  # set from its edge just above
        final = await dispatch(unit, child, unit.graph.node(child.node_id), hops + 1) or final
    targets = []
    for child, edge in zip(children, edges, strict=True):
        target = unit.graph.node(edge.target_id)
        targets.append(
            {
                "branch_id": child.id,
                "node_id": target.id,
                "name": target.title,
                "node_type": target.node_type,
                "state_code": target.state_code,
                "assignees": child.assignees,
            }
        )
    names = ", ".join(repr(t["name"]) for t in targets)
    unit.record(
        ASSIGNMENT,
        f"Fork {fork.title!r} started {len(children)} branches: {names}.",
        fork,
        branch_id=branch.id,
        fork_scope=scope,
        fork_node=fork.id,
        join_node=fork.matched_join_id,
        targets=targets,
    )
    return final


async def arrive_at_join(unit: Unit, branch: BranchState, join: Node, hops: int) -> str | None:
    """Complete `branch` at the join; the last of its scope merges and continues."""
    scope = branch.fork_scope
    unit.complete(branch, join)
    waiting = await still_in_scope(unit, scope)
    if waiting:
        unit.record(
            STATUS_CHANGE,
            f"Branch {branch.number} reached join {join.title!r}; "
            f"{len(waiting)} branch(es) of its fork still running.",
            join,
            branch_id=branch.id,
            fork_scope=scope,
            join_node=join.id,
        )
        return None
    return await merge_at_join(unit, branch, join, hops)


async def merge_at_join(unit: Unit, last: BranchState, join: Node, hops: int) -> str | None:
    """Nothing of `last`'s scope is running: a merged branch continues from the join."""
    scope, parent_id = last.fork_scope, last.parent_branch_id
    parent = await unit.branch(parent_id) if parent_id is not None else None
    # The merged branch takes the parent's place in the flow that entered the fork, so a
    # nested join restores the outer scope.
    merged = unit.new_branch(
        join.id,
        parent_branch_id=parent.parent_branch_id if parent else None,
        fork_scope=parent.fork_scope if parent else None,
        fork_node_id=parent.fork_node_id if parent else None,
        join_node_id=parent.join_node_id if parent else None,
        last_code=last.last_code,
    )
    unit.record(
        ASSIGNMENT,
        f"Join {join.title!r} activated.",
        join,
        branch_id=merged.id,
        fork_scope=scope,
        fork_node=last.fork_node_id,
        join_node=join.id,
    )
    edges = unit.graph.outgoing(join.id)
    if len(edges) != 1:
        log.error(
            "graph %s v%s: join %r has %d outgoing transitions, not one; instance %s waits there",
            unit.graph.name,
            unit.graph.version,
            join.title,
            len(edges),
            unit.instance.id,
        )
        unit.enter(merged, join)
        return None
    target = unit.graph.node(edges[0].target_id)
    unit.record(
        STATUS_CHANGE,
        f"Join {join.title!r} continued automatically to {target.title!r}.",
        join,
        from_state=state_name(join),
        to_state=state_name(target),
        to_state_type=target.node_type,
        branch_id=merged.id,
        fork_scope=scope,
        join_node=join.id,
    )
    return await dispatch(unit, merged, target, hops + 1)


async def still_in_scope(unit: Unit, scope: uuid.UUID | None) -> list[BranchState]:
    """The active branches of `scope`, or of a fork nested inside it (by uuid, never by node).

    A branch inside a nested fork carries the inner scope; its ancestors
    carry the outer one, so the walk up its parents finds it.
    """
    active = unit.active()
    if any(b.fork_scope == scope for b in active):
        return [b for b in active if b.fork_scope == scope]
    if any(b.parent_branch_id is not None and b.parent_branch_id not in unit.known for b in active):
        await unit.read_all_branches()
    return [b for b in active if _inside(unit, b, scope)]


def _inside(unit: Unit, branch: BranchState, scope: uuid.UUID | None) -> bool:
    seen: set[uuid.UUID] = set()
    current: BranchState | None = branch
    while current is not None and current.id not in seen:
        if current.fork_scope == scope:
            return True
        seen.add(current.id)
        parent = current.parent_branch_id
        current = unit.known.get(parent) if parent is not None else None
    return False


async def complete_at_end(unit: Unit, branch: BranchState, end: Node, hops: int) -> str | None:
    """The branch is done; the code its subject ends with: the END's own, else the last
    business state the branch was on.

    A branch of a fork that ends here may be the last one its join was
    waiting for (its siblings arrived first): the join fires now.
    """
    unit.complete(branch, end)
    fired, final = await release_join(unit, branch, hops)
    return final if fired else end.state_code or branch.last_code


async def release_join(unit: Unit, ended: BranchState, hops: int) -> tuple[bool, str | None]:
    """Fire the join whose arrivals waited only for `ended`; whether one fired, and its end.

    Walks out from the ended branch's scope: a scope with nothing running
    and arrivals at its join fires it; one with no arrivals (every branch
    ended at an END) leaves its enclosing scope to decide.
    """
    current: BranchState | None = ended
    while current is not None and current.fork_scope is not None:
        scope, join_id = current.fork_scope, current.join_node_id
        if await still_in_scope(unit, scope):
            return False, None
        await unit.read_all_branches()
        arrived = [
            b
            for b in unit.known.values()
            if b.fork_scope == scope and b.status == COMPLETED and b.node_id == join_id
        ]
        if arrived and join_id is not None:
            first = min(arrived, key=BranchState.order)
            first.last_code = ended.last_code
            return True, await merge_at_join(unit, first, unit.graph.node(join_id), hops + 1)
        parent_id = current.parent_branch_id
        current = await unit.branch(parent_id) if parent_id is not None else None
    return False, None


def finish(unit: Unit, final_code: str | None, *, write_subject: bool = False) -> None:
    """Sync the subject's state and the instance's current node; finalize when nothing is left."""
    instance = unit.instance
    node_id, code = synced_state(unit.graph, unit.branches(), final_code)
    instance.current_node_id = node_id
    if code is not KEEP and (code != instance.state_code or write_subject):
        instance.state_code = code if isinstance(code, str) else None
        unit.writes.subject = SubjectWrite(
            subject_class(instance.subject_type), instance.subject_key, instance.state_code
        )
    if unit.active():
        return
    instance.state_status = COMPLETED
    instance.status = APPROVED
    instance.is_active = False
    instance.is_completed = True
    instance.completing = True
    instance.current_node_id = None
    unit.record(
        COMPLETION,
        f"Workflow completed in state {instance.state_code!r}.",
        state_code=instance.state_code,
    )
    unit.events.append(completion_event(instance, unit.graph, instance.state_code))


def cancel_instance(unit: Unit, branches: list[BranchState], reason: str) -> None:
    """Cancel every active branch, reject their visits, end the instance, clear the subject.

    `is_active` goes false too, so the subject may be submitted again.
    """
    instance = unit.instance
    for branch in branches:
        unit.known[branch.id] = branch
        unit.end_visit(branch, REJECTED)
        branch.status = CANCELLED
        branch.completing = True
        unit.touch(branch)
    previous = instance.state_code
    instance.state_status = CANCELLED
    instance.status = REJECTED
    instance.is_active = False
    instance.is_completed = True
    instance.completing = True
    instance.current_node_id = None
    instance.state_code = None
    unit.record(
        STATUS_CHANGE,
        "Workflow cancelled" + (f": {reason}" if reason else "."),
        state_code=previous,
        to_state=CANCELLED,
        comment=reason or None,
        branches=[branch.id for branch in branches],
    )
    cls = subject_class(instance.subject_type)
    unit.writes.subject = SubjectWrite(cls, instance.subject_key, None)


async def save(unit: Unit) -> datetime | None:
    """Write what the unit decided, in one statement of its transaction (never committing it).

    Returns the time it wrote, or None when there was nothing to write.
    """
    writes = unit.writes
    # Every write of an instance's branches or visits updates its row too: a lock that
    # waited tells a stale read by the row's version (engine.graphs.moves.locks).
    writes.instance_changed = unit.before != unit.instance or bool(
        writes.branches or writes.visits_new or writes.visits_ended
    )
    return await write(unit.conn, unit.tables, writes)
