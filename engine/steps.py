"""Steps: the methods of a workflow the engine runs, and the calls that name them.

`@step` turns an `async def` method into a `Step`. On the class, `Model.check`
is the step itself (usable bare when it takes no arguments) and
`Model.activated("pro")` builds a `Call` without running anything: arguments
are bound to the step's signature and serialised to JSON right there, so a
mistake is a `StepError` (a `TypeError`) at the line that made it, before any
row is written.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from engine.errors import StepError

if TYPE_CHECKING:
    from engine.workflow import WorkflowMethods

DEFAULT_LANE = "default"
DEFAULT_BACKOFF = timedelta(seconds=1)  # first retry delay; doubles each attempt
DEFAULT_MAX_BACKOFF = timedelta(hours=1)

W = TypeVar("W", bound="WorkflowMethods")
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class RetryPolicy:
    """How often a step is tried again after it fails, and how long between tries."""

    retries: int = 0
    backoff: timedelta = DEFAULT_BACKOFF
    max_backoff: timedelta = DEFAULT_MAX_BACKOFF

    def delay_after(self, failures: int) -> timedelta | None:
        """The wait before the next try after `failures` failed attempts, or None to give up."""
        if failures > self.retries:
            return None
        delay: timedelta = min(self.backoff * (2 ** (failures - 1)), self.max_backoff)
        return delay


class Step(Generic[W, P]):
    """A workflow method the engine runs; calling it on the class builds a `Call`."""

    def __init__(
        self,
        fn: Callable[Concatenate[W, P], Awaitable[object]],
        *,
        retry: RetryPolicy,
        lane: str,
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise StepError(f"Step {fn.__qualname__} must be declared with 'async def'.")
        self.fn = fn
        self.retry = retry
        self.lane = lane
        self.name = fn.__name__
        self.owner: type[Any] | None = None
        self.signature = inspect.signature(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.owner = owner
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type[Any] | None = None) -> Step[W, P]: ...
    @overload
    def __get__(self, obj: object, objtype: type[Any] | None = None) -> Step[W, P]: ...
    def __get__(self, obj: object | None, objtype: type[Any] | None = None) -> Step[W, P]:
        return self

    @property
    def qualname(self) -> str:
        """`Model.step`, as messages name it."""
        owner = self.owner.__name__ if self.owner is not None else "<unbound>"
        return f"{owner}.{self.name}"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Call[W]:
        return Call(self, _check_arguments(self, args, kwargs), args, dict(kwargs))

    def __repr__(self) -> str:
        return f"<step {self.qualname}>"


@dataclass(frozen=True)
class Call(Generic[W]):
    """A step with its arguments, to be run by the engine later."""

    step: Step[W, Any]
    encoded: dict[str, Any] = field(repr=False)
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.step.qualname}({', '.join(shown)})"


def as_call(target: Step[Any, Any] | Call[Any]) -> Call[Any]:
    """A `Call` for `target`: a bare step must be one that takes no arguments."""
    if isinstance(target, Call):
        return target
    if isinstance(target, Step):
        try:
            encoded = _check_arguments(target, (), {})
        except StepError:
            raise StepError(
                f"Step {target.qualname} needs arguments: pass {target.qualname}(...), "
                "not the bare step."
            ) from None
        return Call(target, encoded)
    raise StepError(f"Expected a step or a call of one, got {target!r} ({type(target).__name__}).")


def as_call_unchecked(target: Step[Any, Any]) -> Call[Any]:
    """A call of `target` whose arguments are not known yet (they come with an event)."""
    return Call(target, {"args": [], "kwargs": {}})


def check_owner(call: Call[Any], workflow: type[Any]) -> None:
    """Refuse a call of another workflow's step."""
    owner = call.step.owner
    if owner is None or not issubclass(workflow, owner):
        raise StepError(
            f"Step {call.step.qualname} belongs to another workflow and cannot run on "
            f"{workflow.__name__}."
        )


def decode_arguments(encoded: dict[str, Any] | None) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments stored in `next_args`."""
    if not encoded:
        return [], {}
    return list(encoded.get("args", [])), dict(encoded.get("kwargs", {}))


def _check_arguments(
    step: Step[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    try:
        step.signature.bind(None, *args, **kwargs)
    except TypeError as exc:
        raise StepError(f"Step {step.qualname} does not accept these arguments: {exc}.") from None
    encoded = {"args": list(args), "kwargs": kwargs}
    try:
        json.dumps(encoded)
    except (TypeError, ValueError) as exc:
        raise StepError(
            f"Arguments to step {step.qualname} must be JSON-serializable: {exc}."
        ) from None
    return encoded


@overload
def step(fn: Callable[Concatenate[W, P], Awaitable[R]], /) -> Step[W, P]: ...
@overload
def step(
    *,
    retries: int = 0,
    backoff: timedelta = DEFAULT_BACKOFF,
    max_backoff: timedelta = DEFAULT_MAX_BACKOFF,
    lane: str = DEFAULT_LANE,
) -> Callable[[Callable[Concatenate[W, P], Awaitable[R]]], Step[W, P]]: ...
def step(
    fn: Callable[Concatenate[W, P], Awaitable[R]] | None = None,
    /,
    *,
    retries: int = 0,
    backoff: timedelta = DEFAULT_BACKOFF,
    max_backoff: timedelta = DEFAULT_MAX_BACKOFF,
    lane: str = DEFAULT_LANE,
) -> Step[W, P] | Callable[[Callable[Concatenate[W, P], Awaitable[R]]], Step[W, P]]:
    """Declare a workflow step: `@step`, or `@step(retries=3, backoff=..., lane=...)`."""
    if retries < 0:
        raise ValueError(f"retries must be zero or more, not {retries}.")
    if backoff <= timedelta(0) or max_backoff < backoff:
        raise ValueError("backoff must be positive and no longer than max_backoff.")
    policy = RetryPolicy(retries=retries, backoff=backoff, max_backoff=max_backoff)

    def decorate(f: Callable[Concatenate[W, P], Awaitable[R]]) -> Step[W, P]:
        return Step(f, retry=policy, lane=lane)

    return decorate(fn) if fn is not None else decorate
