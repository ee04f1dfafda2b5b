"""The same mixins for models whose base is a `MappedAsDataclass`.

SQLAlchemy will not mix a plain class into a dataclass model, so these are
dataclass mixins: the engine columns are `init=False`, and `Onboarding(email=...)`
reads as it did before the mixin was added. Everything else is shared with
`engine.Workflow`; tests check that both declare the same columns.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Double, Float, Integer, String, Text, text
from sqlalchemy.orm import Mapped, MappedAsDataclass, mapped_column

from engine.model.attempt_log import AttemptLogColumns
from engine.model.limits import RateBucketColumns
from engine.runs.workflow import JSON_TYPE, STEP_NAME_LENGTH, WorkflowMethods

__all__ = ["AttemptLog", "RateBucket", "Workflow"]


class Workflow(MappedAsDataclass, WorkflowMethods):
    """Mix into a dataclass model to make its rows workflow runs."""

    next_step: Mapped[str | None] = mapped_column(
        String(STEP_NAME_LENGTH), default=None, init=False
    )
    next_args: Mapped[dict[str, Any] | None] = mapped_column(JSON_TYPE, default=None, init=False)
    wake_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), default=None, init=False
    )
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"), init=False)
    last_error: Mapped[str | None] = mapped_column(Text, default=None, init=False)
    claimed_until: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), default=None, init=False
    )
    waiting_for: Mapped[str | None] = mapped_column(
        String(STEP_NAME_LENGTH), default=None, init=False
    )
    pending_event: Mapped[dict[str, Any] | None] = mapped_column(
        JSON_TYPE, default=None, init=False
    )
    recent_event_keys: Mapped[list[str] | None] = mapped_column(JSON_TYPE, default=None, init=False)
    parent: Mapped[dict[str, Any] | None] = mapped_column(JSON_TYPE, default=None, init=False)
    children_left: Mapped[int | None] = mapped_column(Integer, default=None, init=False)
    wf_version: Mapped[int] = mapped_column(
        Integer, default=0, server_default=text("0"), init=False
    )


class AttemptLog(MappedAsDataclass, AttemptLogColumns):
    """The attempt history table for dataclass bases; the engine writes every row."""

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True, init=False)
    workflow: Mapped[str] = mapped_column(String(63), init=False)
    run_key: Mapped[str] = mapped_column(Text, init=False)
    step: Mapped[str] = mapped_column(String(200), init=False)
    attempt: Mapped[int] = mapped_column(Integer, init=False)
    outcome: Mapped[str] = mapped_column(String(16), init=False)
    error: Mapped[str | None] = mapped_column(Text, init=False)
    took_ms: Mapped[float] = mapped_column(Float, init=False)
    finished_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), primary_key=True, init=False
    )
    # A failed attempt's (outcome retry or failed); NULL for one that succeeded.
    traceback: Mapped[str | None] = mapped_column(Text, init=False)
    args: Mapped[Any] = mapped_column(JSON(none_as_null=True), nullable=True, init=False)


class RateBucket(MappedAsDataclass, RateBucketColumns):
    """The token buckets of rate limits for dataclass bases; the engine writes every row."""

    workflow: Mapped[str] = mapped_column(String(63), primary_key=True, init=False)
    group_key: Mapped[str] = mapped_column(Text, primary_key=True, init=False)
    tokens: Mapped[float] = mapped_column(Double, init=False)
    refilled_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), init=False)
