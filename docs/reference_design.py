"""docs/reference/graph-design.md and its JSON schema: the format a graph design is saved in.

The schema is pydantic's, of `Design` (what `POST /graphs/templates` and the
designer save); the fields' meanings are declared here, one per model field (a
field without one stops the build); the rules S1..S21 and their sentences are
read from engine/graphs/design/validation.py.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reference_http import cell, type_of

# The meaning of each field of the design's three models, by field name.
MEANINGS: dict[str, dict[str, str]] = {
    "Design": {
        "name": "The workflow's name. Every save of a name is a new version of it.",
        "description": "A sentence about the workflow (unset: the base version's).",
        "state_choices": "The state codes its states and ends may use (unset: the base's).",
        "forbid_self_approval": (
            "Refuse a submitter every move and vote on their subject (unset: the base's)."
        ),
        "submitters": (
            "Who may submit: `any`, `owner` (the subject's owner) or a role (unset: the base's)."
        ),
        "base_template_id": "The version unset fields are read from (unset: the name's latest).",
        "nodes": "The graph's nodes, at least one.",
        "connections": (
            "The transitions, between nodes of the design; a repeated pair keeps the first."
        ),
    },
    "DesignNode": {
        "id": "The node's key in this design, unique; connections name it.",
        "type": "What the node does: one of the node types below.",
        "name": "The node's title, as the designer, the console and the history show it.",
        "x": "The designer's horizontal position (layout only).",
        "y": "The designer's vertical position (layout only).",
        "z_index": "The designer's stacking order (layout only).",
        "state_code": "A state's code (from `stateChoices`); on an end, the code it ends with.",
        "threshold": "A state's votes to move: `single`, `majority` or `unanimous`.",
        "assignee_user_ids": "A state's people who may move it, by user id.",
        "assignee_group_ids": "A state's groups whose members may move it.",
        "condition": "A condition's registered predicate, which picks its true or false edge.",
        "deadline_seconds": "A state's deadline; past it, its escalation edge is taken.",
        "state_assignment_template_code": "A state's notification template, on assignment.",
        "notify_originator_on_assignment": "A state also notifies the subject's submitter.",
    },
    "DesignConnection": {
        "source": "The `id` of the node it leaves.",
        "target": "The `id` of the node it enters.",
        "label": "What the button reads (150 characters at most).",
        "condition_result": "On a condition's edges: `true` or `false`, the result it follows.",
        "comment_required": "A move along it needs a comment.",
        "escalation": "The edge a state with a deadline takes when the deadline passes.",
        "condition": "A manual guard: a registered predicate that must hold to move.",
    },
}
NODE_TYPES = {
    "start": "Where an instance begins. Exactly one, with one transition to a state or condition.",
    "state": "Where an instance waits for people: its assignees move it on, or vote.",
    "condition": "A branch by a registered predicate: one `true` edge and one `false` edge.",
    "fork": "Splits into parallel branches (two or more), closed by one join.",
    "join": "Waits for every branch of its fork, then goes on along its one transition.",
    "end": "Where an instance finishes; it may name the state code the subject ends with.",
}
# The example: an approval, start -> state -> end, as the designer saves it.
EXAMPLE: dict[str, Any] = {
    "name": "expense-approval",
    "description": "A manager approves an expense claim.",
    "stateChoices": ["awaiting_approval", "approved"],
    "submitters": "any",
    "nodes": [
        {"id": "start", "type": "start", "name": "Submitted", "x": 360, "y": 60},
        {
            "id": "review",
            "type": "state",
            "name": "Manager review",
            "x": 360,
            "y": 230,
            "stateCode": "awaiting_approval",
            "threshold": "single",
            "assigneeGroupIds": ["managers"],
        },
        {
            "id": "done",
            "type": "end",
            "name": "Approved",
            "x": 360,
            "y": 400,
            "stateCode": "approved",
        },
    ],
    "connections": [
        {"source": "start", "target": "review", "label": "Submit"},
        {"source": "review", "target": "done", "label": "Approve", "commentRequired": True},
    ],
}
SCHEMA_NAME = "graph-design.schema.json"
LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")


def design_schema() -> dict[str, Any]:
    """The JSON schema of a design, as the API reads it (camelCase keys)."""
    from engine.graphs.design.document import Design

    return Design.model_json_schema(by_alias=True)


def design_pages(pages: Path, generated: str) -> dict[Path, str]:
    """The page and the schema file, by path."""
    return {
        pages / "graph-design.md": design_page(generated),
        pages / SCHEMA_NAME: json.dumps(design_schema(), indent=2),
    }


def design_page(generated: str) -> str:
    """Fields of a design, node types, the rules S1..S21 and one example."""
    schema = design_schema()
    lines = [
        "# Graph design format",
        "",
        generated,
        "",
        "A graph workflow is saved as a design: a JSON object of nodes and connections.",
        "The console's designer writes one; `POST /graphs/templates` takes one",
        "([HTTP API](http.md#post-graphs-templates)). Each save is a new, inactive version.",
        f"Its JSON schema is [{SCHEMA_NAME}]({SCHEMA_NAME}).",
        "",
        "## An approval, whole",
        "",
        "A claim is submitted, a manager approves it, and it ends approved.",
        "",
        "```json",
        json.dumps(EXAMPLE, indent=2),
        "```",
        "",
    ]
    definitions = schema["$defs"]
    lines += field_table("The design", "Design", schema)
    lines += field_table("A node", "DesignNode", definitions["DesignNode"])
    lines += field_table("A connection", "DesignConnection", definitions["DesignConnection"])
    lines += [
        "Keys are camelCase. A node or connection keeps keys it does not know (layout data);",
        "the design ignores them (a loaded version's `version`, `isActive`, ...), so a",
        "designer may post back what it loaded. An empty `stateCode`, `threshold`, `condition`",
        "or `stateAssignmentTemplateCode` is the same as unset.",
        "",
        "## Node types",
        "",
        "| Type | What it does |",
        "| --- | --- |",
        *[f"| `{kind}` | {text} |" for kind, text in NODE_TYPES.items()],
        "",
    ]
    lines += rules_section()
    return "\n".join(lines)


def field_table(heading: str, model: str, schema: dict[str, Any]) -> list[str]:
    """A model's fields: key, type, default (or required) and meaning."""
    from engine.graphs.design import document

    fields = getattr(document, model).model_fields
    meanings = MEANINGS[model]
    if set(meanings) != set(fields):
        raise SystemExit(f"MEANINGS[{model!r}] differs from its fields: {sorted(fields)}")
    required = set(schema.get("required", []))
    lines = [f"## {heading}", "", "| Key | Type | Default | Meaning |", "| --- | --- | --- | --- |"]
    for name, field in fields.items():
        key = field.alias or name
        spec = schema["properties"][key]
        if key in required:
            default = "required"
        elif "default" in spec:
            default = f"`{json.dumps(spec['default'])}`"
        else:
            default = "`[]`"  # a list field's default_factory
        kind = LINK.sub(r"\1", type_of(spec))  # the nested models are the tables below
        lines += [f"| `{key}` | {kind} | {default} | {cell(meanings[name])} |"]
    return [*lines, ""]


