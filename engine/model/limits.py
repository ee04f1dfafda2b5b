"""Limits: how much of one group may run at once, and how often it may start.

`__workflow_limit__ = Limit(by="customer", at_most=3)` on a workflow counts
the rows of one customer whose step is running (leased), across every worker.
`rate=60, per=timedelta(minutes=1)` adds a token bucket per group that
refills continuously and holds one period's worth, kept in the application's
`RateBucket` table: one row per group, read by nothing else, so truncating it
only starts every limit full again. How a limited table is claimed lives in
`engine.claims.limited`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import DateTime, Double, String, Table, Text
from sqlalchemy.orm import Mapped, mapped_column

from engine.base.errors import ConfigurationError
from engine.base.subclasses import mapped_subclasses


@dataclass(frozen=True)
class Limit:
    """At most `at_most` running, and `rate` starts per `per`, for each value of column `by`."""

    by: str
    at_most: int | None = None
    rate: float | None = None
    per: timedelta | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.by, str) or not self.by:
            raise ConfigurationError(f"Limit(by=...) must name a column, not {self.by!r}.")
        if self.at_most is None and self.rate is None:
            raise ConfigurationError(f"Limit(by={self.by!r}) needs at_most, rate, or both.")
        if self.at_most is not None and (
            isinstance(self.at_most, bool) or not isinstance(self.at_most, int) or self.at_most < 1
        ):
            raise ConfigurationError(
                f"Limit at_most must be a whole number >= 1, not {self.at_most!r}."
            )
        if self.rate is not None:
            if isinstance(self.rate, bool) or not isinstance(self.rate, int | float):
                raise ConfigurationError(f"Limit rate must be a number, not {self.rate!r}.")
            if not math.isfinite(self.rate) or self.rate < 1:
                # Below one start per period the bucket could never hold a whole token.
                raise ConfigurationError(
                    f"Limit rate must be at least 1 per period, not {self.rate!r}."
                )
            if not isinstance(self.per, timedelta) or self.per <= timedelta(0):
                raise ConfigurationError(
                    f"Limit rate={self.rate!r} needs per=, a positive timedelta (the period), "
                    f"not {self.per!r}."
                )
        elif self.per is not None:
            raise ConfigurationError("Limit per= means nothing without rate=.")

    @property
    def refill_per_second(self) -> float:
        """Tokens the bucket gains per second of database time."""
        assert self.rate is not None and self.per is not None
        return self.rate / self.per.total_seconds()


def check_limit(limit: object, table: Table, owner: str) -> Limit:
    """The workflow's `__workflow_limit__`, checked against its table."""
    if not isinstance(limit, Limit):
        raise ConfigurationError(f"{owner}.__workflow_limit__ must be a Limit, not {limit!r}.")
    column = table.c.get(limit.by)
    if column is None:
        raise ConfigurationError(
            f"{owner} is limited by {limit.by!r}, which is not a column of {table.name}."
        )
    if column.nullable:
        # A NULL would be in no group: the count and the bucket need a value to key on.
        raise ConfigurationError(
            f"{owner} is limited by {limit.by!r}, which must be NOT NULL "
            f"(declare it Mapped[...] without Optional, or nullable=False)."
        )
    return limit


def rate_bucket_classes() -> list[type[Any]]:
    """Every RateBucket class mapped in this process."""
    return mapped_subclasses(RateBucket)


class RateBucketColumns:
    """The bucket table's registration, shared by both spellings."""

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)


class RateBucket(RateBucketColumns):
    """Map onto your own base to keep the token buckets of rate limits: one row per group."""

    workflow: Mapped[str] = mapped_column(String(63), primary_key=True)
    group_key: Mapped[str] = mapped_column(Text, primary_key=True)
    tokens: Mapped[float] = mapped_column(Double)
    refilled_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
