"""Template versions in the database: the designer's load and save, activation, listing.

A save is always a new, inactive version of its name; only activation
refuses an invalid graph. Every function runs in the caller's transaction
and never commits.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, func, insert, literal, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.base.errors import NotFoundError, TemplateInvalidError
from engine.graphs.design.document import (
    Design,
    build_graph,
    drawn_design,
    parse_design,
    stored_design,
)
from engine.graphs.design.joins import resolve_matched_joins
from engine.graphs.design.model import (
    Graph,
    edge_values,
    node_values,
    read_graph,
    stored_submitters,
)
from engine.graphs.design.problems import Problem
from engine.graphs.design.validation import validate_graph
from engine.graphs.tables import ANY_SUBMITTER, TEMPLATES, GraphTables

SAVED_MESSAGE = "Workflow saved successfully"
WORKFLOW_KIND = "state_based"  # the only kind of workflow duly's graphs have
MAX_NAMED_ERRORS = 3  # validation errors named in a refused activation's message


@dataclass(frozen=True)
class SavedDesign:
    """A saved version, and the validation problems it was saved with."""

    template_id: uuid.UUID
    version: int
    graph: Graph
    problems: tuple[Problem, ...]

    @property
    def errors(self) -> list[str]:
        """The problems as a save's response lists them ("S16: 'Closed' has no ...")."""
        return [str(problem) for problem in self.problems]

    def response(self) -> dict[str, Any]:
        """The response body of a save, as the designer reads it."""
        return {
            "success": True,
            "message": SAVED_MESSAGE,
            "step_count": len(self.graph.nodes),
            "template_id": str(self.template_id),
            "version": self.version,
            "errors": self.errors,
        }


async def save_design(
    connection: AsyncConnection,
    tables: GraphTables,
    design: Design | Mapping[str, Any],
    conditions: Collection[str],
) -> SavedDesign:
    """Save the designer's graph as a new inactive version of its name.

    Bad input is a ConfigurationError and an unknown base template a
    NotFoundError, both before anything is written.
    """
    checked = design if isinstance(design, Design) else parse_design(design)
    templates = tables.table("template")
    await lock_name(connection, checked.name)
    base = await _base_template(connection, tables, checked)
    version = (
        await connection.execute(
            select(func.coalesce(func.max(templates.c.version), 0) + 1).where(
                templates.c.name == checked.name
            )
        )
    ).scalar_one()
    await connection.execute(
        update(templates)
        .where(templates.c.name == checked.name, templates.c.is_latest)
        .values(is_latest=False)
    )
    state_choices = _first_given(checked.state_choices, base, "state_choices", [])
    forbid_self_approval = bool(
        _first_given(checked.forbid_self_approval, base, "forbid_self_approval", False)
    )
    submitters = checked.submitters
    if submitters is None:
        submitters = ANY_SUBMITTER if base is None else stored_submitters(base.design)
    template_id = uuid.uuid4()
    await connection.execute(
        insert(templates).values(
            id=template_id,
            name=checked.name,
            version=version,
            is_latest=True,
            is_active=False,
            cloned_from=base.id if base is not None else None,
            description=_first_given(checked.description, base, "description", ""),
            state_choices=list(state_choices),
            design=stored_design(checked, submitters),
            forbid_self_approval=forbid_self_approval,
        )
    )
    graph = resolve_matched_joins(
        build_graph(
            checked,
            template_id=template_id,
            name=checked.name,
            version=version,
            state_choices=tuple(state_choices),
            forbid_self_approval=forbid_self_approval,
            submitters=submitters,
        )
    )
    await write_graph(connection, tables, graph)
    return SavedDesign(
        template_id=template_id,
        version=version,
        graph=graph,
        problems=tuple(validate_graph(graph, conditions)),
    )


async def write_graph(connection: AsyncConnection, tables: GraphTables, graph: Graph) -> None:
    """Write a graph's nodes and transitions under its (already written) template row."""
    nodes = tables.table("node")
    rows = [node_values(graph.template_id, node) for node in graph.nodes.values()]
    # Nodes first without their matched joins: a fork may come before its join.
    await connection.execute(insert(nodes), [{**row, "matched_join_id": None} for row in rows])
    for row in rows:
        if row["matched_join_id"] is not None:
            await connection.execute(
                update(nodes)
                .where(nodes.c.id == row["id"])
                .values(matched_join_id=row["matched_join_id"])
            )
    if graph.edges:
        await connection.execute(
            insert(tables.table("transition")),
            [edge_values(graph.template_id, edge) for edge in graph.edges],
        )


