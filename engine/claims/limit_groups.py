"""Which groups of a limited workflow can start a step now, and when the next one can.

A group's state is its oldest due row (how long it has waited), how many
of its rows are leased (`at_most`) and its bucket refilled to now (`rate`).
Three ways find the groups worth asking about: the groups of the oldest due
rows (a prefix of the due index: every group seen there has waited longer
than every group not seen); groups named by the caller (those a worker
remembers, `engine.claims.group_memory`: one probe of the `(group, wake_at)` index
each); and every group with scheduled work (a skip scan of that index, one
probe per group). The first is cheap and, when enough of its groups can
start, exact; the second serves a claim the first cannot fill; the third is
the fallback, and what the second remembers.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ColumnElement,
    Double,
    Integer,
    Table,
    Text,
    and_,
    case,
    cast,
    func,
    literal,
    literal_column,
    null,
    select,
    true,
)

from engine.base.clock import db_now
from engine.model.due import due, scheduled
from engine.model.limits import Limit
from engine.model.registry import WorkflowInfo

PREFIX_ROWS_PER_SLOT = 32  # oldest due rows read, per row wanted, before visiting every group
PREFIX_ROWS = 256  # the same, when asking when work is next due


def written(number: int) -> ColumnElement[int]:
    """A whole number in the statement's text, not a parameter.

    A prepared statement is planned once for every execution (a generic plan)
    only when that plan looks no dearer than planning each time, and a LIMIT
    given as a parameter is costed as a tenth of the table: such statements
    were planned again on every claim.
    """
    return literal_column(str(int(number)), Integer)


def limit_of(info: WorkflowInfo) -> Limit:
    """The workflow's limit; only limited workflows come here."""
    assert info.limit is not None
    return info.limit


def running_count(info: WorkflowInfo, group: Any, now: Any) -> Any:
    """How many of `group` are leased now, by the index of leased rows."""
    leased = info.table.alias("leased")
    column = leased.c[limit_of(info).by]
    return (
        select(func.count())
        .select_from(leased)
        .where(column == group, leased.c.claimed_until > now)
        .scalar_subquery()
    )


def tokens_now(info: WorkflowInfo, bucket: Table, group: Any, now: Any) -> Any:
    """The group's bucket refilled to `now`: full when it has no row (or was truncated)."""
    limit = limit_of(info)
    full = literal(float(limit.rate or 0), Double)
    elapsed = func.greatest(cast(func.extract("epoch", now - bucket.c.refilled_at), Double), 0)
    refilled = bucket.c.tokens + elapsed * literal(limit.refill_per_second, Double)
    stored = (
        select(func.least(refilled, full))
        .where(bucket.c.workflow == info.name, bucket.c.group_key == cast(group, Text))
        .scalar_subquery()
    )
    return func.coalesce(stored, full)


def bucket_of(info: WorkflowInfo, bucket: Table | None) -> Table | None:
    """The bucket table when this workflow has a rate, else None."""
    return bucket if limit_of(info).rate is not None else None


def every_group(info: WorkflowInfo, steps: tuple[str, ...] | None) -> Any:
    """(grp, since) for every group with scheduled work; since is NULL when none is due.

    A skip scan of (group, wake_at): the first entry past the last group gives
    the next group and its earliest wake_at at once, one index probe a group.
    """
    limit = limit_of(info)
    table = info.table
    now = db_now()
    column = table.c[limit.by]
    groups = (
        select(column.label("grp"), table.c.wake_at.label("first_at"))
        .where(scheduled(table.c.next_step))
        .order_by(column, table.c.wake_at)
        .limit(written(1))
        .cte(f"groups_{table.name}", recursive=True)
    )
    later = table.alias(f"later_{table.name}")
    following = (
        select(later.c[limit.by].label("grp"), later.c.wake_at.label("first_at"))
        .where(scheduled(later.c.next_step), later.c[limit.by] > groups.c.grp)
        .order_by(later.c[limit.by], later.c.wake_at)
        .limit(written(1))
        .lateral("following")
    )
    groups = groups.union_all(
        select(following.c.grp, following.c.first_at).select_from(groups.join(following, true()))
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
            .where(waiting.c[limit.by] == groups.c.grp, due(waiting, steps, now))
            .scalar_subquery()
        )
    return select(groups.c.grp, since.label("since")).subquery(f"every_{table.name}")


