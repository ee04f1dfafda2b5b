"""`ActionRegistry`, one test per sentence of seed 000's "Actions".

- the registry is process-local: each registry has its own actions:
  test_each_registry_has_its_own_actions
- action names are exact strings, not normalised: test_names_match_exactly
- an action implements execute(context, params) and returns a result mapping or None,
  which execute() returns: test_execute_returns_the_actions_result
- async actions are awaited (duly's handlers may be async): test_async_actions_are_awaited
- context and params are mappings: plain dicts or read-only views, passed as they are:
  test_given_mappings_are_passed_as_they_are
- names are unique; registering one twice raises ActionAlreadyRegisteredError (a
  ValueError), the first action kept: test_registering_a_taken_name_raises
- ... unless replace=True: test_replace_true_replaces_the_action
- registration does not validate the action; an invalid one fails when executed:
  test_an_invalid_action_is_accepted_and_fails_when_executed
- get(name) returns the registered action: test_get_returns_the_registered_action
- ... or raises ActionNotFoundError (a NotFoundError, a LookupError):
  test_get_of_an_unknown_name_raises_not_found
- execute() looks the action up (unknown: ActionNotFoundError, not wrapped):
  test_execute_of_an_unknown_name_raises_not_found
- missing context and params become fresh empty dicts:
  test_missing_context_and_params_are_fresh_empty_dicts
- supplied mappings are preserved, falsey ones included:
  test_given_mappings_are_passed_as_they_are
- exceptions raised by the action come back wrapped in ActionExecutionError, the cause
  chained: test_action_exceptions_are_wrapped, test_async_action_exceptions_are_wrapped
- action error messages include the action name: test_error_messages_name_the_action
- names() returns the registered names sorted alphabetically: test_names_are_sorted
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import pytest

from engine import (
    ActionAlreadyRegisteredError,
    ActionError,
    ActionExecutionError,
    ActionNotFoundError,
    ActionRegistry,
    DulyError,
    NotFoundError,
)


class Recording:
    """An action that notes what it was given and returns `result`."""

    def __init__(self, result: Mapping[str, object] | None = None) -> None:
        self.result = result
        self.calls: list[tuple[Mapping[str, object], Mapping[str, object]]] = []

    def execute(
        self, context: Mapping[str, object], params: Mapping[str, object]
    ) -> Mapping[str, object] | None:
        self.calls.append((context, params))
        return self.result


class Failing:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def execute(self, context: Mapping[str, object], params: Mapping[str, object]) -> None:
        raise self.error


class Falsey(Mapping[str, object]):
    """An empty mapping of its own kind: falsey, and not a dict."""

    def __getitem__(self, key: str) -> object:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def test_each_registry_has_its_own_actions() -> None:
    one, two = ActionRegistry(), ActionRegistry()
    one.register("send_email", Recording())
    assert one.names() == ["send_email"]
    assert two.names() == []
    two.register("send_email", Recording())  # not taken in this registry


@pytest.mark.parametrize(
    "asked",
    ["Send_Email", "SEND_EMAIL", " send_email", "send_email ", "send-email", "sendemail", "send"],
)
async def test_names_match_exactly(asked: str) -> None:
    registry = ActionRegistry()
    registry.register("send_email", Recording())
    with pytest.raises(ActionNotFoundError):
        registry.get(asked)
    with pytest.raises(ActionNotFoundError):
        await registry.execute(asked)
    registry.register(asked, Recording())  # a different name: free to register
    assert registry.names() == sorted(["send_email", asked])


@pytest.mark.parametrize("result", [{"sent": True}, MappingProxyType({"id": 1}), {}, None])
async def test_execute_returns_the_actions_result(result: Mapping[str, object] | None) -> None:
    registry = ActionRegistry()
    registry.register("send_email", Recording(result))
    assert await registry.execute("send_email") is result


async def test_async_actions_are_awaited() -> None:
    result = {"sent": True}
    seen: list[tuple[Mapping[str, object], Mapping[str, object]]] = []

    class AsyncAction:
        async def execute(
            self, context: Mapping[str, object], params: Mapping[str, object]
        ) -> Mapping[str, object]:
            await asyncio.sleep(0)
            seen.append((context, params))
            return result

    registry = ActionRegistry()
    registry.register("send_email", AsyncAction())
    context, params = {"user": 1}, {"to": "ada@example.com"}
    assert await registry.execute("send_email", context=context, params=params) is result
    assert seen == [(context, params)]
    assert seen[0][0] is context
    assert seen[0][1] is params


def test_registering_a_taken_name_raises() -> None:
    registry, first = ActionRegistry(), Recording()
    registry.register("send_email", first)
    with pytest.raises(ActionAlreadyRegisteredError) as raised:
        registry.register("send_email", Recording())
    assert isinstance(raised.value, ValueError)
    assert isinstance(raised.value, ActionError)
    assert isinstance(raised.value, DulyError)
    assert registry.get("send_email") is first
    with pytest.raises(ActionAlreadyRegisteredError):  # even the same action again
        registry.register("send_email", first, replace=False)


async def test_replace_true_replaces_the_action() -> None:
    registry, second = ActionRegistry(), Recording({"by": "second"})
    registry.register("send_email", Recording({"by": "first"}))
    registry.register("send_email", second, replace=True)
    assert registry.get("send_email") is second
    assert await registry.execute("send_email") == {"by": "second"}
    assert registry.names() == ["send_email"]
    registry.register("audit", Recording(), replace=True)  # replace on a free name just adds
    assert registry.names() == ["audit", "send_email"]


async def test_an_invalid_action_is_accepted_and_fails_when_executed() -> None:
    registry, invalid = ActionRegistry(), object()
    registry.register("invalid", invalid)  # type: ignore[arg-type]
    assert registry.get("invalid") is invalid
    with pytest.raises(ActionExecutionError) as raised:
        await registry.execute("invalid")
    assert isinstance(raised.value.__cause__, AttributeError)


def test_get_returns_the_registered_action() -> None:
    registry, action = ActionRegistry(), Recording()
    registry.register("send_email", action)
    registry.register("audit", Recording())
    assert registry.get("send_email") is action


def test_get_of_an_unknown_name_raises_not_found() -> None:
    with pytest.raises(ActionNotFoundError) as raised:
        ActionRegistry().get("send_email")
    assert isinstance(raised.value, NotFoundError)
    assert isinstance(raised.value, LookupError)
    assert isinstance(raised.value, ActionError)


async def test_execute_of_an_unknown_name_raises_not_found() -> None:
    registry = ActionRegistry()
    registry.register("audit", Recording())
    with pytest.raises(ActionNotFoundError) as raised:
        await registry.execute("send_email", context={}, params={})
    assert not isinstance(raised.value, ActionExecutionError)


async def test_missing_context_and_params_are_fresh_empty_dicts() -> None:
    class Mutating(Recording):
        def execute(
            self, context: Mapping[str, object], params: Mapping[str, object]
        ) -> Mapping[str, object] | None:
            super().execute(context, params)
            context["touched"] = True  # type: ignore[index]
            params["touched"] = True  # type: ignore[index]
            return None

    registry, action = ActionRegistry(), Mutating()
    registry.register("send_email", action)
    await registry.execute("send_email")
    await registry.execute("send_email", context={"user": 1})
    await registry.execute("send_email", params={"to": "ada"})
    (c1, p1), (_, p2), (c3, _) = action.calls
    for mapping in (c1, p1, p2, c3):
        assert type(mapping) is dict
        assert mapping == {"touched": True}  # empty when given, then touched by the action
    assert len({id(m) for m in (c1, p1, p2, c3)}) == 4  # fresh every time, not shared


@pytest.mark.parametrize(
    "make",
    [
        dict,
        lambda: {"to": "ada"},
        lambda: MappingProxyType({}),
        lambda: MappingProxyType({"to": "ada"}),
        Falsey,
    ],
    ids=["empty dict", "dict", "empty proxy", "proxy", "falsey mapping"],
)
async def test_given_mappings_are_passed_as_they_are(make: Any) -> None:
    registry, action = ActionRegistry(), Recording()
    registry.register("send_email", action)
    context, params = make(), make()
    await registry.execute("send_email", context=context, params=params)
    assert len(action.calls) == 1
    assert action.calls[0][0] is context  # context first, then params
    assert action.calls[0][1] is params


async def test_action_exceptions_are_wrapped() -> None:
    registry, failure = ActionRegistry(), ConnectionError("smtp down")
    registry.register("send_email", Failing(failure))
    with pytest.raises(ActionExecutionError) as raised:
        await registry.execute("send_email", params={"to": "ada"})
    assert raised.value.__cause__ is failure
    assert isinstance(raised.value, ActionError)
    assert isinstance(raised.value, DulyError)


async def test_async_action_exceptions_are_wrapped() -> None:
    failure = ValueError("bad address")

    class AsyncFailing:
        async def execute(
            self, context: Mapping[str, object], params: Mapping[str, object]
        ) -> None:
            await asyncio.sleep(0)
            raise failure

    registry = ActionRegistry()
    registry.register("send_email", AsyncFailing())
    with pytest.raises(ActionExecutionError) as raised:
        await registry.execute("send_email")
    assert raised.value.__cause__ is failure


async def test_error_messages_name_the_action() -> None:
    registry = ActionRegistry()
    registry.register("send_email", Failing(RuntimeError("boom")))
    with pytest.raises(ActionAlreadyRegisteredError, match="send_email"):
        registry.register("send_email", Recording())
    with pytest.raises(ActionNotFoundError, match="notify_slack"):
        registry.get("notify_slack")
    with pytest.raises(ActionNotFoundError, match="notify_slack"):
        await registry.execute("notify_slack")
    with pytest.raises(ActionExecutionError, match="send_email"):
        await registry.execute("send_email")


def test_names_are_sorted() -> None:
    registry = ActionRegistry()
    assert registry.names() == []
    for name in ["send_email", "audit_log", "call_api", "notify"]:
        registry.register(name, Recording())
    assert registry.names() == ["audit_log", "call_api", "notify", "send_email"]
