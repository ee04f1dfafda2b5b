"""The OpenAPI schema tells the truth: the refusals each operation can answer, with their
bodies; the credentials every route but /healthz needs; the bounds of every number asked
for; the rule that names the runs of a write (`key` or `where`, exactly one).

The fuzzer (tests/test_api_fuzz.py) checks the answers against this schema; these
tests check the schema says what the app does.
"""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator
from sqlalchemy.ext.asyncio import async_sessionmaker

from functions import examples
from functions.app import create_app
from tests.apps import api
from tests.conftest import Database
from tests.helpers import serving

EVERY_ROUTE_REFUSES = {"413"}  # the guard's body limit, whatever the route
CREDENTIALED = {"401", "403", "411", "421"}
TAKES_INPUT = {"400", "422"}


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    assert examples.Onboarding and api.Invoice  # their workflows are in the schema
    built: dict[str, Any] = create_app(async_sessionmaker(), run_worker=False).openapi()
    return built


def operations(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{method.upper()} {path}", operation)
        for path, methods in schema["paths"].items()
        for method, operation in methods.items()
    ]


def ref_of(response: dict[str, Any]) -> str:
    ref: str = response["content"]["application/json"]["schema"]["$ref"]
    return ref.rsplit("/", 1)[1]


def test_every_route_but_healthz_documents_its_credentials(schema: dict[str, Any]) -> None:
    for name, operation in operations(schema):
        statuses = set(operation["responses"])
        assert statuses >= EVERY_ROUTE_REFUSES, name
        if name == "GET /healthz":
            assert not statuses & CREDENTIALED and "security" not in operation
            continue
        assert statuses >= CREDENTIALED, name
        assert operation["security"] == [{"bearer": []}, {"signature": []}], name
        assert ref_of(operation["responses"]["401"]) == "Refusal", name
        assert "WWW-Authenticate" in operation["responses"]["401"]["headers"], name
        assert ref_of(operation["responses"]["403"]) == "Refusal", name
    role = schema["paths"]["/workflows/{name}/start"]["post"]["responses"]["403"]
    assert "operator role" in role["description"]


def test_every_operation_that_takes_input_documents_400_and_422(schema: dict[str, Any]) -> None:
    for name, operation in operations(schema):
        takes_input = bool(operation.get("parameters")) or "requestBody" in operation
        statuses = set(operation["responses"])
        assert (statuses >= TAKES_INPUT) is takes_input, name
        if takes_input:
            assert ref_of(operation["responses"]["422"]) == "ValidationRefusal", name
            graph = name.split()[1].startswith("/graphs/")
            assert ref_of(operation["responses"]["400"]) == (
                "GraphRefusal" if graph else "Refusal"
            ), name
        assert ("408" in statuses) is (not name.startswith("GET ")), name
    components = schema["components"]["schemas"]
    assert "HTTPValidationError" not in components  # FastAPI's, which echoes the input
    problem = components["FieldProblem"]
    assert sorted(problem["required"]) == ["loc", "msg", "type"]
    assert "input" not in problem["properties"]
    assert components["Refusal"]["required"] == ["detail"]
    assert {"code", "errors"} <= set(components["GraphRefusal"]["properties"])


def test_what_only_some_routes_answer_is_documented_on_them(schema: dict[str, Any]) -> None:
    def statuses(path: str, method: str = "get") -> set[str]:
        return set(schema["paths"][path][method]["responses"])

    assert "503" in statuses("/healthz") and "503" in statuses("/wake", "post")
    assert "404" in statuses("/workflows/{name}/runs/{key}")
    assert "404" in statuses("/outbox/events")  # an app without an outbox
    assert "409" in statuses("/workflows/invoice/start", "post")
    assert "409" in statuses("/outbox/events/{event_id}/replay", "post")
    ended = schema["paths"]["/graphs/instances/{instance_id}/cancel"]["post"]["responses"]["409"]
    assert ref_of(ended) == "GraphRefusal"
    assert "404" not in statuses("/workflows")


def test_every_number_asked_for_is_bounded(schema: dict[str, Any]) -> None:
    numbers = []
    for name, operation in operations(schema):
        for parameter in operation.get("parameters", []):
            found = parameter["schema"]
            if found.get("type") in ("integer", "number"):
                numbers.append(f"{name} {parameter['name']}")
                assert "minimum" in found and "maximum" in found, (name, parameter)
    assert "GET /outbox/events offset" in numbers and "POST /wake timeout" in numbers


def validator(schema: dict[str, Any], pointer: str) -> Draft202012Validator:
    """A validator of the schema at `pointer`, its $refs resolved in the whole document."""
    return Draft202012Validator({**schema, "$ref": pointer})


def test_a_write_names_its_runs_by_key_or_where_exactly_one(schema: dict[str, Any]) -> None:
    components = "#/components/schemas/"
    generic = schema["paths"]["/workflows/{name}/cancel"]["post"]["requestBody"]
    cancel_ref = generic["content"]["application/json"]["schema"]["$ref"]
    rules = {
        "cancel": (validator(schema, cancel_ref), {}),
        "deliver": (validator(schema, components + "DeliverRequest"), {"step": "pay"}),
        "run": (validator(schema, components + "RunRequest"), {"step": "pay"}),
        "invoice run": (
            validator(
                schema,
                "#/paths/~1workflows~1invoice~1run/post/requestBody/content/application~1json/schema",
            ),
            {"step": "chase"},
        ),
    }
    for name, (check, body) in rules.items():
        good = [{**body, "key": 1}, {**body, "where": {"status": "new"}}]
        if name != "invoice run":  # the generic models take null for "not given"
            good += [{**body, "key": 1, "where": None}, {**body, "key": None, "where": {"a": 1}}]
        for sent in good:
            assert check.is_valid(sent), (name, sent)
        bad = [body, {**body, "key": 1, "where": {"a": 1}}, {**body, "where": {}}]
        if name != "invoice run":
            bad.append({**body, "key": None, "where": None})
        for sent in bad:
            assert not check.is_valid(sent), (name, sent)


async def test_the_served_schema_answers_with_the_refusals_it_documents(db: Database) -> None:
    Session = await db.create(examples.Base.metadata, api.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        served = (await client.get("/openapi.json")).json()
        both = {"step": "chase", "key": 1, "where": {"status": "new"}}
        refused = await client.post("/workflows/invoice/run", json=both)
        too_big = await client.get("/outbox/events", params={"limit": 501})
    documented = served["paths"]["/workflows/invoice/run"]["post"]["responses"]
    assert refused.status_code == 422 and "422" in documented
    assert refused.json()["detail"][0]["msg"].startswith("Name the runs with key")
    assert set(refused.json()["detail"][0]) == {"loc", "msg", "type"}
    assert too_big.status_code == 422
    assert too_big.json()["detail"][0]["loc"] == ["query", "limit"]