async def load_design(
    connection: AsyncConnection, tables: GraphTables, template_id: uuid.UUID
) -> dict[str, Any]:
    """The designer's view of one version: its graph, drawn, and the version's facts.

    The graph is read from the database, not the per-process cache, so the
    designer sees the rows as they are; the stored layout is used only while
    it still matches them.
    """
    template = await _template(connection, tables, template_id)
    graph = await read_graph(connection, tables, template_id)
    templates = tables.table("template")
    cloned_from_version = None
    if template.cloned_from is not None:
        cloned_from_version = (
            await connection.execute(
                select(templates.c.version).where(templates.c.id == template.cloned_from)
            )
        ).scalar_one_or_none()
    return {
        **drawn_design(template.design or {}, graph),
        "workflow_kind": WORKFLOW_KIND,
        "name": template.name,
        "description": template.description or "",
        "state_choices": list(template.state_choices or ()),
        "forbid_self_approval": bool(template.forbid_self_approval),
        "submitters": stored_submitters(template.design),
        "version": template.version,
        "is_latest": template.is_latest,
        "is_active": template.is_active,
        "template_id": str(template.id),
        "cloned_from_version": cloned_from_version,
    }


async def activate_template(
    connection: AsyncConnection,
    tables: GraphTables,
    template_id: uuid.UUID,
    conditions: Collection[str],
) -> Graph:
    """Make this version the one new instances start on; the others of its name stop being it.

    A graph with validation errors is refused (TemplateInvalidError, with
    the errors) and nothing is written. In-flight instances keep the version
    they started on.
    """
    template = await _template(connection, tables, template_id)
    await lock_name(connection, template.name)
    graph = await read_graph(connection, tables, template_id)
    problems = validate_graph(graph, conditions)
    if problems:
        errors = tuple(str(problem) for problem in problems)
        more = len(errors) - MAX_NAMED_ERRORS
        named = " ".join(errors[:MAX_NAMED_ERRORS]) + (f" And {more} more." if more > 0 else "")
        raise TemplateInvalidError(
            f"Workflow {graph.name!r} version {graph.version} cannot be activated: it has "
            f"{len(errors)} validation error(s). {named}",
            errors=errors,
        )
    templates = tables.table("template")
    # The others first: the partial unique index allows one active version per name.
    await connection.execute(
        update(templates)
        .where(templates.c.name == graph.name, templates.c.id != template_id, templates.c.is_active)
        .values(is_active=False)
    )
    await connection.execute(
        update(templates).where(templates.c.id == template_id).values(is_active=True)
    )
    return dataclasses.replace(graph, is_active=True)


async def active_template_id(
    connection: AsyncConnection, tables: GraphTables, name: str
) -> uuid.UUID:
    """The active version of a name: the one a submit starts on."""
    templates = tables.table("template")
    found: uuid.UUID | None = (
        await connection.execute(
            select(templates.c.id).where(templates.c.name == name, templates.c.is_active)
        )
    ).scalar_one_or_none()
    if found is None:
        raise NotFoundError(f"No version of workflow {name!r} is active.")
    return found


async def list_templates(connection: AsyncConnection, tables: GraphTables) -> list[dict[str, Any]]:
    """Every version of every name, by name then version, with its node count (JSON-ready)."""
    templates, nodes = tables.table("template"), tables.table("node")
    counts = (
        select(nodes.c.template_id, func.count().label("node_count"))
        .group_by(nodes.c.template_id)
        .subquery()
    )
    rows = (
        await connection.execute(
            select(
                templates.c.id,
                templates.c.name,
                templates.c.version,
                templates.c.is_latest,
                templates.c.is_active,
                templates.c.cloned_from,
                templates.c.created_at,
                func.coalesce(counts.c.node_count, 0).label("node_count"),
            )
            .outerjoin(counts, counts.c.template_id == templates.c.id)
            .order_by(templates.c.name, templates.c.version)
        )
    ).all()
    return [
        {
            "id": str(row.id),
            "name": row.name,
            "version": row.version,
            "is_latest": row.is_latest,
            "is_active": row.is_active,
            "cloned_from": str(row.cloned_from) if row.cloned_from is not None else None,
            "created_at": row.created_at.isoformat(),
            "node_count": row.node_count,
        }
        for row in rows
    ]


async def lock_name(connection: AsyncConnection, name: str) -> None:
    """Hold the name's lock until the transaction ends: one save or activation at a time.

    The two-key form, (the templates table, the name), as the limited claim's
    locks are (table, group), so the engine's advisory locks never meet.
    """
    await connection.execute(
        select(func.pg_advisory_xact_lock(func.hashtext(literal(TEMPLATES)), func.hashtext(name)))
    )


async def _template(
    connection: AsyncConnection, tables: GraphTables, template_id: uuid.UUID
) -> Row[Any]:
    templates = tables.table("template")
    found = (
        await connection.execute(select(templates).where(templates.c.id == template_id))
    ).first()
    if found is None:
        raise NotFoundError(f"No graph template has the id {template_id}.")
    return found


async def _base_template(
    connection: AsyncConnection, tables: GraphTables, design: Design
) -> Row[Any] | None:
    """The version a save starts from: the one named, else the name's latest (None if new)."""
    if design.base_template_id is not None:
        return await _template(connection, tables, design.base_template_id)
    templates = tables.table("template")
    return (
        await connection.execute(
            select(templates)
            .where(templates.c.name == design.name)
            .order_by(templates.c.version.desc())
            .limit(1)
        )
    ).first()


def _first_given(given: Any, base: Row[Any] | None, column: str, default: Any) -> Any:
    """The save's value, else the base version's, else the default."""
    if given is not None:
        return given
    if base is not None:
        return getattr(base, column)
    return default
