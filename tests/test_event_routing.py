"""Routing events to handlers with `InMemoryEventRegistry`, one test per sentence of seed
000's "Event routing" (and the in-memory parts that follow it) and "In-memory registry
locking".

Route keys
- keys with a dot match event_type exactly: test_a_dotted_key_matches_the_event_type
- keys without a dot match event_name exactly: test_a_dot_free_key_matches_the_event_name
- a dotted key never matches a name, a dot-free key never a type:
  test_the_dot_alone_decides_type_or_name
- keys are not stripped, normalised, wildcarded or prefix-matched:
  test_keys_are_not_stripped_normalised_wildcarded_or_prefix_matched
- the empty string is a valid event-name key: test_the_empty_string_is_a_valid_name_key

A registration's options
- a `when` predicate that says False skips the route: test_when_false_skips_the_route,
  test_when_true_runs_the_route
- validators run before predicates: test_the_validator_runs_before_the_predicate
- a validator failure (False or an exception) goes straight to dead letter, is not
  retried, and the handler does not run:
  test_a_validator_returning_false_is_dead_lettered_unretried,
  test_a_validator_raising_is_dead_lettered_unretried
- handler failures are retried `retries` more times, the last failure dead-lettered:
  test_a_failing_handler_gets_retries_extra_attempts,
  test_a_handler_succeeding_within_its_budget_completes, test_no_retries_by_default
- retry_on=None retries every handler exception until the budget is exhausted:
  test_retry_on_none_retries_every_exception
- retry_on decides per failure; False stops retrying: test_retry_on_false_stops_retrying,
  test_retry_on_selects_the_failures_to_retry
- retries are clamped to at least 0: test_negative_retries_mean_one_attempt
- handlers may be plain or async, and so may dead-letter callbacks:
  test_handlers_may_be_sync_or_async, test_async_handler_failures_are_retried,
  test_dead_letter_callbacks_may_be_sync_or_async

Failures
- one failed route does not stop later matching routes (with or without a dead-letter
  handler): test_a_failed_route_does_not_stop_later_routes
- predicate exceptions are not wrapped; they propagate out of publish():
  test_a_predicate_exception_propagates_unwrapped
- dead-letter handler exceptions are not wrapped; they propagate:
  test_a_dead_letter_handler_exception_propagates
- retry_on raising while judging a failure propagates: test_a_retry_on_exception_propagates
- a registration's dead-letter handler comes before the registry's dead_letter_handler,
  which serves routes without one: test_the_registrations_dead_letter_handler_takes_precedence,
  test_a_falsey_registration_dead_letter_handler_still_takes_precedence
- the registry trusts the annotated types: invalid callables fail when called, not when
  registered; non-integer retries raise a normal Python error at registration:
  test_invalid_callables_fail_when_called, test_non_integer_retries_fail_at_registration

Identity and order
- identical registrations are ignored (register returns the one kept):
  test_an_identical_registration_is_ignored
- identity is key, handler, validator, predicate, retry count, retry predicate and
  dead-letter handler; changing any makes a separate registration, and the handler may
  run twice: test_changing_any_option_makes_a_separate_registration
- callables compare by __module__ + "." + __qualname__ (two lambdas of one function are
  the same): test_callables_compare_by_module_and_qualname
- callables without __qualname__ compare by repr():
  test_callables_without_qualname_compare_by_repr
- the retry count in the identity is the clamped one:
  test_the_identity_uses_the_clamped_retry_count
- matching handlers run in registration order within each bucket:
  test_routes_run_in_registration_order_within_a_bucket
- type routes run before name routes: test_type_routes_run_before_name_routes

publish()
- True when at least one applicable handler completes, even if another fails:
  test_publish_is_true_when_one_handler_completes_and_another_fails
- False when every applicable handler fails, or nothing matches:
  test_publish_is_false_when_every_applicable_handler_fails,
  test_publish_is_false_when_nothing_matches
- routes skipped by when=False are not applicable: test_when_false_routes_are_not_applicable
- a duplicate event_id returns False and routes nothing:
  test_a_duplicate_event_id_returns_false_and_routes_nothing
- the id is marked seen before routing, so a failed handler does not make it
  publishable again: test_the_id_is_marked_seen_before_routing
- the bounded seen-id cache evicts the oldest id (max_seen_event_ids):
  test_the_seen_id_cache_evicts_the_oldest_id

Locking
- handlers run outside the lock: test_handlers_run_outside_the_lock
- concurrent register calls affect later publishes, not a snapshot being routed:
  test_a_registration_added_during_routing_runs_for_later_events_only
- registration mutation is protected: test_concurrent_registrations_while_publishing_are_all_kept,
  test_concurrent_identical_registrations_keep_one
- seen-id cache updates are protected: test_concurrent_publishes_of_one_id_route_it_once
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import Counter
from typing import Any

import pytest

from engine import InMemoryEventRegistry, Registration, WorkflowEvent

TYPE = "duly.model.updated"
NAME = "model_updated"


def an_event(
    event_type: str = TYPE, event_name: str = NAME, event_id: str | None = None
) -> WorkflowEvent:
    if event_id is None:
        return WorkflowEvent(event_type=event_type, event_name=event_name)
    return WorkflowEvent(event_type=event_type, event_name=event_name, event_id=event_id)


class Recorder:
    """A handler noting its calls in `log`; it has no __qualname__, so it compares by repr."""

    def __init__(self, label: str, log: list[Any], failures: list[Exception] | None = None):
        self.label = label
        self.log = log
        self.failures = list(failures or [])  # raised one per call, in order, then success

    def __call__(self, event: WorkflowEvent) -> None:
        self.log.append(self.label)
        if self.failures:
            raise self.failures.pop(0)

    def __repr__(self) -> str:
        return f"Recorder({self.label!r})"


class Boom(Exception):
    pass


# ---------------------------------------------------------------------------- route keys


async def test_a_dotted_key_matches_the_event_type() -> None:
    registry, calls = InMemoryEventRegistry(), []
    registry.register(TYPE, Recorder("type", calls))
    assert await registry.publish(an_event(TYPE, "something_else"))
    assert calls == ["type"]


async def test_a_dot_free_key_matches_the_event_name() -> None:
    registry, calls = InMemoryEventRegistry(), []
    registry.register(NAME, Recorder("name", calls))
    assert await registry.publish(an_event("other.type", NAME))
    assert calls == ["name"]


async def test_the_dot_alone_decides_type_or_name() -> None:
    registry, calls = InMemoryEventRegistry(), []
    registry.register("a.b", Recorder("dotted", calls))  # a type key, whatever the name says
    registry.register("plain", Recorder("dot-free", calls))  # a name key, whatever the type
    assert not await registry.publish(an_event(event_type="x.y", event_name="a.b"))
    assert not await registry.publish(an_event(event_type="plain", event_name="other"))
    assert calls == []


@pytest.mark.parametrize(
    "key",
    [
        f" {TYPE}",
        f"{TYPE} ",
        TYPE.upper(),
        "duly.model.*",
        "duly.*",
        "*",
        "duly.model",
        "duly",
        f"{TYPE}.",
        f" {NAME}",
        f"{NAME}\n",
        "Model_Updated",
        "model_*",
        "model",
        "updated",
    ],
)
async def test_keys_are_not_stripped_normalised_wildcarded_or_prefix_matched(key: str) -> None:
    registry, calls = InMemoryEventRegistry(), []
    registry.register(key, Recorder("near miss", calls))
    assert not await registry.publish(an_event(TYPE, NAME))
    assert calls == []


async def test_the_empty_string_is_a_valid_name_key() -> None:
    registry, calls = InMemoryEventRegistry(), []
    registry.register("", Recorder("empty", calls))
    assert not await registry.publish(an_event(TYPE, NAME))
    assert await registry.publish(an_event(TYPE, ""))
    assert calls == ["empty"]


# ---------------------------------------------------------------------- registration options


async def test_when_false_skips_the_route() -> None:
    registry, calls, asked = InMemoryEventRegistry(), [], []
    event = an_event()

    def never(given: WorkflowEvent) -> bool:
        asked.append(given)
        return False

    registry.register(NAME, Recorder("handler", calls), when=never)
    await registry.publish(event)
    assert asked == [event]
    assert calls == []


async def test_when_true_runs_the_route() -> None:
    registry, calls = InMemoryEventRegistry(), []
    registry.register(NAME, Recorder("handler", calls), when=lambda e: e.event_name == NAME)
    assert await registry.publish(an_event())
    assert calls == ["handler"]


async def test_the_validator_runs_before_the_predicate() -> None:
    registry, order = InMemoryEventRegistry(), []

    def validator(event: WorkflowEvent) -> bool:
        order.append("validator")
        return True

    def when(event: WorkflowEvent) -> bool:
        order.append("when")
        return True

    registry.register(NAME, Recorder("handler", order), when=when, validator=validator)
    assert await registry.publish(an_event())
    assert order == ["validator", "when", "handler"]


async def test_a_validator_returning_false_is_dead_lettered_unretried() -> None:
    dead: list[tuple[WorkflowEvent, BaseException]] = []
    registry, calls, asked = InMemoryEventRegistry(), [], []
    event = an_event()

    def refuse(given: WorkflowEvent) -> bool:
        asked.append("validator")
        return False

    def when(given: WorkflowEvent) -> bool:
        asked.append("when")
        return True

    registry.register(
        NAME,
        Recorder("handler", calls),
        validator=refuse,
        when=when,
        retries=3,
        dead_letter=lambda e, exc: dead.append((e, exc)),
    )
    assert not await registry.publish(event)
    assert asked == ["validator"]  # validated once, the predicate never asked
    assert calls == []
    assert len(dead) == 1
    assert dead[0][0] is event
    assert isinstance(dead[0][1], Exception)


async def test_a_validator_raising_is_dead_lettered_unretried() -> None:
    dead: list[tuple[WorkflowEvent, BaseException]] = []
    registry, calls, asked = InMemoryEventRegistry(), [], []
    failure = Boom("not valid")
    event = an_event()

    def validator(given: WorkflowEvent) -> bool:
        asked.append("validator")
        raise failure

    registry.register(
        NAME,
        Recorder("handler", calls),
        validator=validator,
        retries=3,
        dead_letter=lambda e, exc: dead.append((e, exc)),
    )
    assert not await registry.publish(event)
    assert asked == ["validator"]
    assert calls == []
    assert dead == [(event, failure)]


async def test_a_failing_handler_gets_retries_extra_attempts() -> None:
    dead: list[tuple[WorkflowEvent, BaseException]] = []
    registry, calls = InMemoryEventRegistry(), []
    failures: list[Exception] = [Boom("1"), Boom("2"), Boom("3"), Boom("4")]
    last = failures[2]
    event = an_event()
    registry.register(
        NAME,
        Recorder("handler", calls, failures),
        retries=2,
        dead_letter=lambda e, exc: dead.append((e, exc)),
    )
    assert not await registry.publish(event)
    assert calls == ["handler"] * 3
    assert dead == [(event, last)]  # once, with the last failure


async def test_a_handler_succeeding_within_its_budget_completes() -> None:
    dead: list[object] = []
    registry, calls = InMemoryEventRegistry(), []
    registry.register(
        NAME,
        Recorder("handler", calls, [Boom(), Boom()]),
        retries=2,
        dead_letter=lambda e, exc: dead.append(exc),
    )
    assert await registry.publish(an_event())
    assert calls == ["handler"] * 3
    assert dead == []


async def test_no_retries_by_default() -> None:
    dead: list[object] = []
    registry, calls = InMemoryEventRegistry(dead_letter_handler=lambda e, exc: dead.append(exc)), []
    registry.register(NAME, Recorder("handler", calls, [Boom(), Boom()]))
    assert not await registry.publish(an_event())
    assert calls == ["handler"]
    assert len(dead) == 1


async def test_retry_on_none_retries_every_exception() -> None:
    dead: list[object] = []
    registry, calls = InMemoryEventRegistry(dead_letter_handler=lambda e, exc: dead.append(exc)), []
    kinds: list[Exception] = [ValueError(), KeyError("k"), RuntimeError(), ConnectionError()]
    registry.register(NAME, Recorder("handler", calls, kinds), retries=4, retry_on=None)
    assert await registry.publish(an_event())
    assert calls == ["handler"] * 5
    assert dead == []

    # ... until the budget is exhausted.
    exhausted = [OSError(), LookupError(), TypeError()]
    registry.register("other", Recorder("exhausted", calls, exhausted), retries=1)
    assert not await registry.publish(an_event(event_name="other"))
    assert calls.count("exhausted") == 2
    assert dead == [exhausted[1]]  # the last failure of the budget


async def test_retry_on_false_stops_retrying() -> None:
    dead: list[object] = []
    judged: list[BaseException] = []
    registry, calls = InMemoryEventRegistry(), []
    failure = Boom("permanent")

    def retry_on(exc: BaseException) -> bool:
        judged.append(exc)
        return False

    registry.register(
        NAME,
        Recorder("handler", calls, [failure]),
        retries=5,
        retry_on=retry_on,
        dead_letter=lambda e, exc: dead.append(exc),
    )
    assert not await registry.publish(an_event())
    assert calls == ["handler"]
    assert judged == [failure]
    assert dead == [failure]


async def test_retry_on_selects_the_failures_to_retry() -> None:
    dead: list[object] = []
    registry, calls = InMemoryEventRegistry(), []
    permanent = ValueError("bad input")
    registry.register(
        NAME,
        Recorder("handler", calls, [ConnectionError(), permanent]),
        retries=5,
        retry_on=lambda exc: isinstance(exc, ConnectionError),
        dead_letter=lambda e, exc: dead.append(exc),
    )
    assert not await registry.publish(an_event())
    assert calls == ["handler"] * 2  # the transient failure retried, the permanent one not
    assert dead == [permanent]


async def test_negative_retries_mean_one_attempt() -> None:
    dead: list[object] = []
    registry, calls = InMemoryEventRegistry(dead_letter_handler=lambda e, exc: dead.append(exc)), []
    registration = registry.register(NAME, Recorder("handler", calls, [Boom(), Boom()]), retries=-3)
    assert registration.retries == 0
    assert not await registry.publish(an_event())
    assert calls == ["handler"]
    assert len(dead) == 1


async def test_handlers_may_be_sync_or_async() -> None:
    registry, calls = InMemoryEventRegistry(), []

    def plain(event: WorkflowEvent) -> None:
        calls.append("plain")

    async def coroutine(event: WorkflowEvent) -> None:
        await asyncio.sleep(0)
        calls.append("async")  # only reached when the coroutine is awaited

    registry.register(NAME, plain)
    registry.register(NAME, coroutine)
    assert await registry.publish(an_event())
    assert calls == ["plain", "async"]


async def test_async_handler_failures_are_retried() -> None:
    registry, calls = InMemoryEventRegistry(), []

    async def flaky(event: WorkflowEvent) -> None:
        await asyncio.sleep(0)
        calls.append("attempt")
        if len(calls) < 3:
            raise Boom

    registry.register(NAME, flaky, retries=2)
    assert await registry.publish(an_event())
    assert calls == ["attempt"] * 3


async def test_dead_letter_callbacks_may_be_sync_or_async() -> None:
    dead: list[tuple[str, str]] = []

    async def registry_level(event: WorkflowEvent, exc: BaseException) -> None:
        await asyncio.sleep(0)
        dead.append(("registry async", str(exc)))

    async def route_level(event: WorkflowEvent, exc: BaseException) -> None:
        await asyncio.sleep(0)
        dead.append(("route async", str(exc)))

    def route_level_plain(event: WorkflowEvent, exc: BaseException) -> None:
        dead.append(("route plain", str(exc)))

    registry, calls = InMemoryEventRegistry(dead_letter_handler=registry_level), []
    registry.register(NAME, Recorder("a", calls, [Boom("a")]))
    registry.register(NAME, Recorder("b", calls, [Boom("b")]), dead_letter=route_level)
    registry.register(NAME, Recorder("c", calls, [Boom("c")]), dead_letter=route_level_plain)
    assert not await registry.publish(an_event())
    assert dead == [("registry async", "a"), ("route async", "b"), ("route plain", "c")]


# ------------------------------------------------------------------------------- failures


@pytest.mark.parametrize("with_dead_letter", [True, False])
async def test_a_failed_route_does_not_stop_later_routes(with_dead_letter: bool) -> None:
    dead: list[object] = []
    handler = (lambda e, exc: dead.append(exc)) if with_dead_letter else None
    registry, calls = InMemoryEventRegistry(dead_letter_handler=handler), []
    registry.register(TYPE, Recorder("fails", calls, [Boom()]))
    registry.register(TYPE, Recorder("after", calls))
    registry.register(NAME, Recorder("name route", calls))
    assert await registry.publish(an_event())
    assert calls == ["fails", "after", "name route"]
    assert len(dead) == (1 if with_dead_letter else 0)


async def test_a_predicate_exception_propagates_unwrapped() -> None:
    dead: list[object] = []
    registry, calls = InMemoryEventRegistry(dead_letter_handler=lambda e, exc: dead.append(exc)), []
    failure = Boom("predicate broke")

    def when(event: WorkflowEvent) -> bool:
        raise failure

    registry.register(NAME, Recorder("handler", calls), when=when)
    with pytest.raises(Boom) as raised:
        await registry.publish(an_event())
    assert raised.value is failure
    assert calls == []
    assert dead == []


@pytest.mark.parametrize("level", ["registration", "registry"])
async def test_a_dead_letter_handler_exception_propagates(level: str) -> None:
    failure = Boom("dead letter broke")

    def dead_letter(event: WorkflowEvent, exc: BaseException) -> None:
        raise failure

    registry, calls = (
        InMemoryEventRegistry(dead_letter_handler=dead_letter if level == "registry" else None),
        [],
    )
    registry.register(
        NAME,
        Recorder("handler", calls, [ValueError()]),
        dead_letter=dead_letter if level == "registration" else None,
    )
    with pytest.raises(Boom) as raised:
        await registry.publish(an_event())
    assert raised.value is failure


async def test_a_retry_on_exception_propagates() -> None:
    dead: list[object] = []
    failure = Boom("retry_on broke")

    def retry_on(exc: BaseException) -> bool:
        raise failure

    registry, calls = InMemoryEventRegistry(dead_letter_handler=lambda e, exc: dead.append(exc)), []
    registry.register(
        NAME, Recorder("handler", calls, [ValueError()]), retries=3, retry_on=retry_on
    )
    with pytest.raises(Boom) as raised:
        await registry.publish(an_event())
    assert raised.value is failure
    assert calls == ["handler"]
    assert dead == []


async def test_the_registrations_dead_letter_handler_takes_precedence() -> None:
    dead: list[tuple[str, str]] = []
    registry, calls = (
        InMemoryEventRegistry(
            dead_letter_handler=lambda e, exc: dead.append(("registry", str(exc)))
        ),
        [],
    )

    def own(event: WorkflowEvent, exc: BaseException) -> None:
        dead.append(("own", str(exc)))

    registry.register(NAME, Recorder("with own", calls, [Boom("a")]), dead_letter=own)
    registry.register(NAME, Recorder("without", calls, [Boom("b")]))
    assert not await registry.publish(an_event())
    assert dead == [("own", "a"), ("registry", "b")]


class FalseyDeadLetter:
    """A valid dead-letter callable that happens to be falsey (as an empty collection is)."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def __call__(self, event: WorkflowEvent, exc: BaseException) -> None:
        self.log.append("own")

    def __len__(self) -> int:
        return 0


