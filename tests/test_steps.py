"""Steps and calls: arguments are checked where the call is built."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from engine import Call, StepError, step, wake_in
from engine.model.steps import RetryPolicy, as_call
from functions.examples import Onboarding
from tests.apps.behaviour import Flaky


def test_a_bare_step_is_the_step_and_calling_it_builds_a_call() -> None:
    call = Onboarding.activated("pro")
    assert isinstance(call, Call)
    assert call.step is Onboarding.activated and call.args == ("pro",)
    assert as_call(Onboarding.check).encoded == {"args": [], "kwargs": {}}


def test_wrong_arguments_name_the_step() -> None:
    with pytest.raises(TypeError, match=r"Onboarding\.activated"):
        Onboarding.activated("pro", "extra")  # type: ignore[call-arg]
    with pytest.raises(StepError, match=r"Onboarding\.activated"):
        Onboarding.activated(colour="red")  # type: ignore[call-arg]


def test_a_bare_step_that_needs_arguments_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Onboarding\.activated needs arguments"):
        wake_in(Onboarding.activated, timedelta(days=1))  # type: ignore[arg-type]


def test_arguments_that_are_not_json_are_refused() -> None:
    with pytest.raises(TypeError, match=r"Flaky\.needs.*JSON"):
        Flaky.needs(object())  # type: ignore[arg-type]


def test_a_step_must_be_a_function_whose_body_runs() -> None:
    with pytest.raises(StepError, match="'async def' or a plain 'def'"):

        class _Generator:
            @step  # type: ignore[type-var]
            def work(self) -> Iterator[int]:
                yield 1

    with pytest.raises(StepError, match="'async def' or a plain 'def'"):
        step(print)  # type: ignore[type-var]


def test_backoff_doubles_up_to_the_cap_and_gives_up_after_the_retries() -> None:
    policy = RetryPolicy(
        retries=4, backoff=timedelta(seconds=30), max_backoff=timedelta(seconds=100)
    )
    delays = [policy.delay_after(n) for n in range(1, 6)]
    assert delays == [
        timedelta(seconds=30),
        timedelta(seconds=60),
        timedelta(seconds=100),
        timedelta(seconds=100),
        None,
    ]
    assert RetryPolicy().delay_after(1) is None
    assert RetryPolicy(retries=40).delay_after(30) == timedelta(hours=1)
