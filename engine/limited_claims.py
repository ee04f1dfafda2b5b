"""Claiming a limited workflow: a group at a time, longest-waiting group first.

A limited claim is one short transaction of two statements:

1. Choose: the groups that can start something now (due work of the served
   steps, fewer running than `at_most`, a whole token in the bucket), oldest
   due row first, as many as the claim wants; and take each one's advisory
   lock on (table, group) with `pg_try_advisory_xact_lock`. A group whose
   lock another worker holds is being claimed right now: it is passed over,
   so different groups never wait for each other, and neither does one group.
2. Claim: with a snapshot taken after the locks, so the count of each group's
   running rows is exact across workers, lease each locked group's oldest due
   rows, as many as its limit and bucket allow, in the order the groups were
   chosen, and leave each bucket what this claim spent of it.

Choosing walks the `(group, wake_at)` index one probe per group (a skip
scan), so a pass costs the number of groups with scheduled work, not the
number of rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Double,
    Integer,
    Row,
    Table,
    Text,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal,
    not_,
    null,
    select,
    tuple_,
    union_all,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from engine.claims import lease_update
from engine.clock import db_now
from engine.errors import ConfigurationError
from engine.limits import Limit
from engine.workflow import WorkflowInfo

PREFIX_ROWS_PER_SLOT = 32  # oldest due rows read, per row wanted, before visiting every group
PREFIX_ROWS = 256  # the same, when asking when work is next due


def needs_bucket(infos: Sequence[WorkflowInfo], bucket: type[Any] | None) -> None:
    """Refuse to serve a rate-limited workflow without a RateBucket table to count in."""
    rated = [info.cls.__name__ for info in infos if info.limit and info.limit.rate is not None]
    if rated and bucket is None:
        raise ConfigurationError(
            f"{', '.join(rated)} {'has' if len(rated) == 1 else 'have'} a rate limit, but no "
            "RateBucket table exists: map `class WorkflowRate(Base, RateBucket)` and create it."
        )


async def claim_limited(
    conn: AsyncConnection,
    info: WorkflowInfo,
    want: int,
    lease: timedelta,
    steps: tuple[str, ...] | None,
    bucket: Table | None,
) -> list[Row[Any]]:
    """Lease up to `want` due rows of a limited table, each group within its limit.

    `conn` must not be in autocommit mode: the group locks last for the
    claim's own transaction, which this opens and commits.
    """
    async with conn.begin():
        chosen = await conn.execute(_choose_statement(info, steps, bucket), {"want": want})
        groups = chosen.scalars().all()
        if not groups:
            return []
        claimed = await conn.execute(
            _claim_statement(info, steps, bucket),
            {"groups": list(groups), "want": want, "lease": lease},
        )
        return list(claimed.all())


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
    full = literal(float(limit.rate or 0), Double)
    elapsed = func.greatest(cast(func.extract("epoch", now - bucket.c.refilled_at), Double), 0)
    refilled = bucket.c.tokens + elapsed * literal(limit.refill_per_second, Double)
    stored = (
        select(func.least(refilled, full))
        .where(bucket.c.workflow == info.name, bucket.c.group_key == cast(group, Text))
        .scalar_subquery()
    )
    return func.coalesce(stored, full)


def _rated(info: WorkflowInfo, bucket: Table | None) -> Table | None:
    """The bucket table when this workflow has a rate, else None."""
    return bucket if _limit(info).rate is not None else None


def _every_group(info: WorkflowInfo, steps: tuple[str, ...] | None) -> Any:
    """(grp, since) for every group with scheduled work; since is NULL when none is due.

    A skip scan of (group, wake_at): the first entry past the last group gives
    the next group and its earliest wake_at at once, one index probe a group.
    """
    limit = _limit(info)
    table = info.table
    now = db_now()
    column = table.c[limit.by]
    groups = (
        select(column.label("grp"), table.c.wake_at.label("first_at"))
        .where(table.c.next_step.isnot(None))
        .order_by(column, table.c.wake_at)
        .limit(1)
        .cte(f"groups_{table.name}", recursive=True)
    )
    later = table.alias(f"later_{table.name}")
    following = (
        select(later.c[limit.by].label("grp"), later.c.wake_at.label("first_at"))
        .where(later.c.next_step.isnot(None), later.c[limit.by] > groups.c.grp)
        .order_by(later.c[limit.by], later.c.wake_at)
        .limit(1)
        .lateral("following")
    )
    groups = groups.union_all(
        select(following.c.grp, following.c.first_at).select_from(
            groups.join(following, literal(True))
        )
    )
    # Since when each has waited: its oldest due row (of the served steps, which for a
    # worker serving every step is the group's first entry, if that is due).
    since: Any
    if steps is None:
        since = case((groups.c.first_at <= now, groups.c.first_at))
    else:
        waiting = table.alias("waiting")
        since = (
            select(func.min(waiting.c.wake_at))
            .where(
                waiting.c[limit.by] == groups.c.grp,
                waiting.c.next_step.isnot(None),
                _served(waiting.c.next_step, steps),
                waiting.c.wake_at <= now,
            )
            .scalar_subquery()
        )
    return select(groups.c.grp, since.label("since")).subquery(f"every_{table.name}")


def _oldest_groups(info: WorkflowInfo, steps: tuple[str, ...] | None, rows: Any) -> Any:
    """(grp, since) for the groups of the oldest `rows` due rows: a prefix of the due index.

    Every group seen has waited longer than every group not seen (whose oldest
    due row comes after the whole prefix), so when enough of them can start,
    they are the longest-waiting ones, found without visiting every group.
    """
    limit = _limit(info)
    table = info.table
    prefix = (
        select(table.c[limit.by].label("grp"), table.c.wake_at)
        .where(
            table.c.next_step.isnot(None),
            _served(table.c.next_step, steps),
            table.c.wake_at <= db_now(),
        )
        .order_by(table.c.wake_at)
        .limit(rows)
        .subquery("prefix")
    )
    return (
        select(prefix.c.grp, func.min(prefix.c.wake_at).label("since"))
        .group_by(prefix.c.grp)
        .subquery(f"oldest_{table.name}")
    )


def _with_state(
    info: WorkflowInfo, bucket: Table | None, groups: Any, name: str
) -> tuple[Any, ColumnElement[bool]]:
    """`groups` (grp, since) with what their limit needs, as a CTE; and "can start now".

    Adds running (leased rows), when there is an `at_most`; tokens (the
    bucket refilled to now), when a rate.
    """
    limit = _limit(info)
    table = info.table
    now = db_now()
    columns = [groups.c.grp, groups.c.since]
    joined: Any = groups
    if limit.at_most is not None:
        # Few rows are leased at any time: count them all at once, not a probe a group.
        leased = table.alias("leased")
        running = (
            select(leased.c[limit.by].label("grp"), func.count().label("running"))
            .where(leased.c.claimed_until > now)
            .group_by(leased.c[limit.by])
            .subquery(f"running_{name}")
        )
        joined = joined.outerjoin(running, running.c.grp == groups.c.grp)
        columns.append(func.coalesce(running.c.running, 0).label("running"))
    rated = _rated(info, bucket)
    if rated is not None:
        columns.append(_tokens(info, rated, groups.c.grp, now).label("tokens"))
    # Materialized, so each probe runs once per group rather than once per mention.
    candidates = select(*columns).select_from(joined).cte(name).prefix_with("MATERIALIZED")
    able: list[ColumnElement[bool]] = [candidates.c.since.isnot(None)]
    if limit.at_most is not None:
        able.append(candidates.c.running < limit.at_most)
    if rated is not None:
        able.append(candidates.c.tokens >= 1)
    return candidates, and_(*able)


def _groups(
    info: WorkflowInfo, steps: tuple[str, ...] | None, bucket: Table | None
) -> tuple[Any, ColumnElement[bool]]:
    """Every group with scheduled work, with its limit's state (a CTE); and "can start now"."""
    return _with_state(info, bucket, _every_group(info, steps), f"candidates_{info.name}")