async def test_a_falsey_registration_dead_letter_handler_still_takes_precedence() -> None:
    dead: list[str] = []
    registry, calls = InMemoryEventRegistry(dead_letter_handler=lambda e, x: dead.append("reg")), []
    registry.register(
        NAME, Recorder("handler", calls, [Boom()]), dead_letter=FalseyDeadLetter(dead)
    )
    await registry.publish(an_event())
    assert dead == ["own"]


async def test_invalid_callables_fail_when_called() -> None:
    dead: list[BaseException] = []
    registry = InMemoryEventRegistry(dead_letter_handler=lambda e, exc: dead.append(exc))
    registry.register("bad_handler", 42)  # type: ignore[arg-type]
    registry.register("bad_predicate", handle, when="yes")  # type: ignore[arg-type]
    registry.register("bad_validator", handle, validator=3.5)  # type: ignore[arg-type]

    assert not await registry.publish(an_event(event_name="bad_handler"))
    assert len(dead) == 1
    assert isinstance(dead[0], TypeError)  # a handler failure, dead-lettered

    with pytest.raises(TypeError):  # a predicate failure, propagated
        await registry.publish(an_event(event_name="bad_predicate"))

    assert not await registry.publish(an_event(event_name="bad_validator"))
    assert len(dead) == 2
    assert isinstance(dead[1], TypeError)  # a validator failure, dead-lettered


