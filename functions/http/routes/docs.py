"""The OpenAPI schema, with each workflow's bodies drawn from its steps, and the offline docs.

The schema carries, for each workflow table, the bodies its steps take
(`/workflows/<table>/start` and so on, served by the same routes as the
templated paths). Swagger UI and ReDoc are served from a wheel
(fastapi-offline) rather than a CDN, so `/docs` works offline.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic.json_schema import models_json_schema

from engine import Step
from functions.http.refusals import document_refusals
from functions.requests.lookup import is_engine_table
from functions.requests.runs import MAX_IDEMPOTENCY_KEY, NAME_THE_RUNS, columns_of

if TYPE_CHECKING:
    from engine import WorkflowInfo
from functions.identity.access import allow
from functions.identity.principal import Role

DOCS_ASSETS_URL = "/docs/assets"
# Swagger UI 5 and ReDoc, shipped in a wheel so /docs works offline.
DOCS_ASSETS_PACKAGE = ("fastapi_offline", "static")

OPENAPI_URL = "/openapi.json"
docs_router = APIRouter(include_in_schema=False)


def workflow_openapi(app: FastAPI, infos: list[WorkflowInfo]) -> dict[str, Any]:
    """The app's schema plus, per workflow table, start/deliver/run paths with step bodies.

    Those paths are served by the templated routes; their bodies are a
    `oneOf` discriminated by `step`, each step's `args` the model of its
    signature (`Step.arguments`), so a client sees exactly what it may send.
    """
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    components["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "DULY_API_TOKEN, a named API key (DULY_API_KEYS) or an OIDC token",
        },
        "signature": {
            "type": "apiKey",
            "in": "header",
            "name": "X-Duly-Signature",
            "description": "sha256=<hex of HMAC-SHA256(secret, "
            '"<X-Duly-Timestamp>\\n<METHOD>\\n<path>\\n<query>\\n" + body)>, with '
            "X-Duly-Timestamp in Unix seconds; each signature is taken once.",
        },
    }
    document_refusals(schema, app.routes)
    for action in ("deliver", "run", "cancel"):
        generic = schema["paths"].get(f"/workflows/{{name}}/{action}", {}).get("post")
        if generic is not None:
            ref = generic["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            _name_the_runs(schemas[ref.rsplit("/", 1)[1]])
    # The outbox and the engine's own tables (graph timers) take no starts: no paths of theirs.
    writable = [info for info in infos if not is_engine_table(info)]
    models: list[tuple[Any, Literal["validation"]]] = []
    for info in writable:
        models.append((columns_of(info).model, "validation"))
        models.extend((s.arguments.model, "validation") for s in info.steps.values())
    refs, defs = models_json_schema(
        models, by_alias=True, ref_template="#/components/schemas/{model}"
    )
    schemas.update(defs.get("$defs", {}))
    templated = schema["paths"]
    for info in writable:
        row_ref = refs[(columns_of(info).model, "validation")]
        for action in ("start", "deliver", "run"):
            generic = templated.get(f"/workflows/{{name}}/{action}", {}).get("post")
            if generic is None or not info.steps:
                continue
            bodies = []
            for step in info.steps.values():
                if action == "start" and not info.starts_at(step):
                    continue  # runs start only at its entry steps, when it declares some
                body = _step_body(action, step, refs[(step.arguments.model, "validation")])
                if action == "start":
                    body["properties"]["row"] = row_ref
                    body["required"].append("row")
                bodies.append(body)
            operation = copy.deepcopy(generic)
            operation["parameters"] = []
            operation["operationId"] = f"{action}_{info.name}"
            operation["summary"] = f"{action.capitalize()} {info.name}"
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"oneOf": bodies}}},
            }
            templated[f"/workflows/{info.name}/{action}"] = {"post": operation}
    return schema


def _step_body(action: str, step: Step[Any, Any], args_ref: dict[str, Any]) -> dict[str, Any]:
    """The body of `action` for one step: its name as a constant and its arguments' model."""
    properties: dict[str, Any] = {"step": {"type": "string", "enum": [step.name]}, "args": args_ref}
    if action in ("deliver", "run"):
        properties["key"] = {
            "anyOf": [
                {"type": "integer"},
                {"type": "string"},
                {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string"}]}},
            ]
        }
        properties["where"] = {"type": "object", "minProperties": 1}
    if action == "deliver":
        properties["idempotency_key"] = {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_IDEMPOTENCY_KEY,
        }
        properties["restart"] = {"type": "boolean"}
    required = ["step"]
    if any(
        p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in list(step.signature.parameters.values())[1:]
    ):
        required.append("args")
    body: dict[str, Any] = {
        "title": f"{step.qualname} ({action})",
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    if action in ("deliver", "run"):
        body["oneOf"] = [{"required": ["key"]}, {"required": ["where"]}]
        body["description"] = NAME_THE_RUNS
    return body


def _name_the_runs(addressed: dict[str, Any]) -> None:
    """The rule of a body that addresses runs: `key` or `where`, exactly one of them given.

    A null is as good as absent (the model's default), and `where` needs a column.
    """
    for branch in addressed["properties"]["where"].get("anyOf", []):
        if branch.get("type") == "object":
            branch["minProperties"] = 1
    addressed["oneOf"] = [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
        for name in ("key", "where")
    ]
    addressed["description"] = f"{addressed.get('description', '')} {NAME_THE_RUNS}".strip()


# -- API docs, served from a wheel rather than a CDN -----------------------------------


@docs_router.get(OPENAPI_URL, dependencies=[allow(Role.VIEWER)])
async def openapi_schema(request: Request) -> JSONResponse:
    """This app's OpenAPI schema (FastAPI's own route is off: it would take no role)."""
    return JSONResponse(request.app.openapi())


@docs_router.get("/docs", dependencies=[allow(Role.VIEWER)])
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI over this app's OpenAPI schema, every asset served by the app itself."""
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(
        openapi_url=f"{root}{OPENAPI_URL}",
        title="duly: API",
        swagger_js_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png",
    )


@docs_router.get("/redoc", dependencies=[allow(Role.VIEWER)])
async def redoc(request: Request) -> HTMLResponse:
    """ReDoc over the same schema, also without a CDN (or Google's fonts)."""
    root = request.scope.get("root_path", "")
    return get_redoc_html(
        openapi_url=f"{root}{OPENAPI_URL}",
        title="duly: API",
        redoc_js_url=f"{root}{DOCS_ASSETS_URL}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png",
        with_google_fonts=False,
    )
