"""The bodies refusals answer with, as models for the OpenAPI schema, and each route's own.

`functions.http.errors` shapes the bodies; these models only describe
them. The refusals a route answers by what it is (the guard's, the Host
check's, validation's) are added to the schema once (`document_refusals`,
for `routes.docs`); a route declares only what it alone answers: its 404,
409 or 503.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

from functions.http.guard import SAFE_METHODS
from functions.http.hosts import UNCHECKED_PATHS
from functions.identity.access import PUBLIC, declared_role
from functions.identity.signatures import MAX_SIGNED_BODY

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

Responses = dict[int | str, dict[str, Any]]
REF_TEMPLATE = "#/components/schemas/{model}"
GRAPHS_PREFIX = "/graphs/"
# Any of the guard's credentials: a bearer (the API token, a named key, an OIDC token) or
# a signed body.
CREDENTIALS: list[dict[str, list[str]]] = [{"bearer": []}, {"signature": []}]


class Refusal(BaseModel):
    """A refused request: the sentence that says why."""

    detail: str


class GraphRefusal(Refusal):
    """A graph workflow's refusal: its sentence, and the stable code when the graph refused."""

    code: str | None = Field(None, description="e.g. STATE_WORKFLOW_ERROR, TEMPLATE_INVALID")
    errors: list[str] | None = Field(None, description="a template's validation errors")


class FieldProblem(BaseModel):
    """One refused value: where it sits, why, and the kind of problem (never the value)."""

    loc: list[str | int]
    msg: str
    type: str


class ValidationRefusal(BaseModel):
    """A request whose values were refused where they sit (422): each problem placed."""

    detail: list[FieldProblem]


def not_found(what: str) -> Responses:
    """A 404 a route answers: `what` names what may not exist."""
    return {404: {"model": Refusal, "description": f"No such {what}"}}


def conflict(what: str, model: type[Refusal] = Refusal) -> Responses:
    """A 409 a route answers: what it addresses refuses the request as it stands."""
    return {409: {"model": model, "description": what}}


def unavailable(what: str) -> Responses:
    """A 503 a route answers when this process cannot serve it now."""
    return {503: {"model": Refusal, "description": what}}


# -- the refusals any operation may answer, added to the schema once ------------------------


def document_refusals(schema: dict[str, Any], routes: Iterable[BaseRoute]) -> None:
    """Add to each operation of `schema` the refusals its route can answer, with their bodies.

    By what the route is: the guard's 413 on every one, and 408 on a write (its
    body read whole); 401, 403, 411 and 429 on every route but a public one; 421 wherever
    the Host is checked; 400 and 422 (the placed problems, replacing FastAPI's
    own model) wherever the request carries parameters or a body.
    """
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    _, defs = models_json_schema(
        [(model, "validation") for model in (Refusal, GraphRefusal, ValidationRefusal)],
        ref_template=REF_TEMPLATE,
    )
    for name, definition in defs.get("$defs", {}).items():
        schemas.setdefault(name, definition)
    for context in iter_route_contexts(list(routes)):
        if not isinstance(context.original_route, APIRoute):
            continue
        # As FastAPI's own schema reads it: the route as included, its routers' prefixes
        # and dependencies (a router's allow()) in it.
        route = cast(APIRoute, context)
        if not route.include_in_schema:
            continue
        for method in route.methods or ():
            operation = schema["paths"].get(route.path_format, {}).get(method.lower())
            if operation is not None:
                operation.setdefault("responses", {}).update(_refusals(route, method, operation))
                if declared_role(route) != PUBLIC:
                    operation["security"] = CREDENTIALS
    used = json.dumps(schema["paths"])
    for fastapi_model in ("HTTPValidationError", "ValidationError"):
        if REF_TEMPLATE.format(model=fastapi_model) not in used:
            schemas.pop(fastapi_model, None)


def _refusals(route: APIRoute, method: str, operation: dict[str, Any]) -> dict[str, Any]:
    found = {
        "413": _answer(
            "The request body is larger than DULY_MAX_BODY_BYTES (a signed request's: "
            f"{MAX_SIGNED_BODY} bytes)"
        )
    }
    if method not in SAFE_METHODS:  # the guard reads a write's body before the route
        found["408"] = _answer("The body did not arrive within DULY_BODY_TIMEOUT_SECONDS")
    if operation.get("parameters") or "requestBody" in operation:
        graph = route.path_format.startswith(GRAPHS_PREFIX)
        found["400"] = _answer(
            "A graph workflow refused the move, or a value was refused as it stands"
            if graph
            else "A value was refused as it stands (by duly or by PostgreSQL)",
            GraphRefusal if graph else Refusal,
        )
        found["422"] = _answer(
            "Values refused where they sit: each problem placed, never the value",
            ValidationRefusal,
        )
    role = declared_role(route)
    if role != PUBLIC:
        found["401"] = _answer("No credential, or one that is not good (with any configured)")
        found["401"]["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
        needed = f"the {role} role" if role is not None else "this route's role"
        found["403"] = _answer(
            f"The caller lacks {needed} or is held to other routes; or, with no "
            "credential configured, the request came from a page of another site"
        )
        found["411"] = _answer("A signed request that does not declare its body's length")
        found["429"] = _answer("Too many wrong bearer tokens from this address: wait")
        found["429"]["headers"] = {"Retry-After": {"schema": {"type": "integer"}}}
    if route.path_format not in UNCHECKED_PATHS:
        found["421"] = _answer("The request's Host is not one of DULY_ALLOWED_HOSTS")
    return found


def _answer(description: str, model: type[BaseModel] = Refusal) -> dict[str, Any]:
    body = {"schema": {"$ref": REF_TEMPLATE.format(model=model.__name__)}}
    return {"description": description, "content": {"application/json": body}}
