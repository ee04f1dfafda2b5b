"""Forms drawn from a step's signature or a workflow's columns, and read back as JSON values.

A field comes from the JSON schema of the same pydantic model the API
checks a body with (`Step.arguments.model`,
`functions.requests.runs.columns_of`): whole numbers, numbers, text, a
choice (an enum or Literal), yes/no, or JSON for anything else. What a
person types is turned into the JSON value the field's type asks for, and
nothing more: "12" becomes 12 for a whole
number, and "twelve" stays text, so the API's own check refuses it and says
why, at that field. Only JSON that does not parse is refused here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from functions.requests.nesting import TOO_DEEP, too_deep_at

TEXT_KINDS = {"integer": "integer", "number": "number", "string": "text", "boolean": "boolean"}
MAX_FIELD_TEXT = 100_000  # characters of one field; the app's body limit bounds the form anyway


@dataclass(frozen=True)
class FormField:
    """One input of a generated form."""

    name: str  # the form field's name: the group, a dot, the parameter or column name
    label: str  # the parameter or column name
    kind: str  # integer, number, text, choice, boolean or json
    required: bool
    choices: tuple[str, ...] = ()
    nullable: bool = False

    @property
    def hint(self) -> str:
        """What the field takes, in a few words."""
        hints = {
            "integer": "a whole number",
            "number": "a number",
            "text": "text",
            "boolean": "yes or no",
            "json": "JSON",
            "choice": "one of " + ", ".join(self.choices),
        }
        needed = "required" if self.required else "optional"
        return f"{hints[self.kind]}, {needed}"

    @property
    def dom_id(self) -> str:
        """The field's element id."""
        return "field-" + self.name.replace(".", "-")


def fields_of(model: type[BaseModel], group: str) -> list[FormField]:
    """The fields of `model`'s schema (by alias), named `<group>.<name>`."""
    schema = model.model_json_schema(by_alias=True)
    required = set(schema.get("required", []))
    found = []
    for name, spec in schema.get("properties", {}).items():
        kind, choices, nullable = _kind_of(spec)
        found.append(
            FormField(
                name=f"{group}.{name}",
                label=name,
                kind=kind,
                required=name in required,
                choices=choices,
                nullable=nullable,
            )
        )
    return found


def _kind_of(spec: Mapping[str, Any]) -> tuple[str, tuple[str, ...], bool]:
    """A schema's input kind, its choices, and whether it takes null."""
    options = spec.get("anyOf")
    nullable = False
    if isinstance(options, list):
        others = [o for o in options if o.get("type") != "null"]
        nullable = len(others) < len(options)
        if len(others) != 1:
            return "json", (), nullable
        spec = others[0]
    enum = spec.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return "choice", tuple(enum), nullable
    kind = TEXT_KINDS.get(str(spec.get("type")))
    return (kind or "json"), (), nullable


def values_of(
    fields: Iterable[FormField], form: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The JSON values a form gives its fields, by label, and the fields refused here."""
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for field in fields:
        raw = form.get(field.name)
        if field.kind == "boolean":
            values[field.label] = raw is not None and str(raw) not in ("", "false", "off")
            continue
        text = "" if raw is None else str(raw)
        if len(text) > MAX_FIELD_TEXT:
            errors[field.name] = f"At most {MAX_FIELD_TEXT:,} characters."
            continue
        if text == "":
            continue  # left empty: the default, or the API's "missing"
        if field.kind == "json":
            try:
                value = json.loads(text, parse_constant=_refuse_constant)
            except ValueError as exc:
                errors[field.name] = f"This is not JSON: {exc}."
                continue
            except RecursionError:  # nested past what Python's parser can hold
                errors[field.name] = TOO_DEEP
                continue
            if too_deep_at(value) is not None:
                errors[field.name] = TOO_DEEP
                continue
            values[field.label] = value
            continue
        values[field.label] = _typed(field.kind, text)
    return values, errors


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _typed(kind: str, text: str) -> Any:
    """Text as the JSON value of `kind`; the text itself when it is not one (refused later)."""
    try:
        if kind == "integer":
            return int(text.strip())
        if kind == "number":
            number = float(text.strip())
            if number != number or number in (float("inf"), float("-inf")):
                return text  # NaN and infinities are no JSON numbers: refused as text
            return int(number) if number.is_integer() and "." not in text else number
    except ValueError:
        return text
    return text


def raw_values(form: Mapping[str, Any], groups: Iterable[str]) -> dict[str, str]:
    """The form's fields of `groups` as typed, to carry through a confirmation."""
    prefixes = tuple(f"{group}." for group in groups)
    return {k: str(v) for k, v in form.items() if k.startswith(prefixes)}


# A confirmation names each delivery option by what it does, as the action's form labels it.
OPTION_LABELS = {
    "options.idempotency_key": "Idempotency key: a key delivered before is refused",
    "options.restart": "Restart a finished run",
}


@dataclass(frozen=True)
class ShownValue:
    """A value a confirmation repeats: what it is in words, its form field, as typed."""

    label: str
    name: str
    value: str


def shown_values(typed: Mapping[str, str]) -> list[ShownValue]:
    """The typed values under their labels: an argument's name as words, an option's meaning."""
    shown = []
    for name, value in typed.items():
        label = OPTION_LABELS.get(name)
        if label is None:
            words = name.split(".", 1)[-1].replace("_", " ")
            label = words[:1].upper() + words[1:]
        shown.append(ShownValue(label=label, name=name, value=value))
    return shown


def errors_by_field(errors: Iterable[Mapping[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """A 422's errors (`loc` from `body`) by form field name, and those no field names."""
    by_field: dict[str, str] = {}
    general: list[str] = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ()) if part != "body"]
        message = str(error.get("msg", "invalid"))
        if len(loc) >= 2 and loc[0] in ("row", "args"):
            by_field.setdefault(f"{loc[0]}.{loc[1]}", message)
        else:
            general.append(f"{'.'.join(loc) or 'The form'}: {message}")
    return by_field, general
