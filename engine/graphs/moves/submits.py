"""What a submit may start and who may make it: a template's active version only, and the
template's rule of who submits (anyone, the subject's owner, or a role).

Every door's submit goes through `GraphRuntime.submit`, which asks these in
its transaction before anything is written.
"""

from __future__ import annotations

import contextlib
import uuid
from functools import lru_cache
from typing import Any

from sqlalchemy import Select, Text, Uuid, bindparam, select
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.base.errors import (
    ConfigurationError,
    NotFoundError,
    SubmitterNotAllowedError,
    TemplateNotActiveError,
)
from engine.graphs.design.model import Graph
from engine.graphs.moves.actors import Actor
from engine.graphs.moves.subjects import subject_class, subject_owner, subject_ref
from engine.graphs.tables import ANY_SUBMITTER, OWNER_SUBMITS, SUBMITTER_ROLES, GraphTables


@lru_cache(maxsize=64)
def active_template_statement(tables: GraphTables) -> Select[Any]:
    """The id of the active version named :name, share-locked until the submit commits."""
    templates = tables.table("template")
    return (
        select(templates.c.id)
        .where(templates.c.name == bindparam("name", type_=Text()), templates.c.is_active)
        .with_for_update(read=True)
    )


@lru_cache(maxsize=64)
def version_statement(tables: GraphTables) -> Select[Any]:
    """The name, version and activity of the version :template_id, share-locked."""
    templates = tables.table("template")
    return (
        select(templates.c.name, templates.c.version, templates.c.is_active)
        .where(templates.c.id == bindparam("template_id", type_=Uuid()))
        .with_for_update(read=True)
    )


async def submitted_version(
    conn: AsyncConnection,
    tables: GraphTables,
    template_name: str | None,
    template_id: uuid.UUID | None,
) -> uuid.UUID:
    """The version a submit starts: the active one of `template_name`, or `template_id` when
    it is its name's active version (TemplateNotActiveError for a draft, an older or an
    invalid version). The row stays share-locked, so no activation slips in meanwhile."""
    if template_id is None:
        if template_name is None:
            raise ConfigurationError("submit() needs a template_name or a template_id.")
        for _ in range(2):  # a second look sees an activation the first one waited for
            found = (
                await conn.execute(active_template_statement(tables), {"name": template_name})
            ).scalar()
            if found is not None:
                return uuid.UUID(str(found))
        raise NotFoundError(f"No active graph template is named {template_name!r}.")
    row = (await conn.execute(version_statement(tables), {"template_id": template_id})).first()
    if row is None:
        raise NotFoundError(f"No graph template has the id {template_id}.")
    if not row.is_active or (template_name is not None and row.name != template_name):
        raise TemplateNotActiveError(
            f"Version {row.version} of {row.name!r} is not the active version "
            f"{'of ' + repr(template_name) if template_name else 'of its template'}: "
            "a submit starts only the active version (name the template instead)."
        )
    return template_id


def refuse_submitter(graph: Graph, subject: Any, actor: Actor | None) -> None:
    """SubmitterNotAllowedError when the template's rule of who submits excludes `actor`:
    `owner` takes only the subject's owner (its class's owner column), a role only holders."""
    rule = graph.submitters
    if rule == ANY_SUBMITTER:
        return
    table, key = subject_ref(subject)
    if rule == OWNER_SUBMITS:
        if not getattr(type(subject), "__graph_owner_column__", None):
            raise SubmitterNotAllowedError(
                f"{graph.name!r} takes submits from a subject's owner only, and {table} "
                "maps no owner column (__graph_owner_column__)."
            )
        if actor is None or actor.user != subject_owner(subject):
            raise SubmitterNotAllowedError(
                f"Only the owner of {table} {key} may submit it to {graph.name!r}."
            )
        return
    if rule not in SUBMITTER_ROLES or actor is None or rule not in actor.roles:
        raise SubmitterNotAllowedError(f"{graph.name!r} takes submits from the {rule!r} role only.")


def owned(subject_type: str) -> bool:
    """Whether the subject class mapped on `subject_type` names an owner column."""
    with contextlib.suppress(NotFoundError):
        return bool(getattr(subject_class(subject_type), "__graph_owner_column__", None))
    return False


def self_approver(submitted_by: str | None, subject: Any) -> str | None:
    """Who may not move or vote an instance where the template forbids self-approval: the
    subject's owner when its class maps one and the row names one, else the submitter."""
    return subject_owner(subject) or submitted_by
