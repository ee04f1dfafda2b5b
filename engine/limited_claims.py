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

Which groups can start, and how that is found without reading every row,
is `engine.limit_groups`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    ARRAY,
    Integer,
    Row,
    Table,
    Text,
    bindparam,
    cast,
    func,
    literal,
    not_,
    select,
    tuple_,
    union_all,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from engine.claims import lease_update
from engine.clock import db_now
from engine.due import due, no_flush_wait
from engine.errors import ConfigurationError
from engine.limit_groups import (
    PREFIX_ROWS_PER_SLOT,
    all_groups,
    bucket_of,
    limit_of,
    oldest_groups,
    running_count,
    tokens_now,
    with_state,
)
from engine.registry import WorkflowInfo


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
        chosen = await conn.execute(choose_statement(info, steps, bucket), {"want": want})
        groups = chosen.scalars().all()
        if not groups:
            return []
        claimed = await conn.execute(
            limited_claim_statement(info, steps, bucket),
            {"groups": list(groups), "want": want, "lease": lease},
        )
        return list(claimed.all())


@lru_cache(maxsize=256)
def choose_statement(
    info: WorkflowInfo, steps: tuple[str, ...] | None, bucket: Table | None
) -> Executable:
    """Up to `want` groups that can start a step now, longest-waiting first, each locked.

    The groups of the oldest due rows are asked first; only when too few of
    them can start are all groups visited (a one-time filter: the skip scan
    does not run otherwise).
    """
    want = bindparam("want", type_=Integer)
    oldest, oldest_able = with_state(
        info,
        bucket,
        oldest_groups(info, steps, want * PREFIX_ROWS_PER_SLOT),
        f"oldest_{info.name}",
    )
    every, every_able = all_groups(info, steps, bucket)
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
    return select(chosen.c.grp).where(no_flush_wait(), locked).order_by(chosen.c.since)


@lru_cache(maxsize=256)
def limited_claim_statement(
    info: WorkflowInfo, steps: tuple[str, ...] | None, bucket: Table | None
) -> Executable:
    """Lease each locked group's oldest due rows, as many as its limit and bucket allow."""
    limit = limit_of(info)
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
        allowed.append(limit.at_most - running_count(info, chosen.c.grp, now))
    rated = bucket_of(info, bucket)
    if rated is not None:
        allowed.append(cast(func.floor(tokens_now(info, rated, chosen.c.grp, now)), Integer))
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
        .where(ranked.c[limit.by] == allowance.c.grp, due(ranked, steps, now))
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
    taken = (
        select(*pk, table.c.wake_at, column.label("duly_group"))
        .where(tuple_(*pk).in_(picked), due(table, steps, now))
        .with_for_update(skip_locked=True)
        .cte("due")
    )
    claim = lease_update(info, taken)
    if rated is None:
        return claim
    # What this claim spent leaves each bucket, refilled to now, in the same statement.
    spent = (
        select(func.count())
        .select_from(taken)
        .where(taken.c.duly_group == allowance.c.grp)
        .scalar_subquery()
    )
    level = insert(rated).from_select(
        ["workflow", "group_key", "tokens", "refilled_at"],
        select(
            literal(info.name),
            cast(allowance.c.grp, Text),
            tokens_now(info, rated, allowance.c.grp, now) - spent,
            now,
        ),
    )
    level = level.on_conflict_do_update(
        index_elements=[rated.c.workflow, rated.c.group_key],
        set_={"tokens": level.excluded.tokens, "refilled_at": level.excluded.refilled_at},
    )
    return claim.add_cte(level.cte("spent"))
