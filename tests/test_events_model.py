"""`WorkflowEvent` and the model event helpers, one test per sentence of seed 000's
"Manager event helpers" paragraph (adapted: model for manager, `duly.model.*` types,
`model_*` names, payload key `model`) and the sentence on WorkflowEvent in "Event routing".

- WorkflowEvent is a frozen dataclass: test_a_workflow_event_is_frozen
- ... but payload and metadata may still reference the caller's mutable mappings:
  test_a_workflow_event_keeps_the_callers_mappings
- an omitted event_id is a generated UUID4 string (a given one is kept):
  test_the_helpers_generate_uuid4_ids, test_the_helpers_keep_a_given_event_id
- an omitted occurred_at is the current UTC time (a given one is kept):
  test_the_helpers_use_the_current_utc_time, test_the_helpers_keep_a_given_occurred_at
- create events: type duly.model.created, name model_created, payload model and values:
  test_a_created_event
- update events: type duly.model.updated, name model_updated, payload model and changes,
  each field {"old": old_values.get(field), "new": value}, a missing old value None:
  test_an_updated_event, test_an_update_without_old_values_has_old_none
- delete events: type duly.model.deleted, name model_deleted, payload model only:
  test_a_deleted_event
- identification is optional: in the payload only when given:
  test_identification_is_in_the_payload_only_when_given
- readable names are dot-free, so the helpers' events route by type and by name:
  test_helper_events_route_by_type_and_by_name
- the helpers shallow-copy top-level payload and metadata mappings but not nested
  objects: test_the_helpers_shallow_copy_values_and_metadata,
  test_the_update_helper_shallow_copies_changes
- source and metadata are passed on; metadata defaults to an empty mapping:
  test_source_and_metadata_are_passed_on
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from engine import (
    InMemoryEventRegistry,
    WorkflowEvent,
    model_created_event,
    model_deleted_event,
    model_updated_event,
)

Helper = Callable[..., WorkflowEvent]

HELPERS: dict[str, Helper] = {
    "created": lambda **kw: model_created_event("Expense", {"amount": 10}, **kw),
    "updated": lambda **kw: model_updated_event("Expense", {"amount": 12}, **kw),
    "deleted": lambda **kw: model_deleted_event("Expense", **kw),
}


@pytest.fixture(params=sorted(HELPERS))
def helper(request: pytest.FixtureRequest) -> Helper:
    return HELPERS[request.param]


def test_a_workflow_event_is_frozen() -> None:
    event = model_created_event("Expense", {"amount": 10})
    for name, value in [
        ("event_type", "x.y"),
        ("event_name", "x"),
        ("payload", {}),
        ("event_id", "other"),
        ("occurred_at", datetime.now(UTC)),
        ("source", "elsewhere"),
        ("metadata", {}),
    ]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(event, name, value)
    assert dataclasses.is_dataclass(WorkflowEvent)


def test_a_workflow_event_keeps_the_callers_mappings() -> None:
    payload: dict[str, Any] = {"amount": 10}
    metadata: dict[str, Any] = {"by": "ada"}
    event = WorkflowEvent(event_type="duly.model.created", payload=payload, metadata=metadata)
    assert event.payload is payload
    assert event.metadata is metadata
    payload["amount"] = 11
    metadata["by"] = "grace"
    assert event.payload["amount"] == 11
    assert event.metadata["by"] == "grace"


def test_the_helpers_generate_uuid4_ids(helper: Helper) -> None:
    first, second = helper(), helper()
    for event in (first, second):
        assert isinstance(event.event_id, str)
        parsed = uuid.UUID(event.event_id)
        assert parsed.version == 4
        assert str(parsed) == event.event_id
    assert first.event_id != second.event_id


def test_the_helpers_keep_a_given_event_id(helper: Helper) -> None:
    assert helper(event_id="evt-42").event_id == "evt-42"


def test_the_helpers_use_the_current_utc_time(helper: Helper) -> None:
    before = datetime.now(UTC)
    event = helper()
    after = datetime.now(UTC)
    assert event.occurred_at.tzinfo is not None
    assert event.occurred_at.utcoffset() == timedelta(0)
    assert before <= event.occurred_at <= after


def test_the_helpers_keep_a_given_occurred_at(helper: Helper) -> None:
    moment = datetime(2024, 5, 1, 12, 30, tzinfo=timezone(timedelta(hours=2)))
    assert helper(occurred_at=moment).occurred_at is moment


def test_a_created_event() -> None:
    event = model_created_event("Expense", {"amount": 10, "owner": "ada"})
    assert event.event_type == "duly.model.created"
    assert event.event_name == "model_created"
    assert event.payload == {"model": "Expense", "values": {"amount": 10, "owner": "ada"}}


def test_an_updated_event() -> None:
    event = model_updated_event(
        "Expense",
        {"amount": 12, "status": "approved", "note": "ok"},
        old_values={"amount": 10, "status": None, "owner": "ada"},
    )
    assert event.event_type == "duly.model.updated"
    assert event.event_name == "model_updated"
    assert event.payload == {
        "model": "Expense",
        "changes": {
            "amount": {"old": 10, "new": 12},
            "status": {"old": None, "new": "approved"},
            "note": {"old": None, "new": "ok"},  # no old value: None
        },
    }  # "owner" did not change: not in the changes


def test_an_update_without_old_values_has_old_none() -> None:
    event = model_updated_event("Expense", {"amount": 12, "status": "approved"})
    assert event.payload["changes"] == {
        "amount": {"old": None, "new": 12},
        "status": {"old": None, "new": "approved"},
    }


def test_a_deleted_event() -> None:
    event = model_deleted_event("Expense")
    assert event.event_type == "duly.model.deleted"
    assert event.event_name == "model_deleted"
    assert event.payload == {"model": "Expense"}


@pytest.mark.parametrize("identification", [{"id": 7}, 7, 0, "", {}])
def test_identification_is_in_the_payload_only_when_given(
    helper: Helper, identification: object
) -> None:
    assert "identification" not in helper().payload
    given = helper(identification=identification).payload
    assert given["identification"] is identification
    assert set(given) - {"identification"} == set(helper().payload)


async def test_helper_events_route_by_type_and_by_name() -> None:
    registry, calls = InMemoryEventRegistry(), []
    for key in [
        "duly.model.created",
        "model_created",
        "duly.model.updated",
        "model_updated",
        "duly.model.deleted",
        "model_deleted",
    ]:
        registry.register(key, lambda event, key=key: calls.append(key))
    for event in [
        model_created_event("Expense", {}),
        model_updated_event("Expense", {}),
        model_deleted_event("Expense"),
    ]:
        assert "." not in event.event_name
        assert await registry.publish(event)
    assert calls == [
        "duly.model.created",
        "model_created",
        "duly.model.updated",
        "model_updated",
        "duly.model.deleted",
        "model_deleted",
    ]


def test_the_helpers_shallow_copy_values_and_metadata() -> None:
    tags = ["travel"]
    values: dict[str, Any] = {"amount": 10, "tags": tags}
    context = {"request": "r-1"}
    metadata: dict[str, Any] = {"action": "create", "context": context}
    identification = {"id": 7}
    event = model_created_event("Expense", values, metadata=metadata, identification=identification)

    # Top-level mappings are copies: the caller's later changes do not reach the event.
    assert event.payload["values"] is not values
    assert event.metadata is not metadata
    values["amount"] = 99
    values["extra"] = True
    metadata["action"] = "changed"
    assert event.payload["values"] == {"amount": 10, "tags": ["travel"]}
    assert event.metadata == {"action": "create", "context": {"request": "r-1"}}

    # Nested objects are shared, not deep-copied.
    assert event.payload["values"]["tags"] is tags
    assert event.metadata["context"] is context
    assert event.payload["identification"] is identification
    tags.append("meals")
    assert event.payload["values"]["tags"] == ["travel", "meals"]


def test_the_update_helper_shallow_copies_changes() -> None:
    new_tags, old_tags = ["travel", "meals"], ["travel"]
    changes: dict[str, Any] = {"tags": new_tags}
    old_values: dict[str, Any] = {"tags": old_tags}
    metadata: dict[str, Any] = {"action": "update"}
    event = model_updated_event("Expense", changes, old_values=old_values, metadata=metadata)
    changes["tags"] = ["other"]
    changes["amount"] = 1
    old_values["tags"] = ["other"]
    metadata["action"] = "changed"
    assert event.payload["changes"] == {"tags": {"old": ["travel"], "new": ["travel", "meals"]}}
    assert event.metadata == {"action": "update"}
    assert event.payload["changes"]["tags"]["new"] is new_tags
    assert event.payload["changes"]["tags"]["old"] is old_tags


def test_source_and_metadata_are_passed_on(helper: Helper) -> None:
    event = helper(source="billing.service", metadata={"action": "api"})
    assert event.source == "billing.service"
    assert event.metadata == {"action": "api"}
    plain, other = helper(), helper()
    assert plain.source is None
    assert dict(plain.metadata) == {}
    assert plain.metadata is not other.metadata
