"""The rows of a move's write as one JSON document, and the write run in the move's transaction."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from engine.events.database import event_values
from engine.graphs.moves.states import BranchState
from engine.graphs.moves.subjects import key_values
from engine.graphs.moves.write_parts import INSTANCE_CHANGED
from engine.graphs.moves.write_statement import (
    DOCUMENT,
    INSTANCE_ID,
    write_statement,
)
from engine.graphs.moves.writes import Shape, Writes
from engine.graphs.tables import GraphTables
from engine.model.telemetry import duplicates_ignored


async def write(conn: AsyncConnection, tables: GraphTables, writes: Writes) -> datetime | None:
    """Write everything `writes` gathered in one statement of `conn`'s transaction.

    Returns the time it wrote (the database clock's, the same for every
    row), None when there was nothing to write. New rows and completed ones
    are given that time here, so a snapshot needs no second read.
    """
    shape = Shape.of(writes)
    if shape.empty:
        return None
    result = (await conn.execute(write_statement(tables, shape), parameters(writes, shape))).one()
    if shape.events is not None:
        duplicates_ignored("database", len(writes.events) - result.events_queued)
    now: datetime = result.written_at
    instance = writes.instance
    if instance.new:
        instance.submitted_at = now
    if instance.completing:
        instance.completed_at = now
    for branch in writes.branches.values():
        if branch.new:
            branch.started_at = now
        if branch.completing:
            branch.completed_at = now
    return now


def parameters(writes: Writes, shape: Shape) -> dict[str, Any]:
    """The values of `write_statement(tables, shape)` for `writes`: the id and the document."""
    instance = writes.instance
    document: dict[str, list[dict[str, Any]]] = {}
    if shape.instance_new or shape.instance_changed:
        row = {name: getattr(instance, name) for name, _ in INSTANCE_CHANGED[1:-1]}
        row.update(id=instance.id, done=instance.completing)
        if shape.instance_new:
            row.update(
                template_id=instance.template_id,
                subject_type=instance.subject_type,
                subject_key=instance.subject_key,
                submitted_by=instance.submitted_by,
            )
        document["instance"] = [row]
    touched = list(writes.branches.values())
    if shape.branches_new:
        document["branches_new"] = [_branch_values(b) for b in touched if b.new]
    if shape.branches_changed:
        document["branches_changed"] = [
            _branch_values(b) for b in touched if b.changed and not b.new
        ]
    if shape.visits_new:
        document["visits_new"] = [
            {
                "id": v.id,
                "branch_id": v.branch_id,
                "node_id": v.node_id,
                "step": v.offset,
                "seconds": v.deadline_seconds,
            }
            for v in writes.visits_new
        ]
    if shape.visits_ended:
        document["visits_ended"] = [
            {"id": key, "status": value} for key, value in writes.visits_ended.items()
        ]
    if writes.vote_cast is not None:
        vote = writes.vote_cast
        document["vote_cast"] = [
            {
                "id": uuid.uuid4(),
                "visit_id": vote.visit_id,
                "approver": vote.approver,
                "target": vote.target_id,
                "comment": vote.comment,
            }
        ]
    if shape.votes_closed:
        keep = writes.vote_cast.approver if writes.vote_cast is not None else None
        document["votes_closed"] = [
            {"visit_id": visit, "keep": keep} for visit in writes.votes_closed
        ]
    if shape.votes_new:
        document["votes_new"] = [
            {"id": uuid.uuid4(), "visit_id": visit, "approver": approver}
            for visit, approver in writes.votes_new
        ]
    if shape.history:
        document["history"] = [
            {
                "position": number,
                "visit_id": h.visit_id,
                "action_type": h.action_type,
                "actor": h.actor,
                "acted_by": h.acted_by,
                "step_name": h.step_name,
                "message": h.message,
                "details": h.details,
            }
            for number, h in enumerate(writes.history)
        ]
    subject_key: tuple[Any, ...] = ()
    if writes.subject is not None:
        subject = writes.subject
        subject_key = key_values(subject.cls, subject.key)
        row = {"code": subject.code}
        for i, value in enumerate(subject_key):
            row[f"key_{i}"] = value
        document["subject"] = [row]
    if shape.timers_new:
        document["timers_new"] = [
            {"visit_id": visit, "branch_id": branch, "seconds": seconds}
            for visit, branch, seconds in writes.timers_new
        ]
    if shape.timers_cancelled:
        document["timers_cancelled"] = [{"visit_id": visit} for visit in writes.timers_cancelled]
    if shape.events is not None:
        document["events"] = [event_values(event) for event in writes.events]
    keys: dict[str, Any] = {}
    for part, key in KEYED_PARTS:
        if part in document:
            found = [row[key] for row in document[part]]
            keys[f"keys_{part}"] = found[0] if shape.single_keys else found
    keys.update({f"keys_subject_key_{i}": value for i, value in enumerate(subject_key)})
    return {INSTANCE_ID: instance.id, DOCUMENT: json.dumps(document, default=str), **keys}


# The parts whose rows an UPDATE finds by key, and the field that holds it (see `_among`).
KEYED_PARTS = (("branches_changed", "id"), ("visits_ended", "id"), ("votes_closed", "visit_id"))


def _branch_values(branch: BranchState) -> dict[str, Any]:
    return {
        "id": branch.id,
        "number": branch.number,
        "node": branch.node_id,
        "parent": branch.parent_branch_id,
        "scope": branch.fork_scope,
        "fork_node": branch.fork_node_id,
        "join_node": branch.join_node_id,
        "status": branch.status,
        "done": branch.completing,
    }
