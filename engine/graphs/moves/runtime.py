"""The runtime of graph workflows: submit a subject, move its branches, cancel, read.

    runtime = GraphRuntime(graph_tables(Base), directory=directory, conditions=conditions)
    instance = await runtime.submit(expense, "ann", template_name="expense-approval")
    await runtime.transition_branch(instance.id, branch_id, target_id, "bob", "fine")

Who acts is a user id, or an `Actor` (the user, their credential's groups,
who acted on their behalf).

Each write owns one transaction on the runtime's engine (`submit` may join
the caller's instead): lock, decide in memory, write, publish, commit.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from contextlib import AbstractAsyncContextManager
from functools import lru_cache
from typing import Any

from sqlalchemy import Select, Uuid, bindparam, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from engine.base.errors import (
    NotConnectedError,
    NotFoundError,
    StateWorkflowError,
    WorkflowAlreadyCompletedError,
)
from engine.events.database import DatabaseEventRegistry
from engine.events.routing import EventRegistry
from engine.graphs.design.model import Edge, Graph, Node, load_graph
from engine.graphs.moves.actors import Actor
from engine.graphs.moves.conditions import ConditionRegistry
from engine.graphs.moves.directory import (
    Directory,
    StaticDirectory,
    admitted,
    effective_assignees,
)
from engine.graphs.moves.dispatch import cancel_instance, dispatch, finish, save
from engine.graphs.moves.history import HistoryEntry, read_history
from engine.graphs.moves.locks import live_branches, lock_branch, lock_instance, refuse_inactive
from engine.graphs.moves.notifications import (
    chosen_registry,
    kick_outbox,
    publish_after_caller_commits,
    publish_in_transaction,
    publish_now,
)
from engine.graphs.moves.refusals import (
    initial_node,
    refuse_actor,
    refuse_move,
    refused_if_in_a_workflow,
    self_approval,
)
from engine.graphs.moves.snapshots import AvailableTransition, InstanceSnapshot, TransitionOutcome
from engine.graphs.moves.states import BranchState, InstanceState
from engine.graphs.moves.subjects import show_state, state_column, subject_ref
from engine.graphs.moves.submits import (
    owned,
    refuse_submitter,
    self_approver,
    submitted_version,
)
from engine.graphs.moves.timers import escalate_visit, register_escalation
from engine.graphs.moves.unit import Unit
from engine.graphs.moves.votes import Tally, vote, voted_branches
from engine.graphs.moves.writes import Writes
from engine.graphs.tables import (
    ACTIVE,
    CREATION,
    IN_REVIEW,
    STATE,
    GraphTables,
)
from engine.model.connection import current_connection

__all__ = [
    "Actor",
    "AvailableTransition",
    "GraphRuntime",
    "HistoryEntry",
    "InstanceSnapshot",
    "TransitionOutcome",
]

log = logging.getLogger("duly.graphs")


@lru_cache(maxsize=64)
def instance_statement(tables: GraphTables) -> Select[Any]:
    """One instance by :instance_id, unlocked."""
    instances = tables.table("instance")
    return select(instances).where(instances.c.id == bindparam("instance_id", type_=Uuid()))


class GraphRuntime:
    """Runs graph workflows on one application's graph tables."""

    def __init__(
        self,
        tables: GraphTables,
        *,
        directory: Directory | None = None,
        conditions: ConditionRegistry | None = None,
        events: EventRegistry | None = None,
        engine: AsyncEngine | None = None,
    ) -> None:
        self.tables = tables
        self.directory: Directory = directory if directory is not None else StaticDirectory()
        self.conditions = conditions if conditions is not None else ConditionRegistry()
        self.events = events
        self._engine = engine
        if tables.timer is not None:
            # The expired deadlines of these tables escalate through this runtime in the
            # application current where it is built (an application given it takes it too).
            register_escalation(tables.timer.__table__.name, self.escalate)

    def reading(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A transaction for reads, ended by a COMMIT: psycopg forgets every statement it
        prepared on a connection when it rolls back, which is how a connection that only
        read would otherwise go back to the pool, and the moves would be planned anew."""
        return self.engine.begin()

    @property
    def engine(self) -> AsyncEngine:
        """The engine each write opens its transaction on."""
        if self._engine is not None:
            return self._engine
        return current_connection().engine

    # -- submit ----------------------------------------------------------------------------

    async def submit(
        self,
        subject: Any,
        user: str | Actor | None,
        *,
        template_name: str | None = None,
        template_id: uuid.UUID | None = None,
        session: AsyncSession | AsyncConnection | None = None,
    ) -> InstanceSnapshot:
        """Start the active version of `template_name` (or `template_id`) on `subject`.

        Any other version is TemplateNotActiveError; a user the template does
        not take submits from, SubmitterNotAllowedError. Joins `session`'s
        transaction when given (never committing it), else commits its own.
        """
        subject_ref(subject)  # refused now: not a subject, or not flushed yet
        state_column(type(subject))  # a subject without its state column is refused now
        registry = chosen_registry(self.events)
        actor = None if user is None else Actor.of(user)
        if session is not None:
            conn = session if isinstance(session, AsyncConnection) else await session.connection()
            unit = await self._submit(conn, subject, actor, template_name, template_id)
            async with conn.begin_nested():  # a refusal leaves the caller's transaction usable
                with refused_if_in_a_workflow(unit.instance):
                    await save(unit)
            if not await publish_in_transaction(conn, registry, unit.events):
                publish_after_caller_commits(session, registry, unit.events)
        else:
            async with self.engine.begin() as conn:
                unit = await self._submit(conn, subject, actor, template_name, template_id)
                with refused_if_in_a_workflow(unit.instance):
                    stored = await save_with_events(unit, registry)
            await self._after_commit(registry, unit, stored)
        show_state(subject, unit.instance.state_code)
        return InstanceSnapshot.of(unit.instance, unit.graph, unit.branches())

    async def _submit(
        self,
        conn: AsyncConnection,
        subject: Any,
        actor: Actor | None,
        template_name: str | None,
        template_id: uuid.UUID | None,
    ) -> Unit:
        subject_type, subject_key = subject_ref(subject)
        template_id = await submitted_version(conn, self.tables, template_name, template_id)
        graph = await load_graph(conn, self.tables, template_id)
        refuse_submitter(graph, subject, actor)
        target = initial_node(graph, self.conditions)
        instance = InstanceState(
            id=uuid.uuid4(),
            template_id=graph.template_id,
            subject_type=subject_type,
            subject_key=subject_key,
            state_status=ACTIVE,
            status=IN_REVIEW,
            current_node_id=None,
            state_code=None,
            is_active=True,
            is_completed=False,
            branch_count=0,
            submitted_by=None if actor is None else actor.user,
            new=True,
        )
        unit = self._unit(conn, graph, instance, actor)
        unit.version_active = True  # only the active version starts, share-locked just now
        unit.subject_row = subject
        unit.starting = True
        unit.record(
            CREATION,
            f"Submitted to {graph.name!r} (version {graph.version}).",
            workflow=graph.name,
            version=graph.version,
            template_id=graph.template_id,
        )
        branch = unit.new_branch(target.id)
        final = await dispatch(unit, branch, target)
        finish(unit, final, write_subject=True)
        return unit

    # -- transitions -----------------------------------------------------------------------

    async def transitions_for(
        self, instance_id: uuid.UUID, user: str | Actor
    ) -> list[AvailableTransition]:
        """Per active branch, the edges `user` may take now (in order, then id); none where
        they have voted already, none for whom the template forbids self-approval."""
        actor = Actor.of(user)
        async with self.reading() as conn:
            instance, graph = await self._read_instance(conn, instance_id)
            if instance.state_status != ACTIVE:
                return []
            unit = self._unit(conn, graph, instance, actor)
            if self_approval(actor, await self._self_approver(unit)):
                return []
            branches = await live_branches(conn, self.tables, instance.id)
            voted = await voted_branches(conn, self.tables, instance.id, actor.user)
            available = []
            for branch in sorted(branches, key=BranchState.order):
                source = graph.nodes.get(branch.node_id) if branch.node_id else None
                if source is None or source.node_type != STATE or branch.id in voted:
                    continue
                if actor.user not in await self._assignees(source, actor):
                    continue
                for edge in graph.outgoing(source.id):
                    if edge.escalation or not await self._guard_allows(unit, edge):
                        continue
                    target = graph.node(edge.target_id)
                    available.append(AvailableTransition.of(branch.id, source, edge, target))
            return available

    async def transition_branch(
        self,
        instance_id: uuid.UUID,
        branch_id: uuid.UUID,
        target_id: uuid.UUID,
        user: str | Actor,
        comment: str = "",
        *,
        source_node_id: uuid.UUID | None = None,
    ) -> TransitionOutcome:
        """`user` moves a branch to `target_id`, or votes toward it; one transaction.

        `source_node_id`, when given, is the state the user saw the branch on:
        if it has moved on since, the transition is refused saying so. A user
        who is not an assignee is refused (StateWorkflowError), the owner (else
        the submitter) where the template forbids self-approval
        (SelfApprovalError), and a second vote at the visit (AlreadyVotedError).
        """
        registry = chosen_registry(self.events)
        async with self.engine.begin() as conn:
            unit, tally = await self._transition(
                conn,
                instance_id,
                branch_id,
                target_id,
                Actor.of(user),
                comment,
                source_node_id,
            )
            stored = await save_with_events(unit, registry)
        await self._after_commit(registry, unit, stored)
        snapshot = InstanceSnapshot.of(unit.instance, unit.graph, unit.branches())
        return TransitionOutcome(
            instance=snapshot,
            moved=tally.moved,
            branch_id=branch_id,
            target_id=target_id,
            approved_count=tally.approved_count,
            required_approvals=tally.required_approvals,
            threshold=tally.threshold,
        )

    async def _transition(
        self,
        conn: AsyncConnection,
        instance_id: uuid.UUID,
        branch_id: uuid.UUID,
        target_id: uuid.UUID,
        actor: Actor,
        comment: str,
        source_node_id: uuid.UUID | None,
    ) -> tuple[Unit, Tally]:
        locked = await lock_branch(conn, self.tables, instance_id, branch_id)
        instance, branch_status, node_id = (
            locked.instance,
            locked.branch_status,
            locked.branch_node_id,
        )
        graph = await load_graph(conn, self.tables, instance.template_id)
        source, target, edge = refuse_move(
            graph, branch_id, branch_status, node_id, target_id, source_node_id
        )
        listed = await self._assignees(source)
        unit = self._unit(conn, graph, instance, actor)
        approver = await self._self_approver(unit)
        assignees = admitted(listed, source.assignee_groups, actor)
        refuse_actor(graph, source, actor, assignees, approver)
        if edge.comment_required and not comment.strip():
            raise StateWorkflowError(
                f"Moving from {source.title!r} to {target.title!r} requires a comment."
            )
        if not await self._guard_allows(unit, edge):
            raise StateWorkflowError(
                f"The transition from {source.title!r} to {target.title!r} is not allowed now "
                f"({edge.condition!r} answered no)."
            )
        unit.version_active = locked.version_active
        for live in locked.live:
            unit.known[live.id] = live
        branch = unit.known[branch_id]
        if branch.visit_id is None:
            raise StateWorkflowError(
                f"Branch {branch_id} has no current visit of {source.title!r}."
            )
        return unit, await vote(unit, branch, source, target, listed, comment)

    # -- escalation ------------------------------------------------------------------------

    async def escalate(
        self, instance_id: uuid.UUID, branch_id: uuid.UUID, visit_id: uuid.UUID
    ) -> bool:
        """A visit's deadline passed: move its branch along the state's escalation edge.

        The system acts (no actor, no vote). Nothing happens, and False is
        returned, unless the instance is active and the visit still current.
        """
        registry = chosen_registry(self.events)
        async with self.engine.begin() as conn:
            unit = await self._escalation(conn, instance_id, branch_id, visit_id)
            if unit is None:
                return False
            stored = await save_with_events(unit, registry)
        await self._after_commit(registry, unit, stored)
        return True

    async def _escalation(
        self,
        conn: AsyncConnection,
        instance_id: uuid.UUID,
        branch_id: uuid.UUID,
        visit_id: uuid.UUID,
    ) -> Unit | None:
        try:
            locked = await lock_branch(conn, self.tables, instance_id, branch_id)
        except (NotFoundError, WorkflowAlreadyCompletedError, StateWorkflowError):
            return None  # gone, finished, or not its branch: nothing to escalate
        instance, node_id = locked.instance, locked.branch_node_id
        if locked.branch_status != ACTIVE or node_id is None:
            return None
        graph = await load_graph(conn, self.tables, instance.template_id)
        unit = self._unit(conn, graph, instance, None)
        unit.version_active = locked.version_active
        for live in locked.live:
            unit.known[live.id] = live
        branch = unit.known.get(branch_id)
        if branch is None or branch.visit_id != visit_id:
            return None  # the state was left meanwhile
        moved = await escalate_visit(unit, branch, graph.node(node_id))
        return unit if moved else None

    # -- cancel ----------------------------------------------------------------------------

    async def cancel(
        self, instance_id: uuid.UUID, user: str | Actor | None = None, reason: str = ""
    ) -> InstanceSnapshot:
        """Cancel an active instance: its branches, their visits, its subject's state."""
        actor = None if user is None else Actor.of(user)
        registry = chosen_registry(self.events)
        async with self.engine.begin() as conn:
            instance = await lock_instance(conn, self.tables, instance_id)
            refuse_inactive(instance)
            graph = await load_graph(conn, self.tables, instance.template_id)
            unit = self._unit(conn, graph, instance, actor)
            cancel_instance(unit, await live_branches(conn, self.tables, instance.id), reason)
            stored = await save_with_events(unit, registry)
        await self._after_commit(registry, unit, stored)
        return InstanceSnapshot.of(unit.instance, graph, unit.branches())

    # -- reading ---------------------------------------------------------------------------

    async def instance(self, instance_id: uuid.UUID) -> InstanceSnapshot:
        """The instance with its active branches."""
        async with self.reading() as conn:
            instance, graph = await self._read_instance(conn, instance_id)
            branches = await live_branches(conn, self.tables, instance.id)
        return InstanceSnapshot.of(instance, graph, branches)

    async def history(self, instance_id: uuid.UUID) -> list[HistoryEntry]:
        """The instance's history, in the order it happened."""
        async with self.reading() as conn:
            entries = await read_history(conn, self.tables, instance_id)
            if not entries:  # every instance has its CREATION row: an empty one is missing
                await self._read_instance(conn, instance_id)
        return entries

    async def _read_instance(
        self, conn: AsyncConnection, instance_id: uuid.UUID
    ) -> tuple[InstanceState, Graph]:
        row = (
            (await conn.execute(instance_statement(self.tables), {"instance_id": instance_id}))
            .mappings()
            .first()
        )
        if row is None:
            raise NotFoundError(f"No graph workflow instance has the id {instance_id}.")
        instance = InstanceState.of(row)
        return instance, await load_graph(conn, self.tables, instance.template_id)

    # -- helpers ---------------------------------------------------------------------------

    def _unit(
        self, conn: AsyncConnection, graph: Graph, instance: InstanceState, actor: Actor | None
    ) -> Unit:
        return Unit(
            conn=conn,
            tables=self.tables,
            graph=graph,
            writes=Writes(instance),
            directory=self.directory,
            conditions=self.conditions,
            actor=None if actor is None else actor.user,
            acted_by=None if actor is None else actor.acted_by,
        )

    async def _assignees(self, node: Node, actor: Actor | None = None) -> list[str]:
        """Who may move `node`: its users, its groups' members, and `actor` by their groups."""
        return await effective_assignees(
            self.directory, node.assignee_users, node.assignee_groups, actor
        )

    async def _self_approver(self, unit: Unit) -> str | None:
        """Who may not move the instance (its subject's owner, else its submitter) where the
        template forbids self-approval; None where it does not (the subject left unread)."""
        if not unit.graph.forbid_self_approval:
            return None
        if not owned(unit.instance.subject_type):
            return unit.instance.submitted_by
        return self_approver(unit.instance.submitted_by, await unit.subject())

    async def _guard_allows(self, unit: Unit, edge: Edge) -> bool:
        """A manual guard (a predicate named on the edge) must answer yes; none always does."""
        if not edge.condition:
            return True
        if edge.condition not in self.conditions:
            return False
        return self.conditions.evaluate(
            edge.condition, await unit.subject(), unit.instance.mapping()
        )

    async def _after_commit(self, registry: EventRegistry, unit: Unit, stored: bool) -> None:
        """Publish to a registry that does not store events; kick this process's workers."""
        if stored:
            kick_outbox(registry)
        elif unit.events:
            await publish_now(registry, unit.events)
        timer = self.tables.timer
        if unit.writes.timers_new and timer is not None:
            # Nobody connected here to tell: NOTIFY tells the workers of other processes.
            with contextlib.suppress(NotConnectedError):
                current_connection().kick(timer.__table__.name)


async def save_with_events(unit: Unit, registry: EventRegistry) -> bool:
    """Write what `unit` decided, and its notifications when `registry` stores them, in one
    statement of the unit's transaction (never committing it); whether the notifications
    were stored (else they are told after the commit)."""
    if not (isinstance(registry, DatabaseEventRegistry) and unit.events):
        await save(unit)
        return False
    unit.writes.publish(registry.tables(), unit.events)
    await save(unit)
    return True