@lru_cache(maxsize=256)
def _choose_statement(
    info: WorkflowInfo, steps: tuple[str, ...] | None, bucket: Table | None
) -> Executable:
    """Up to `want` groups that can start a step now, longest-waiting first, each locked.

    The groups of the oldest due rows are asked first; only when too few of
    them can start are all groups visited (a one-time filter: the skip scan
    does not run otherwise).
    """
    want = bindparam("want", type_=Integer)
    oldest, oldest_able = _with_state(
        info,
        bucket,
        _oldest_groups(info, steps, want * PREFIX_ROWS_PER_SLOT),
        f"oldest_{info.name}",
    )
    every, every_able = _groups(info, steps, bucket)
    enough = select(func.count() >= want).select_from(oldest).where(oldest_able).scalar_subquery()
    pool = union_all(
        select(oldest.c.grp, oldest.c.since).where(oldest_able, enough),
        select(every.c.grp, every.c.since).where(every_able, not_(enough)),
    ).subquery("pool")
    chosen = select(pool.c.grp, pool.c.since).order_by(pool.c.since).limit(want).subquery("chosen")
    # Locked only once chosen (a LIMIT keeps the condition out of the subquery).
    locked = func.pg_try_advisory_xact_lock(
        func.hashtext(literal(info.table.fullname)), func.hashtext(cast(chosen.c.grp, Text))
    )
    # A claim need not wait for its WAL flush (see engine.claims): nor need this one.
    no_flush_wait = select(func.set_config("synchronous_commit", "off", True)).scalar_subquery()
    return select(chosen.c.grp).where(no_flush_wait.isnot(None), locked).order_by(chosen.c.since)


