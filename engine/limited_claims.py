"""Claiming a limited workflow: a group at a time, longest-waiting group first.

One statement finds the groups that can start something now (due work of the
served steps, fewer running than `at_most`, a whole token in the bucket),
oldest due row first. Each is then claimed in a short transaction of its
own: an advisory lock on (table, group) first, then, in the next statement
and so with a snapshot taken after the lock, the count of the group's running
rows and its bucket, the claim itself and the bucket's new level. Workers
claiming the same group queue on the lock for one transaction; different
groups never wait for each other.

Finding the groups walks the `(group, wake_at)` index one probe per group
(a skip scan), so a pass costs the number of groups with scheduled work, not
the number of rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Double,
    Integer,
    Row,
    Table,
    Text,
    bindparam,
    cast,
    func,
    literal,
    select,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from engine.claims import lease_update
from engine.clock import db_now
from engine.errors import ConfigurationError
from engine.limits import Limit
from engine.workflow import WorkflowInfo


def needs_bucket(infos: Sequence[WorkflowInfo], bucket: type[Any] | None) -> None:
    """Refuse to serve a rate-limited workflow without a RateBucket table to count in."""
    rated = [info.cls.__name__ for info in infos if info.limit and info.limit.rate is not None]
    if rated and bucket is None:
        raise ConfigurationError(
            f"{', '.join(rated)} {'has' if len(rated) == 1 else 'have'} a rate limit, but no "
            "RateBucket table exists: map `class WorkflowRate(Base, RateBucket)` and create it."
        )


async def claim_limited(
    lookup: AsyncConnection,
    claiming: AsyncConnection,
    info: WorkflowInfo,
    want: int,
    lease: timedelta,
    steps: tuple[str, ...] | None,
    bucket: Table | None,
) -> list[Row[Any]]:
    """Lease up to `want` due rows of a limited table, each group within its limit.

    `lookup` runs each statement in its own transaction; `claiming` must not,
    since a group's lock lasts for its claim's transaction.
    """
    found = await lookup.execute(_groups_statement(info, steps, bucket), {"want": want})
    claimed: list[Row[Any]] = []
    claim = _group_claim_statement(info, steps, bucket)
    lock = _lock_statement(info)
    for group in found.scalars().all():
        if len(claimed) >= want:
            break
        async with claiming.begin():
            await claiming.execute(lock, {"group": group})
            rows = await claiming.execute(
                claim, {"group": group, "want": want - len(claimed), "lease": lease}
            )
            claimed.extend(rows.all())
    return claimed


def _limit(info: WorkflowInfo) -> Limit:
    assert info.limit is not None
    return info.limit


def _served(next_step: Any, steps: tuple[str, ...] | None) -> ColumnElement[bool]:
    result: ColumnElement[bool] = next_step.isnot(None) if steps is None else next_step.in_(steps)
    return result


def _running(info: WorkflowInfo, group: Any, now: Any) -> Any:
    """How many of `group` are leased now, by the index of leased rows."""
    leased = info.table.alias("leased")
    column = leased.c[_limit(info).by]
    return (
        select(func.count())
        .select_from(leased)
        .where(column == group, leased.c.claimed_until > now)
        .scalar_subquery()
    )


def _tokens(info: WorkflowInfo, bucket: Table, group: Any, now: Any) -> Any:
    """The group's bucket refilled to `now`: full when it has no row (or was truncated)."""
    limit = _limit(info)
    elapsed = func.greatest(cast(func.extract("epoch", now - bucket.c.refilled_at), Double), 0)
    refilled = bucket.c.tokens + elapsed * literal(limit.refill_per_second, Double)
    stored = (
        select(func.least(refilled, literal(float(limit.rate or 0), Double)))
        .where(bucket.c.workflow == info.name, bucket.c.group_key == cast(group, Text))
        .scalar_subquery()
    )
    return func.coalesce(stored, literal(float(limit.rate or 0), Double))


