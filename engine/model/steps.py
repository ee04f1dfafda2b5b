"""Steps: the methods of a workflow the engine runs, and the calls that name them.

`@step` turns a method into a `Step` (a plain `def` runs in a worker thread).
`Model.check` is the step itself (usable bare when it takes no arguments), and
`Model.activated("pro")` builds a `Call` without running anything: its arguments are
bound, serialised to JSON and checked against the step's annotations (pydantic, strict
JSON mode) right there, so a mistake is a `StepError` at the line that made it, before
any row is written. `@step(aliases=("old_name",))` keeps a renamed step's old names,
which rows may still name; `stop_on` names the errors never retried, `timeout` how long
one attempt may run.
"""

from __future__ import annotations

import inspect
import json
import math
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    TypeVar,
    get_type_hints,
    overload,
)

from engine.base.errors import ConfigurationError, StepError, StepFailed

if TYPE_CHECKING:
    from pydantic import BaseModel, ConfigDict, ValidationError

    from engine.runs.workflow import WorkflowMethods

DEFAULT_LANE = "default"
DEFAULT_BACKOFF = timedelta(seconds=1)  # first retry delay; doubles each attempt
DEFAULT_MAX_BACKOFF = timedelta(hours=1)
MAX_SHOWN_ERRORS = 3  # argument errors named in one StepError
MAX_SHOWN_VALUE = 60  # characters of a refused value in a message
# Strict: "12" is not an int and 12 is not a str; extra names are refused (the API's bodies).
# pydantic is imported when a step's parameters are first checked: a step that takes none,
# and a process that runs only such steps, never loads it.
ARGUMENTS_CONFIG: ConfigDict = {"strict": True, "extra": "forbid"}

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
        fn: Callable[Concatenate[W, P], object],
        *,
        retry: RetryPolicy,
        lane: str,
        aliases: tuple[str, ...] = (),
        stop_on: tuple[type[BaseException], ...] = (),
        timeout: timedelta | None = None,
        entry: bool = False,
    ) -> None:
        plain = not inspect.iscoroutinefunction(fn)
        generator = inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)
        if plain and (not inspect.isfunction(fn) or generator):
            # A generator's body would not run: it would return a generator, not a directive.
            raise StepError(f"Step {fn!r} must be declared with 'async def' or a plain 'def'.")
        self.fn = fn
        # A plain `def` runs in a worker thread, so it never blocks the event loop.
        self.plain = plain
        self.retry = retry
        self.lane = lane
        # Names rows may still carry from before a rename; the registry resolves them here.
        self.aliases = aliases
        # What fails the run at once: duly's own StepFailed, and the errors the step names.
        self.stop_on: tuple[type[BaseException], ...] = (StepFailed, *stop_on)
        self.timeout = timeout
        self.entry = entry  # declared a step runs may be started at from outside
        self.name = fn.__name__
        self.owner: type[Any] | None = None
        self.signature = inspect.signature(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self._arguments: StepArguments | None = None

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

    @property
    def arguments(self) -> StepArguments:
        """The pydantic model of this step's parameters, built at first use and kept."""
        if self._arguments is None:
            self._arguments = StepArguments.of(self)
        return self._arguments

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Call[W]:
        return Call(self, _check_arguments(self, args, kwargs), args, dict(kwargs))

    def call_named(self, named: Mapping[str, Any]) -> Call[W]:
        """A call from arguments by parameter name, as an HTTP body gives them.

        A `*args` parameter takes a list under its own name, a `**kwargs` one
        an object; positional-only parameters are passed by position.
        """
        unknown = set(named) - set(list(self.signature.parameters)[1:])
        if unknown:
            raise StepError(
                f"Step {self.qualname} has no parameter {', '.join(sorted(map(repr, unknown)))}."
            )
        first = next(iter(self.signature.parameters))
        bound = inspect.BoundArguments(self.signature, {first: None, **named})
        args, kwargs = bound.args[1:], bound.kwargs
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


class StepArguments:
    """A step's parameters as one pydantic model, which checks a call's arguments.

    Each parameter is a field under an alias of its own name (`*args` a list,
    `**kwargs` an object), so any parameter name works, `json` or `_x`
    included. `checked` is False when every field accepts anything: calls
    then skip validation.
    """

    def __init__(self, model: type[BaseModel], checked: bool) -> None:
        self.model = model
        self.checked = checked

    @classmethod
    def of(cls, step: Step[Any, Any]) -> StepArguments:
        """The model of `step`'s parameters (after `self`), from its resolved annotations."""
        from pydantic import Field, create_model

        parameters = list(step.signature.parameters.values())[1:]
        hints = _resolved_hints(step.fn, parameters)
        usable = {name: hint for name, hint in hints.items() if _usable(hint)}
        fields: dict[str, Any] = {}
        for number, parameter in enumerate(parameters):
            hint: Any = usable.get(parameter.name, Any)
            default: Any
            if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
                hint, default = list[hint], []
            elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
                hint, default = dict[str, hint], {}
            elif parameter.default is inspect.Parameter.empty:
                default = ...
            else:
                default = parameter.default if _is_json(parameter.default) else None
            fields[f"p{number}"] = (hint, Field(default, alias=parameter.name))
        name = step.qualname.replace(".", "_") + "_arguments"
        model = create_model(name, __config__=ARGUMENTS_CONFIG, **fields)
        return cls(model, checked=bool(usable))

    def validate(self, named: Mapping[str, Any]) -> None:
        """Check arguments by parameter name, as JSON; a ValidationError when they do not fit."""
        self.model.model_validate_json(json.dumps(dict(named), allow_nan=False))


def _resolved_hints(fn: Callable[..., Any], parameters: list[inspect.Parameter]) -> dict[str, Any]:
    """The annotations of `parameters` that resolve; the unannotated and unresolvable are left out.

    Annotations are text under `from __future__ import annotations`: they are
    resolved in the function's module, all at once, else one by one.
    """
    annotated = {p.name: p.annotation for p in parameters if p.annotation is not p.empty}
    try:
        hints = get_type_hints(fn, include_extras=True)
        return {name: hints[name] for name in annotated if name in hints}
    except Exception:  # a name that does not resolve: find which
        pass
    found = {}
    for name, annotation in annotated.items():
        holder = types.SimpleNamespace(__annotations__={name: annotation})
        try:
            found[name] = get_type_hints(holder, globalns=fn.__globals__, include_extras=True)[name]
        except Exception:  # unresolvable: this parameter is not checked
            continue
    return found


def _usable(hint: Any) -> bool:
    """Whether pydantic can check values against `hint` (not Any, and a schema it can build)."""
    if hint is Any or hint is object:
        return False
    from pydantic import TypeAdapter

    try:
        TypeAdapter(hint, config=ARGUMENTS_CONFIG)
    except Exception:  # a class pydantic has no schema for: accepted unchecked
        return False
    return True


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _check_arguments(
    step: Step[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    try:
        bound = step.signature.bind(None, *args, **kwargs)
    except TypeError as exc:
        raise StepError(f"Step {step.qualname} does not accept these arguments: {exc}.") from None
    encoded = {"args": list(args), "kwargs": kwargs}
    try:
        json.dumps(encoded, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StepError(
            f"Arguments to step {step.qualname} must be JSON-serializable: {exc}."
        ) from None
    if len(step.signature.parameters) == 1:  # `self` alone: nothing to check
        return encoded
    from pydantic import ValidationError

    arguments = step.arguments
    if arguments.checked:
        named = dict(list(bound.arguments.items())[1:])
        try:
            arguments.validate(named)
        except ValidationError as exc:
            raise StepError(
                f"Step {step.qualname} does not accept {describe_errors(exc)}."
            ) from None
    return encoded


def _check_aliases(aliases: Iterable[str]) -> tuple[str, ...]:
    """The former names as a tuple: each a non-empty string, none twice."""
    if isinstance(aliases, str):
        # A bare string would be taken for its letters.
        raise ConfigurationError(
            f"aliases must be a tuple of former step names, not a string: aliases=({aliases!r},)."
        )
    former = tuple(aliases)
    for name in former:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"An alias must be a step's former name, not {name!r}.")
    if len(set(former)) != len(former):
        raise ConfigurationError(f"aliases {former!r} name one step twice.")
    return former


def describe_errors(exc: ValidationError) -> str:
    """pydantic's errors as `name=value: why`, the first few, each value shortened."""
    shown = []
    for error in exc.errors()[:MAX_SHOWN_ERRORS]:
        where = ".".join(str(part) for part in error["loc"]) or "the arguments"
        value = repr(error.get("input"))
        if len(value) > MAX_SHOWN_VALUE:
            value = value[: MAX_SHOWN_VALUE - 1] + "…"
        message = str(error["msg"])
        shown.append(
            f"{where}: {message}" if error["type"] == "missing" else f"{where}={value}: {message}"
        )
    more = exc.error_count() - len(shown)
    return "; ".join(shown) + (f" (and {more} more)" if more > 0 else "")


@overload
def step(fn: Callable[Concatenate[W, P], object], /) -> Step[W, P]: ...
@overload
def step(
    *,
    retries: int = 0,
    backoff: timedelta = DEFAULT_BACKOFF,
    max_backoff: timedelta = DEFAULT_MAX_BACKOFF,
    lane: str = DEFAULT_LANE,
    aliases: Iterable[str] = (),
    stop_on: Iterable[type[BaseException]] | type[BaseException] = (),
    timeout: timedelta | float | None = None,
    entry: bool = False,
) -> Callable[[Callable[Concatenate[W, P], object]], Step[W, P]]: ...
def step(
    fn: Callable[Concatenate[W, P], object] | None = None,
    /,
    *,
    retries: int = 0,
    backoff: timedelta = DEFAULT_BACKOFF,
    max_backoff: timedelta = DEFAULT_MAX_BACKOFF,
    lane: str = DEFAULT_LANE,
    aliases: Iterable[str] = (),
    stop_on: Iterable[type[BaseException]] | type[BaseException] = (),
    timeout: timedelta | float | None = None,
    entry: bool = False,
) -> Step[W, P] | Callable[[Callable[Concatenate[W, P], object]], Step[W, P]]:
    """Declare a workflow step: `@step`, or `@step(retries=3, backoff=..., lane=...)`.

    `aliases` are the names this step had before a rename: a row that still
    names one runs this step (see `engine.model.registry`). `stop_on` errors
    (and `StepFailed`) fail the run without a retry; `timeout` (a timedelta or
    seconds) bounds each attempt; `entry=True` steps are where doors start runs.
    """
    if retries < 0:
        raise ConfigurationError(f"retries must be zero or more, not {retries}.")
    if backoff <= timedelta(0) or max_backoff < backoff:
        raise ConfigurationError("backoff must be positive and no longer than max_backoff.")
    if not isinstance(entry, bool):
        raise ConfigurationError(f"entry must be True or False, not {entry!r}.")
    policy = RetryPolicy(retries=retries, backoff=backoff, max_backoff=max_backoff)
    former = _check_aliases(aliases)
    stopping = _check_stop_on(stop_on)
    limit = _check_timeout(timeout)

    def decorate(f: Callable[Concatenate[W, P], object]) -> Step[W, P]:
        return Step(
            f,
            retry=policy,
            lane=lane,
            aliases=former,
            stop_on=stopping,
            timeout=limit,
            entry=entry,
        )

    return decorate(fn) if fn is not None else decorate


def _check_stop_on(
    stop_on: Iterable[type[BaseException]] | type[BaseException],
) -> tuple[type[BaseException], ...]:
    """The errors that stop a run, as a tuple of exception classes (one class alone is one)."""
    named = (stop_on,) if isinstance(stop_on, type) else stop_on
    if isinstance(named, str):
        raise ConfigurationError(f"stop_on takes exception classes, not the string {named!r}.")
    classes = tuple(named)
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            raise ConfigurationError(f"stop_on takes exception classes, not {cls!r}.")
    return classes


def _check_timeout(timeout: timedelta | float | None) -> timedelta | None:
    """A step's timeout as a positive timedelta (seconds accepted), or None for no timeout."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        limit = timeout
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
        if not math.isfinite(timeout):
            raise ConfigurationError(f"timeout must be a finite number of seconds, not {timeout}.")
        try:
            limit = timedelta(seconds=timeout)
        except OverflowError:
            raise ConfigurationError(f"timeout {timeout} seconds is too long.") from None
    else:
        raise ConfigurationError(
            f"timeout must be a timedelta or a number of seconds, not {timeout!r} "
            f"({type(timeout).__name__})."
        )
    if limit <= timedelta(0):
        raise ConfigurationError(f"timeout must be positive, not {timeout!r}.")
    return limit
