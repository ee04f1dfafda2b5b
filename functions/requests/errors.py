"""The request layer's refusals: a value named by where it sits, a conflict, a refused row.

`InputError` carries each problem as (place, message, kind), the shape of
pydantic's errors, so every door can say where a value was refused without
echoing the value: HTTP as a 422's list, the console beside each form
field, a Lambda entry as one sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy.exc import DataError

from engine import DulyError, StepError, first_line

if TYPE_CHECKING:
    from pydantic import ValidationError

MAX_PROBLEMS = 20  # problems kept in one InputError
MAX_PROBLEM_TEXT = 200  # characters of one problem's message or place part

Place = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    """One refused value: where it sits in the request, why, and pydantic's kind of error."""

    loc: Place
    msg: str
    type: str = "value_error"

    def sentence(self) -> str:
        """The problem as one sentence: `where.it[0].sits: why.`"""
        place = spelled(self.loc)
        text = self.msg if self.msg.endswith(".") else f"{self.msg}."
        return f"{place}: {text}" if place else text


class InputError(DulyError, ValueError):
    """A value in the request cannot be used as given."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems[:MAX_PROBLEMS])
        super().__init__(" ".join(problem.sentence() for problem in self.problems) or None)

    @classmethod
    def at(cls, loc: Place, message: str) -> InputError:
        """One problem at `loc`."""
        return cls([Problem(loc, message)])


class ConflictError(DulyError):
    """The request is well formed, but what it addresses refuses it as it stands."""


class RowRefusedError(DulyError):
    """The database refused a row's values (a NOT NULL, CHECK or foreign key)."""


def spelled(loc: Place) -> str:
    """A place as people write it: `events[1].occurred_at`."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def shortened(value: str) -> str:
    """`value`, cut to MAX_PROBLEM_TEXT characters."""
    return value if len(value) <= MAX_PROBLEM_TEXT else value[: MAX_PROBLEM_TEXT - 1] + "…"


def from_validation(exc: ValidationError, *prefix: str | int) -> InputError:
    """pydantic's refusal as an InputError, each place under `prefix`."""
    problems = [
        Problem(
            (*prefix, *(p if isinstance(p, int) else shortened(str(p)) for p in error["loc"])),
            shortened(str(error["msg"])),
            str(error["type"]),
        )
        for error in exc.errors()
    ]
    return InputError(problems)


def problems_of(exc: BaseException) -> tuple[Problem, ...] | None:
    """The placed problems of a refusal: an InputError's, or a step's arguments refused by
    their model (a StepError raised from the ValidationError); None for any other error."""
    if isinstance(exc, InputError):
        return exc.problems
    if isinstance(exc, StepError) and isinstance(exc.__cause__, InputError):
        return exc.__cause__.problems
    return None


def refusal_of(exc: BaseException) -> str:
    """The sentence a client's mistake is answered and logged with at every door. A value
    PostgreSQL refused (SQLSTATE class 22, or psycopg refusing to send a NUL byte) is said
    by its first line: never the statement or its parameters, which hold the request's data."""
    if isinstance(exc, DataError):
        reason = first_line(getattr(exc, "orig", None), "invalid")
        return f"The database refused a value in this request: {reason.rstrip('.')}."
    return str(exc)