@lru_cache(maxsize=256)
def _groups_statement(
    info: WorkflowInfo, steps: tuple[str, ...] | None, bucket: Table | None
) -> Executable:
    """Up to `want` groups that can start a step now, the longest-waiting first."""
    limit = _limit(info)
    table = info.table
    now = db_now()
    # Every distinct group with something scheduled: a skip scan of (group, wake_at).
    column = table.c[limit.by]
    first = select(column.label("grp")).where(table.c.next_step.isnot(None))
    groups = first.order_by(column).limit(1).cte("groups", recursive=True)
    later = table.alias("later")
    following = (
        select(later.c[limit.by])
        .where(later.c.next_step.isnot(None), later.c[limit.by] > groups.c.grp)
        .order_by(later.c[limit.by])
        .limit(1)
        .scalar_subquery()
    )
    groups = groups.union_all(select(following).where(groups.c.grp.isnot(None)))
    group = groups.c.grp
    # Since when each has waited: its oldest due row of the served steps.
    waiting = table.alias("waiting")
    since = (
        select(func.min(waiting.c.wake_at))
        .where(
            waiting.c[limit.by] == group,
            waiting.c.next_step.isnot(None),
            _served(waiting.c.next_step, steps),
            waiting.c.wake_at <= now,
        )
        .scalar_subquery()
    )
    columns = [group.label("grp"), since.label("since")]
    if limit.at_most is not None:
        columns.append(_running(info, group, now).label("running"))
    if bucket is not None and limit.rate is not None:
        columns.append(_tokens(info, bucket, group, now).label("tokens"))
    # Materialized, so each probe runs once per group rather than once per mention.
    candidates = (
        select(*columns).where(group.isnot(None)).cte("candidates").prefix_with("MATERIALIZED")
    )
    able: list[ColumnElement[bool]] = [candidates.c.since.isnot(None)]
    if limit.at_most is not None:
        able.append(candidates.c.running < limit.at_most)
    if "tokens" in candidates.c:
        able.append(candidates.c.tokens >= 1)
    return (
        select(candidates.c.grp)
        .where(*able)
        .order_by(candidates.c.since)
        .limit(bindparam("want", type_=Integer))
    )


@lru_cache(maxsize=256)
def _lock_statement(info: WorkflowInfo) -> Executable:
    """Queue behind any other claim of this group; no WAL flush wait, as for every claim."""
    column = info.table.c[_limit(info).by]
    group = cast(bindparam("group", type_=column.type), Text)
    return select(
        func.pg_advisory_xact_lock(
            func.hashtext(literal(info.table.fullname)), func.hashtext(group)
        ),
        func.set_config("synchronous_commit", "off", True),
    )


@lru_cache(maxsize=256)
def _group_claim_statement(
    info: WorkflowInfo, steps: tuple[str, ...] | None, bucket: Table | None
) -> Executable:
    """Lease the group's oldest due rows, as many as its limit and bucket allow now."""
    limit = _limit(info)
    table = info.table
    column = table.c[limit.by]
    group = bindparam("group", type_=column.type)
    now = db_now()
    allowed: list[Any] = [bindparam("want", type_=Integer)]
    if limit.at_most is not None:
        allowed.append(limit.at_most - _running(info, group, now))
    tokens = None
    if bucket is not None and limit.rate is not None:
        tokens = _tokens(info, bucket, group, now)
        allowed.append(cast(func.floor(tokens), Integer))
    due = (
        select(*info.mapper.primary_key, table.c.wake_at)
        .where(
            column == group,
            table.c.next_step.isnot(None),
            _served(table.c.next_step, steps),
            table.c.wake_at <= now,
        )
        .order_by(table.c.wake_at)
        .limit(func.greatest(func.least(*allowed), 0) if len(allowed) > 1 else allowed[0])
        .with_for_update(skip_locked=True)
        .cte("due")
    )
    claim = lease_update(info, due)
    if tokens is None or bucket is None:
        return claim
    # What this claim spent leaves the bucket, refilled to now, in the same statement.
    spent = select(func.count()).select_from(due).scalar_subquery()
    level = insert(bucket).from_select(
        ["workflow", "group_key", "tokens", "refilled_at"],
        select(literal(info.name), cast(group, Text), tokens - spent, now),
    )
    level = level.on_conflict_do_update(
        index_elements=[bucket.c.workflow, bucket.c.group_key],
        set_={"tokens": level.excluded.tokens, "refilled_at": level.excluded.refilled_at},
    )
    return claim.add_cte(level.cte("spent"))
