"""docs/reference/http.md: the HTTP API from the app's own OpenAPI document, with each route's role.

`python docs/reference.py` writes it. The app is built as `python -m functions.app`
builds it (a session factory that never connects); its `/openapi.json` gives the
routes, and `functions.identity.access` the least role of each.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

ROLES_LINK = "[who may call what](#who-may-call-what)"
# Sections of the routes that carry no tag, by the first segment of their path.
SECTIONS = {
    "healthz": "Health and metrics",
    "metrics": "Health and metrics",
    "workflows": "Workflows and runs",
    "runs": "Workflows and runs",
    "overview": "Workflows and runs",
    "schedules": "Workflows and runs",
    "wake": "Workflows and runs",
    "events": "Events and the outbox",
    "outbox": "Events and the outbox",
    "drain": "Events and the outbox",
    "audit": "The audit trail",
}
COMMON_LINK = "#responses-every-route-may-give"
ROLE_WORDS = {"public": "anyone: no credential needed"}


def http_page(generated: str) -> str:
    """The whole page: the roles table, each section's routes, the shared responses, schemas."""
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    from functions.app import create_app
    from functions.identity.access import declared_routes, role_table

    engine = create_async_engine("postgresql+psycopg://")  # never connects: routes only
    app = create_app(async_sessionmaker(engine), run_worker=False)
    document: dict[str, Any] = app.openapi()
    roles = {(method, path): role for method, path, role in declared_routes(app.routes)}
    operations = [
        (method.upper(), path, operation)
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    ]
    common = common_responses(operations)
    lines = [
        "# HTTP API",
        "",
        generated,
        "",
        "`duly dev` serves this API on your machine; on AWS the api function serves it at its",
        "Function URL. Every body is JSON. A refusal is a JSON object whose `detail` says why.",
        "The app also serves its OpenAPI document at `GET /openapi.json` (viewer role).",
        "Yours adds, per workflow table, `/workflows/<table>/start`, `/deliver` and `/run`",
        "paths whose bodies are that table's steps and their arguments.",
        "",
        "## Who may call what",
        "",
        "Each route names its least role. A role may also call what the roles below it may:",
        "admin implies designer, designer implies operator, operator implies viewer.",
        "",
        role_table(app.routes),
        "",
    ]
    sections: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for method, path, operation in operations:
        sections.setdefault(section_of(path, operation), []).append((method, path, operation))
    schemas = document["components"]["schemas"]
    for title, routes in sections.items():
        lines += [f"## {title}", ""]
        for method, path, operation in routes:
            role = roles.get((method, path))
            lines += route_lines(method, path, operation, role, common, schemas)
    lines += ["## Responses every route may give", ""]
    lines += ["Each code means the same on every route that lists it under Also.", ""]
    lines += ["| Code | When |", "| --- | --- |"]
    lines += [f"| {code} | {cell(text)} |" for code, text in sorted(common)]
    lines += ["", "## Schemas", "", "The bodies the routes read and the refusals they send.", ""]
    for name, schema in document["components"]["schemas"].items():
        lines += schema_lines(name, schema)
    return "\n".join(lines)


def section_of(path: str, operation: dict[str, Any]) -> str:
    """A route's section: its first tag, else its path's first segment's group."""
    tags = operation.get("tags") or []
    if tags:
        return str(tags[0])[:1].upper() + str(tags[0])[1:]
    return SECTIONS.get(path.strip("/").split("/")[0], "Other routes")


def common_responses(operations: list[tuple[str, str, dict[str, Any]]]) -> set[tuple[str, str]]:
    """The (code, description) pairs at least half the routes give, each the only meaning of
    its code (a 403 names the route's role): listed once."""
    counts = Counter(
        (code, response["description"])
        for _, _, operation in operations
        for code, response in operation["responses"].items()
    )
    meanings = Counter(code for code, _ in counts)
    return {
        (code, text)
        for (code, text), count in counts.items()
        if count * 2 >= len(operations) and meanings[code] == 1
    }