def ready_at(info: WorkflowInfo, steps: tuple[str, ...] | None, bucket: Table | None) -> Any:
    """When a group of this limited table can next start a step: a SQL expression.

    A group that can start now counts from its oldest due row; one short of
    a token, from when its bucket will hold one; one at its `at_most`, not at
    all, since it waits for a running step, whose lease's end is a wake_at of
    its own. NULL when no group has due work. When one of the oldest due
    rows' groups can start, the answer is its oldest row, and the other
    groups are not visited (COALESCE stops at its first answer).
    """
    oldest, oldest_able = _with_state(
        info, bucket, _oldest_groups(info, steps, PREFIX_ROWS), f"ready_oldest_{info.name}"
    )
    soonest_able = select(func.min(oldest.c.since)).where(oldest_able).scalar_subquery()
    candidates, _ = _groups(info, steps, bucket)
    limit = _limit(info)
    whens: list[tuple[ColumnElement[bool], Any]] = []
    if limit.at_most is not None:
        whens.append((candidates.c.running >= limit.at_most, null()))
    rated = _rated(info, bucket)
    if rated is not None:
        short = (1 - candidates.c.tokens) / literal(limit.refill_per_second, Double)
        wait = func.make_interval(0, 0, 0, 0, 0, 0, short)
        whens.append((candidates.c.tokens < 1, db_now() + wait))
    ready = case(*whens, else_=candidates.c.since) if whens else candidates.c.since
    soonest = select(func.min(ready)).where(candidates.c.since.isnot(None)).scalar_subquery()
    return func.coalesce(soonest_able, soonest)


@lru_cache(maxsize=256)
def _claim_statement(
    info: WorkflowInfo, steps: tuple[str, ...] | None, bucket: Table | None
) -> Executable:
    """Lease each locked group's oldest due rows, as many as its limit and bucket allow."""
    limit = _limit(info)
    table = info.table
    column = table.c[limit.by]
    pk = list(info.mapper.primary_key)
    now = db_now()
    want = bindparam("want", type_=Integer)
    chosen = (
        func.unnest(bindparam("groups", type_=ARRAY(column.type)))
        .table_valued("grp", with_ordinality="ord")
        .render_derived("chosen")
    )
    allowed: list[Any] = []
    if limit.at_most is not None:
        allowed.append(limit.at_most - _running(info, chosen.c.grp, now))
    rated = _rated(info, bucket)
    if rated is not None:
        allowed.append(cast(func.floor(_tokens(info, rated, chosen.c.grp, now)), Integer))
    allowance = (
        select(
            chosen.c.grp,
            chosen.c.ord,
            (func.least(*allowed) if len(allowed) > 1 else allowed[0]).label("allowed"),
        )
        .cte("allowance")
        .prefix_with("MATERIALIZED")
    )
    # Each group's oldest due rows (at most `want`: a LIMIT may not vary per group),
    ranked = table.alias("ranked")
    oldest = (
        select(
            *(ranked.c[c.name] for c in pk),
            func.row_number().over(order_by=ranked.c.wake_at).label("rank"),
        )
        .where(
            ranked.c[limit.by] == allowance.c.grp,
            ranked.c.next_step.isnot(None),
            _served(ranked.c.next_step, steps),
            ranked.c.wake_at <= now,
        )
        .order_by(ranked.c.wake_at)
        .limit(want)
        .lateral("oldest")
    )
    # as many of them as the group is allowed, the longest-waiting group's first,
    picked = (
        select(*(oldest.c[c.name] for c in pk))
        .select_from(allowance.join(oldest, literal(True)))
        .where(oldest.c.rank <= allowance.c.allowed)
        .order_by(allowance.c.ord, oldest.c.rank)
        .limit(want)
    )
    # locked as every claim locks: still due, and not being claimed by anyone else.
    due = (
        select(*pk, table.c.wake_at, column.label("duly_group"))
        .where(
            tuple_(*pk).in_(picked),
            table.c.next_step.isnot(None),
            _served(table.c.next_step, steps),
            table.c.wake_at <= now,
        )
        .with_for_update(skip_locked=True)
        .cte("due")
    )
    claim = lease_update(info, due)
    if rated is None:
        return claim
    # What this claim spent leaves each bucket, refilled to now, in the same statement.
    spent = (
        select(func.count())
        .select_from(due)
        .where(due.c.duly_group == allowance.c.grp)
        .scalar_subquery()
    )
    level = insert(rated).from_select(
        ["workflow", "group_key", "tokens", "refilled_at"],
        select(
            literal(info.name),
            cast(allowance.c.grp, Text),
            _tokens(info, rated, allowance.c.grp, now) - spent,
            now,
        ),
    )
    level = level.on_conflict_do_update(
        index_elements=[rated.c.workflow, rated.c.group_key],
        set_={"tokens": level.excluded.tokens, "refilled_at": level.excluded.refilled_at},
    )
    return claim.add_cte(level.cte("spent"))