def recalled_groups(info: WorkflowInfo, steps: tuple[str, ...] | None, window: Any) -> Any:
    """(grp, since) for each group of `window` (an array): one probe of (group, wake_at) each.

    The groups a worker remembers from its last visit of every group; since
    is NULL for one with no due work now.
    """
    limit = limit_of(info)
    table = info.table
    asked = func.unnest(window).table_valued("grp").render_derived("asked")
    waiting = table.alias("recalled")
    since = (
        select(func.min(waiting.c.wake_at))
        .where(waiting.c[limit.by] == asked.c.grp, due(waiting, steps))
        .scalar_subquery()
    )
    return select(asked.c.grp, since.label("since")).subquery(f"window_{table.name}")


def oldest_groups(info: WorkflowInfo, steps: tuple[str, ...] | None, rows: int) -> Any:
    """(grp, since) for the groups of the oldest `rows` due rows: a prefix of the due index.

    Every group seen has waited longer than every group not seen (whose oldest
    due row comes after the whole prefix), so when enough of them can start,
    they are the longest-waiting ones, found without visiting every group.
    """
    limit = limit_of(info)
    table = info.table
    prefix = (
        select(table.c[limit.by].label("grp"), table.c.wake_at)
        .where(due(table, steps))
        .order_by(table.c.wake_at)
        .limit(written(rows))
        .subquery("prefix")
    )
    return (
        select(prefix.c.grp, func.min(prefix.c.wake_at).label("since"))
        .group_by(prefix.c.grp)
        .subquery(f"oldest_{table.name}")
    )


def with_state(
    info: WorkflowInfo, bucket: Table | None, groups: Any, name: str
) -> tuple[Any, ColumnElement[bool]]:
    """`groups` (grp, since) with what their limit needs, as a CTE; and "can start now".

    Adds running (leased rows), when there is an `at_most`; tokens (the
    bucket refilled to now), when a rate.
    """
    limit = limit_of(info)
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
    rated = bucket_of(info, bucket)
    if rated is not None:
        columns.append(tokens_now(info, rated, groups.c.grp, now).label("tokens"))
    # Materialized, so each probe runs once per group rather than once per mention.
    candidates = select(*columns).select_from(joined).cte(name).prefix_with("MATERIALIZED")
    able: list[ColumnElement[bool]] = [candidates.c.since.isnot(None)]
    if limit.at_most is not None:
        able.append(candidates.c.running < written(limit.at_most))
    if rated is not None:
        able.append(candidates.c.tokens >= 1)
    return candidates, and_(*able)


def all_groups(
    info: WorkflowInfo, steps: tuple[str, ...] | None, bucket: Table | None
) -> tuple[Any, ColumnElement[bool]]:
    """Every group with scheduled work, with its limit's state (a CTE); and "can start now"."""
    return with_state(info, bucket, every_group(info, steps), f"candidates_{info.name}")


def ready_at(info: WorkflowInfo, steps: tuple[str, ...] | None, bucket: Table | None) -> Any:
    """When a group of this limited table can next start a step: a SQL expression.

    A group that can start now counts from its oldest due row; one short of
    a token, from when its bucket will hold one; one at its `at_most`, not at
    all, since it waits for a running step, whose lease's end is a wake_at of
    its own. NULL when no group has due work. When one of the oldest due
    rows' groups can start, the answer is its oldest row, and the other
    groups are not visited (COALESCE stops at its first answer).
    """
    oldest, oldest_able = with_state(
        info, bucket, oldest_groups(info, steps, PREFIX_ROWS), f"ready_oldest_{info.name}"
    )
    soonest_able = select(func.min(oldest.c.since)).where(oldest_able).scalar_subquery()
    candidates, _ = all_groups(info, steps, bucket)
    limit = limit_of(info)
    whens: list[tuple[ColumnElement[bool], Any]] = []
    if limit.at_most is not None:
        whens.append((candidates.c.running >= written(limit.at_most), null()))
    rated = bucket_of(info, bucket)
    if rated is not None:
        short = (1 - candidates.c.tokens) / literal(limit.refill_per_second, Double)
        wait = func.make_interval(0, 0, 0, 0, 0, 0, short)
        whens.append((candidates.c.tokens < 1, db_now() + wait))
    ready = case(*whens, else_=candidates.c.since) if whens else candidates.c.since
    soonest = select(func.min(ready)).where(candidates.c.since.isnot(None)).scalar_subquery()
    return func.coalesce(soonest_able, soonest)