@pytest.mark.parametrize("retries", ["2", None, 1.5j])
def test_non_integer_retries_fail_at_registration(retries: Any) -> None:
    with pytest.raises(TypeError):
        InMemoryEventRegistry().register(NAME, handle, retries=retries)


# ---------------------------------------------------------------------- identity and order


def handle(event: WorkflowEvent) -> None:
    handled.append(event.event_id)


handled: list[str] = []


@pytest.fixture(autouse=True)
def fresh_handled() -> None:
    handled.clear()


def handle_as(label: str, event: WorkflowEvent) -> None:
    handled.append(label)


def keep(event: WorkflowEvent) -> bool:
    return True


def validate(event: WorkflowEvent) -> bool:
    return True


def retry_anything(exc: BaseException) -> bool:
    return True


def drop(event: WorkflowEvent, exc: BaseException) -> None:
    pass


def other_drop(event: WorkflowEvent, exc: BaseException) -> None:
    pass


async def test_an_identical_registration_is_ignored() -> None:
    registry = InMemoryEventRegistry()
    options: dict[str, Any] = {
        "when": keep,
        "validator": validate,
        "retries": 2,
        "retry_on": retry_anything,
        "dead_letter": drop,
    }
    first = registry.register(NAME, handle, **options)
    second = registry.register(NAME, handle, **options)
    assert isinstance(first, Registration)
    assert second is first
    event = an_event()
    assert await registry.publish(event)
    assert event.event_id in handled
    assert handled == [event.event_id]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"key": TYPE}, {"key": NAME}),
        ({}, {"validator": validate}),
        ({}, {"when": keep}),
        ({}, {"retries": 1}),
        ({"retries": 1}, {"retries": 2}),
        ({}, {"retry_on": retry_anything}),
        ({}, {"dead_letter": drop}),
        ({"dead_letter": drop}, {"dead_letter": other_drop}),
    ],
    ids=[
        "key",
        "validator",
        "predicate",
        "retries",
        "retry count",
        "retry_on",
        "dead_letter",
        "other dead_letter",
    ],
)
async def test_changing_any_option_makes_a_separate_registration(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    registry = InMemoryEventRegistry()
    one = registry.register(first.pop("key", NAME), handle, **first)
    two = registry.register(second.pop("key", NAME), handle, **second)
    assert two is not one
    event = an_event()
    assert await registry.publish(event)
    assert handled == [event.event_id] * 2  # the same handler, twice


async def test_callables_compare_by_module_and_qualname() -> None:
    registry, calls = InMemoryEventRegistry(), []
    # Two different lambdas of one function share module and qualname: the same callable.
    first = registry.register(NAME, lambda e: calls.append("first"))
    second = registry.register(NAME, lambda e: calls.append("second"))
    assert second is first
    # ... and so for predicates: this registration is the one above, kept as it was.
    registry.register(NAME, lambda e: calls.append("third"), when=lambda e: True)
    registry.register(NAME, lambda e: calls.append("fourth"), when=lambda e: False)
    assert await registry.publish(an_event())
    assert calls == ["first", "third"]


async def test_callables_without_qualname_compare_by_repr() -> None:
    registry, calls = InMemoryEventRegistry(), []
    assert not hasattr(Recorder("x", calls), "__qualname__")
    kept = registry.register(NAME, Recorder("same", calls))
    assert registry.register(NAME, Recorder("same", [])) is kept  # another object, same repr
    registry.register(NAME, Recorder("different", calls))
    # functools.partial has no __qualname__ either: its repr names its function and arguments.
    p1 = registry.register(NAME, functools.partial(handle_as, "p1"))
    assert registry.register(NAME, functools.partial(handle_as, "p1")) is p1
    registry.register(NAME, functools.partial(handle_as, "p2"))
    assert await registry.publish(an_event())
    assert calls == ["same", "different"]
    assert handled == ["p1", "p2"]


async def test_the_identity_uses_the_clamped_retry_count() -> None:
    registry = InMemoryEventRegistry()
    zero = registry.register(NAME, handle, retries=0)
    assert registry.register(NAME, handle, retries=-1) is zero
    assert registry.register(NAME, handle, retries=-5) is zero
    assert registry.register(NAME, handle) is zero
    event = an_event()
    await registry.publish(event)
    assert handled == [event.event_id]


async def test_routes_run_in_registration_order_within_a_bucket() -> None:
    registry, calls = InMemoryEventRegistry(), []
    for label in ["t3", "t1", "t2"]:
        registry.register(TYPE, Recorder(label, calls))
    for label in ["n2", "n3", "n1"]:
        registry.register(NAME, Recorder(label, calls))
    assert await registry.publish(an_event())
    assert calls == ["t3", "t1", "t2", "n2", "n3", "n1"]


async def test_type_routes_run_before_name_routes() -> None:
    registry, calls = InMemoryEventRegistry(), []
    registry.register(NAME, Recorder("name, registered first", calls))
    registry.register(TYPE, Recorder("type, registered second", calls))
    assert await registry.publish(an_event())
    assert calls == ["type, registered second", "name, registered first"]


# -------------------------------------------------------------------------------- publish()


async def test_publish_is_true_when_one_handler_completes_and_another_fails() -> None:
    dead: list[object] = []
    registry, calls = InMemoryEventRegistry(dead_letter_handler=lambda e, exc: dead.append(exc)), []
    registry.register(NAME, Recorder("fails", calls, [Boom()]))
    registry.register(NAME, Recorder("completes", calls))
    registry.register(NAME, Recorder("fails too", calls, [Boom()]))
    assert await registry.publish(an_event()) is True
    assert calls == ["fails", "completes", "fails too"]
    assert len(dead) == 2


async def test_publish_is_false_when_every_applicable_handler_fails() -> None:
    registry, calls = InMemoryEventRegistry(dead_letter_handler=lambda e, exc: None), []
    registry.register(NAME, Recorder("fails", calls, [Boom()]))
    registry.register(TYPE, Recorder("fails too", calls, [Boom(), Boom()]), retries=1)
    registry.register(NAME, Recorder("invalid", calls), validator=lambda e: False)
    assert await registry.publish(an_event()) is False
    assert calls == ["fails too", "fails too", "fails"]


async def test_publish_is_false_when_nothing_matches() -> None:
    registry, calls = InMemoryEventRegistry(), []
    registry.register("another_event", Recorder("elsewhere", calls))
    assert await registry.publish(an_event()) is False
    assert await InMemoryEventRegistry().publish(an_event()) is False
    assert calls == []


async def test_when_false_routes_are_not_applicable() -> None:
    registry, calls = InMemoryEventRegistry(dead_letter_handler=lambda e, exc: None), []
    registry.register(NAME, Recorder("skipped", calls), when=lambda e: False)
    assert await registry.publish(an_event()) is False
    registry.register(NAME, Recorder("fails", calls, [Boom()]))
    assert await registry.publish(an_event()) is False
    assert calls == ["fails"]


async def test_a_duplicate_event_id_returns_false_and_routes_nothing() -> None:
    registry, calls = InMemoryEventRegistry(), []
    registry.register(NAME, Recorder("name", calls))
    registry.register("another_name", Recorder("another", calls))
    assert await registry.publish(an_event(event_id="evt-1")) is True
    # The same id on another event object, even of another name, is a duplicate.
    assert await registry.publish(an_event(event_id="evt-1")) is False
    assert await registry.publish(an_event(event_name="another_name", event_id="evt-1")) is False
    assert calls == ["name"]


async def test_the_id_is_marked_seen_before_routing() -> None:
    registry, calls, seen_during = (
        InMemoryEventRegistry(dead_letter_handler=lambda e, x: None),
        [],
        [],
    )

    def fails(event: WorkflowEvent) -> None:
        seen_during.append(registry.seen(event.event_id))
        calls.append("fails")
        raise Boom

    registry.register(NAME, fails)
    event = an_event()
    assert not registry.seen(event.event_id)
    assert await registry.publish(event) is False
    assert seen_during == [True]
    # The failure did not make the id publishable again.
    assert await registry.publish(event) is False
    assert calls == ["fails"]


async def test_the_seen_id_cache_evicts_the_oldest_id() -> None:
    registry, calls = InMemoryEventRegistry(max_seen_event_ids=2), []
    registry.register(NAME, Recorder("handler", calls))
    assert await registry.publish(an_event(event_id="a"))
    assert await registry.publish(an_event(event_id="b"))
    assert not await registry.publish(an_event(event_id="a"))  # a duplicate: still the oldest
    assert await registry.publish(an_event(event_id="c"))  # full: "a" is evicted
    assert not registry.seen("a")
    assert registry.seen("b")
    assert registry.seen("c")
    assert not await registry.publish(an_event(event_id="b"))
    assert await registry.publish(an_event(event_id="a"))  # forgotten, so routed again
    assert not registry.seen("b")
    assert calls == ["handler"] * 4


# -------------------------------------------------------------------------------- locking


async def test_handlers_run_outside_the_lock() -> None:
    registry, calls, finished = InMemoryEventRegistry(), [], []

    def other_thread() -> None:
        # Each of these takes the registry's locks: a handler holding them would block it.
        registry.register("late", Recorder("late", calls))
        registry.seen("anything")
        asyncio.run(registry.publish(an_event(event_name="late")))
        finished.append(True)

    def handler(event: WorkflowEvent) -> None:
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(timeout=10)
        calls.append("handler")

    registry.register(NAME, handler)
    assert await registry.publish(an_event())
    assert finished == [True]
    assert calls == ["late", "handler"]


async def test_a_registration_added_during_routing_runs_for_later_events_only() -> None:
    registry, calls = InMemoryEventRegistry(), []

    async def registers_more(event: WorkflowEvent) -> None:
        calls.append(("first", event.event_id))
        if len(calls) == 1:
            # From another thread, and from this one: neither joins the snapshot in flight.
            await asyncio.to_thread(registry.register, NAME, Recorder("from a thread", calls))
            registry.register(TYPE, Recorder("from the handler", calls))

    registry.register(TYPE, registers_more)
    first, second = an_event(), an_event()
    assert await registry.publish(first)
    assert calls == [("first", first.event_id)]
    assert await registry.publish(second)
    assert calls[1:] == [("first", second.event_id), "from the handler", "from a thread"]


async def test_concurrent_registrations_while_publishing_are_all_kept() -> None:
    registry = InMemoryEventRegistry()
    ran: list[tuple[str, str]] = []  # (event id, handler label)
    threads, per_thread = 8, 50
    start = threading.Barrier(threads + 1)

    class Labelled:
        def __init__(self, label: str) -> None:
            self.label = label

        def __call__(self, event: WorkflowEvent) -> None:
            ran.append((event.event_id, self.label))

        def __repr__(self) -> str:
            return f"Labelled({self.label!r})"

    def register_many(thread: int) -> None:
        start.wait()
        for n in range(per_thread):
            registry.register(NAME, Labelled(f"{thread}:{n}"))

    workers = [threading.Thread(target=register_many, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    published = 0
    while any(worker.is_alive() for worker in workers):
        await registry.publish(an_event())
        published += 1
        await asyncio.sleep(0)
    for worker in workers:
        worker.join()

    # Every event ran each registration of its snapshot once.
    assert max(Counter(ran).values(), default=1) == 1
    final = an_event()
    assert await registry.publish(final)
    labels = [label for event_id, label in ran if event_id == final.event_id]
    assert len(labels) == threads * per_thread
    for thread in range(threads):  # each thread's registrations in the order it made them
        mine = [label for label in labels if label.startswith(f"{thread}:")]
        assert mine == [f"{thread}:{n}" for n in range(per_thread)]


def test_concurrent_identical_registrations_keep_one() -> None:
    registry = InMemoryEventRegistry()
    threads = 16
    start = threading.Barrier(threads)
    kept: list[Registration] = []

    def register() -> None:
        start.wait()
        kept.append(registry.register(NAME, handle, retries=1))

    workers = [threading.Thread(target=register) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len({id(registration) for registration in kept}) == 1
    event = an_event()
    assert asyncio.run(registry.publish(event))
    assert handled == [event.event_id]


def test_concurrent_publishes_of_one_id_route_it_once() -> None:
    registry, calls = InMemoryEventRegistry(), []
    registry.register(NAME, Recorder("handler", calls))
    threads = 16
    start = threading.Barrier(threads)
    results: list[bool] = []
    event = an_event()

    def publish() -> None:
        start.wait()
        results.append(asyncio.run(registry.publish(event)))

    workers = [threading.Thread(target=publish) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(results) == [False] * (threads - 1) + [True]
    assert calls == ["handler"]


async def test_retry_on_is_asked_only_while_the_budget_allows_another_attempt() -> None:
    asked: list[str] = []

    def retry_on(exc: BaseException) -> bool:
        asked.append(str(exc))
        return True

    def fail(event: WorkflowEvent) -> None:
        raise RuntimeError(f"try {len(asked) + 1}")

    registry = InMemoryEventRegistry(dead_letter_handler=lambda event, error: None)
    registry.register("order_placed", fail, retries=2, retry_on=retry_on)
    assert await registry.publish(WorkflowEvent("shop.order.placed", "order_placed")) is False
    assert asked == ["try 1", "try 2"]  # three attempts, two questions