def rules_section() -> list[str]:
    """The rules a save reports and activation enforces, with their sentences."""
    from engine.graphs.design import validation

    rules = dict(rule_rows(inspect.getdoc(validation.validate_graph) or ""))
    sentences: dict[str, list[str]] = {}
    for code, sentence in problem_sentences(inspect.getsource(validation)):
        sentences.setdefault(code, []).append(sentence)
    codes = [code for code, _ in validation.RULES]
    if set(codes) != set(rules) or set(codes) != set(sentences):
        raise SystemExit("validate_graph's table, RULES and the sentences name other codes")
    lines = [
        "## The rules S1..S21",
        "",
        "A save checks the graph and answers with every problem, each with its code and the",
        "node's key. A version with problems is saved, but cannot be activated. `…` stands",
        "for a node's name or a number.",
        "",
        "| Code | Rule | What the problem says |",
        "| --- | --- | --- |",
    ]
    for code in codes:
        said = "<br>".join(cell(sentence) for sentence in sentences[code])
        lines += [f"| {code} | {cell(rules[code])} | {said} |"]
    return [*lines, ""]


def rule_rows(docstring: str) -> Iterator[tuple[str, str]]:
    """The (code, rule) rows of validate_graph's table."""
    code, text = "", list[str]()
    for line in docstring.splitlines():
        word = line.split(" ", 1)[0]
        if word.startswith("S") and word[1:].isdigit():
            if code:
                yield code, " ".join(text)
            code, text = word, [line[len(word) :].strip()]
        elif code and line.startswith(" ") and line.strip() and not line.startswith("="):
            text.append(line.strip())
        elif code and (line.startswith("=") or not line.strip()):
            yield code, " ".join(text)
            code, text = "", []


def problem_sentences(source: str) -> Iterator[tuple[str, str]]:
    """Each `check.problem("Sn", sentence)` of the source, in source order: code, sentence."""
    calls = sorted(
        (node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)),
        key=lambda node: node.lineno,
    )
    for node in calls:
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr == "problem"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Constant)
        ):
            yield str(node.args[0].value), spelled(node.args[1])


def spelled(node: ast.expr) -> str:
    """A sentence of the code as read: each value it formats in becomes `…`."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                parts.append(str(part.value))
            elif isinstance(part, ast.FormattedValue):
                parts.append("'…'" if part.conversion == ord("r") else "…")
        return "".join(parts)
    if isinstance(node, ast.BinOp):
        return spelled(node.left) + spelled(node.right)
    return "…"