def route_lines(
    method: str,
    path: str,
    operation: dict[str, Any],
    role: str | None,
    common: set[tuple[str, str]],
    schemas: dict[str, Any],
) -> list[str]:
    """One route: heading, summary, role, parameters, body and its own responses."""
    lines = [f"### `{method} {path}` {{#{anchor(method + ' ' + path)}}}", ""]
    summary = operation.get("summary", "")
    description = operation.get("description", "").strip()
    lines += [f"**{summary}.** {description}".strip(), ""]
    who = ROLE_WORDS.get(role or "", f"the **{role}** role or above")
    lines += [f"Who may call it: {who} ({ROLES_LINK}).", ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| Parameter | In | Type | Default | Description |"]
        lines += ["| --- | --- | --- | --- | --- |"]
        for parameter in parameters:
            spec = parameter["schema"]
            default = "required" if parameter.get("required") else ""
            if spec.get("default") is not None:
                default = f"`{spec['default']}`"
            said = cell(parameter.get("description", spec.get("description", "")))
            where = f"| `{parameter['name']}` | {parameter['in']} | {type_of(spec)}"
            lines += [f"{where} | {default} | {said} |"]
        lines += [""]
    body = operation.get("requestBody")
    if body:
        schema = next(iter(body["content"].values()))["schema"]
        model = schemas.get(schema.get("$ref", "").rsplit("/", 1)[-1], {})
        described = f" {cell(model['description'])}" if model.get("description") else ""
        lines += [f"Body: {type_of(schema)}.{described}", ""]
        if model.get("title") == "Design":
            lines += [
                "The whole format, with an example: [Graph design format](graph-design.md).",
                "",
            ]
        lines += field_lines(model)  # one model: its fields here too
    own = [
        (code, response["description"])
        for code, response in operation["responses"].items()
        if (code, response["description"]) not in common
    ]
    if own:
        lines += ["| Response | When |", "| --- | --- |"]
        lines += [f"| {code} | {cell(text)} |" for code, text in sorted(own)]
        lines += [""]
    shared = sorted(code for code in operation["responses"] if code not in dict(own))
    if shared:
        lines += [f"Also {', '.join(shared)}: see [every route's responses]({COMMON_LINK}).", ""]
    return lines


def schema_lines(name: str, schema: dict[str, Any]) -> list[str]:
    """A schema's heading, description and field table."""
    lines = [f"### {shown_name(name)} {{#{schema_anchor(name)}}}", ""]
    if schema.get("description"):
        lines += [cell(schema["description"]), ""]
    return [*lines, *field_lines(schema)]


def field_lines(schema: dict[str, Any]) -> list[str]:
    """A schema's field table, and whether it refuses other fields."""
    lines = []
    properties: dict[str, Any] = schema.get("properties", {})
    if properties:
        required = set(schema.get("required", []))
        lines += ["| Field | Type | Required | Description |", "| --- | --- | --- | --- |"]
        for field, spec in properties.items():
            needed = "yes" if field in required else ""
            described = cell(spec.get("description", ""))
            lines += [f"| `{field}` | {type_of(spec)} | {needed} | {described} |"]
        lines += [""]
    if schema.get("additionalProperties") is False:
        lines += ["Any other field is refused.", ""]
    return lines


def type_of(schema: dict[str, Any]) -> str:
    """A schema's type in a few words, a component as a link to its section."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{shown_name(name)}](#{schema_anchor(name)})"
    for union in ("anyOf", "oneOf"):
        if union in schema:
            kinds = [type_of(part) for part in schema[union] if part.get("type") != "null"]
            nullable = any(part.get("type") == "null" for part in schema[union])
            return " or ".join(kinds) + (" or null" if nullable else "")
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {type_of(schema.get('items', {}))}"
    if "format" in schema:
        return f"{kind} ({schema['format']})"
    return str(kind)


def shown_name(name: str) -> str:
    """A component's name as read: `functions__requests__runs__CancelRequest` is the runs'."""
    parts = name.split("__")
    return f"{parts[-1]} ({parts[-2]})" if len(parts) > 1 else name


def schema_anchor(name: str) -> str:
    """A component's anchor on this page."""
    return "schema-" + anchor(shown_name(name))


def anchor(text: str) -> str:
    """An anchor from text: lower case words joined by hyphens."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def cell(text: str) -> str:
    """Text safe in a Markdown table cell: one line, no bar, no tag."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")
