"""Events from outside: a publish's models and events, and the replay of dead letters.

`POST /events` and the Lambda `publish` entry take the same bodies: one
event object or `{"events": [...]}`, each value bounded, and what the
engine would refuse is refused before anything is written. A replay (the
API's and the console's) makes dead-lettered events due again; one event
that is not dead-lettered is a conflict.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
)
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import (
    AuditActor,
    EventTables,
    WorkflowEvent,
    event_detail,
    event_values,
    replay_recorded,
)
from functions.requests.errors import ConflictError, InputError, from_validation
from functions.requests.lookup import MAX_TEXT
from functions.requests.nesting import JsonObject

MAX_EVENTS = 1000  # events in one publish
MAX_EVENT_ID = 200  # characters of an event id in a request
MAX_REPLAY_IDS = 10_000  # event ids in one replay request
EventId = Annotated[str, Field(min_length=1, max_length=MAX_EVENT_ID)]


class EventIn(BaseModel):
    """One event to publish; its id (a fresh UUID when absent) makes a resend harmless."""

    model_config = ConfigDict(extra="forbid")
    event_type: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
    event_name: Annotated[str, Field(max_length=MAX_TEXT)] = ""
    payload: JsonObject = Field(default_factory=dict)
    event_id: EventId | None = None
    occurred_at: AwareDatetime | None = None
    source: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    metadata: JsonObject = Field(default_factory=dict)

    @field_validator("event_type")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("event_type must not be blank")
        return value

    def event(self) -> WorkflowEvent:
        """The WorkflowEvent this describes; the defaults filled as WorkflowEvent fills them."""
        given = self.model_dump(exclude_none=True)
        return WorkflowEvent(**given)


class EventBatch(BaseModel):
    """Events published together, in one transaction."""

    model_config = ConfigDict(extra="forbid")
    events: list[EventIn] = Field(json_schema_extra={"minItems": 1}, max_length=MAX_EVENTS)

    @field_validator("events")
    @classmethod
    def _not_empty(cls, value: list[EventIn]) -> list[EventIn]:
        if not value:
            raise ValueError("events is empty: there is nothing to publish")
        return value


class ReplayRequest(BaseModel):
    """Which dead-lettered events to replay; all of them when event_ids is absent."""

    model_config = ConfigDict(extra="forbid")
    event_ids: list[EventId] | None = Field(None, max_length=MAX_REPLAY_IDS)


def events_of(body: EventBatch | EventIn) -> list[WorkflowEvent]:
    """The events a publish describes, each checked as the database would check it."""
    given = body.events if isinstance(body, EventBatch) else [body]
    events = [one.event() for one in given]
    for event in events:
        event_values(event)  # an EventError for what the database would refuse
    return events


def publish_kind(body: Any) -> str:
    """Which body a publish is: a batch when it has `events`, else one event."""
    if isinstance(body, EventBatch) or (isinstance(body, dict) and "events" in body):
        return "batch"
    return "event"


# The body of a publish: judged as one kind only, so a refusal names that kind's fields.
Publish = Annotated[
    Annotated[EventBatch, Tag("batch")] | Annotated[EventIn, Tag("event")],
    Discriminator(publish_kind),
]
PUBLISH: TypeAdapter[EventBatch | EventIn] = TypeAdapter(Publish)


def parse_publish(body: Any) -> list[WorkflowEvent]:
    """A decoded publish (`{"events": [...]}` or one event) as its events."""
    if not isinstance(body, dict):
        raise InputError.at((), f"A publish is a JSON object, not {type(body).__name__}.")
    try:
        return events_of(PUBLISH.validate_python(body))
    except ValidationError as exc:
        raise from_validation(exc) from None


async def replay_dead_letters(
    tables: EventTables, event_ids: list[str] | None, *, actor: AuditActor
) -> list[str]:
    """Make dead-lettered events due again: those of `event_ids`, or every one; their ids.

    Recorded in the audit trail as `actor`'s, in the replay's transaction.
    """
    return await replay_recorded(tables, event_ids, actor)


async def replay_event(
    tables: EventTables, reads: AsyncEngine, event_id: str, *, actor: AuditActor
) -> list[str]:
    """Make one dead-lettered event due again, as `actor`; ConflictError when it is not
    dead-lettered."""
    replayed = await replay_dead_letters(tables, [event_id], actor=actor)
    if not replayed:
        detail = await event_detail(tables, event_id, engine=reads)
        status = detail.outbox.status if detail.outbox is not None else "without an outbox row"
        raise ConflictError(
            f"Event {event_id!r} is {status}, not dead_letter: there is nothing to replay."
        )
    return replayed
