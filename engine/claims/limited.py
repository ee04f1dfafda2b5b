"""Claiming a limited workflow: a group at a time, longest-waiting group first.

One short transaction of two statements. The first chooses the groups that can start
now (`engine.claims.limit_groups`, helped by the caller's `engine.claims.group_memory`)
and takes each one's advisory lock with `pg_try_advisory_xact_lock`, passing over a group
another worker is claiming, so no claim waits. The second, with a snapshot taken after the
locks, leases each locked group's oldest due rows as its limit and bucket allow, and
spends its tokens.
"""

from __future__ import annotations

import time
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
    any_,
    bindparam,
    case,
    cast,
    false,
    func,
    literal,
    not_,
    select,
    true,
    tuple_,
    union_all,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from engine.base.clock import db_now
from engine.base.errors import ConfigurationError
from engine.claims.claim import lease_update
from engine.claims.group_memory import OLDEST, RECALLED, REMEMBERED_GROUPS, VISITED, GroupMemory
from engine.claims.limit_groups import (
    PREFIX_ROWS_PER_SLOT,
    all_groups,
    bucket_of,
    limit_of,
    oldest_groups,
    recalled_groups,
    running_count,
    tokens_now,
    with_state,
    written,
)
from engine.model.due import due, no_flush_wait
from engine.model.registry import WorkflowInfo


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
    memory: GroupMemory | None = None,
) -> list[Row[Any]]:
    """Lease up to `want` due rows of a limited table, each group within its limit.

    `conn` must not be in autocommit mode: the group locks last for the
    claim's own transaction, which this opens and commits. `memory` is the
    caller's of this table and steps (a worker keeps one per table): without
    it, a claim the oldest rows' groups cannot fill visits every group.
    """
    if want <= 0:
        return []
    window = memory.window(want) if memory is not None else []
    try:
        async with conn.begin():
            began = time.monotonic()
            chosen = await conn.execute(
                choose_statement(info, steps, bucket, slots_for(want)),
                {"want": want, "window": window},
            )
            seen = chosen.all()
            if memory is not None:
                tier = seen[0].tier if seen else VISITED
                memory.learn(tier, seen, time.monotonic() - began)
            groups = [row.grp for row in seen if row.locked]
            if not groups:
                return []
            claimed = await conn.execute(
                limited_claim_statement(info, steps, bucket),
                {"groups": groups, "want": want, "lease": lease},
            )
            return list(claimed.all())
    except BaseException:
        if memory is not None:
            memory.forget()  # what it handed out is lost: start again from a visit
        raise


def slots_for(want: int) -> int:
    """The power of two at least `want`: one choose statement serves claims of up to as many."""
    return 1 << max(0, want - 1).bit_length()


@lru_cache(maxsize=256)
def choose_statement(
    info: WorkflowInfo, steps: tuple[str, ...] | None, bucket: Table | None, slots: int = 8
) -> Executable:
    """Up to `want` groups that can start a step now, longest-waiting first, each locked.

    Three ways find them, each tried only when the one before cannot fill the
    claim (`tier`, computed once): the groups of the oldest due rows; those
    and the remembered groups of `window`, each probed; every group. Besides
    the chosen groups (`locked` tells which were locked), it answers what the
    worker's memory keeps: each group of the window that has due work, or,
    after a visit of every group, the `REMEMBERED_GROUPS` longest-waiting.
    `slots` sizes the oldest rows read: a claim of `want` rows uses the
    statement of `slots_for(want)`.
    """
    limit = limit_of(info)
    column = info.table.c[limit.by]
    want = bindparam("want", type_=Integer)
    # Read through a subquery, so the plan does not depend on how many groups the window
    # holds: a plan costed for an empty window would be planned again on every claim.
    groups = ARRAY(column.type)
    window = cast(select(bindparam("window", type_=groups)).scalar_subquery(), groups)
    oldest, oldest_able = with_state(
        info,
        bucket,
        oldest_groups(info, steps, slots * PREFIX_ROWS_PER_SLOT),
        f"oldest_{info.name}",
    )
    recalled, recalled_able = with_state(
        info, bucket, recalled_groups(info, steps, window), f"recalled_{info.name}"
    )
    every, every_able = all_groups(info, steps, bucket)
    # A group of the oldest rows that is also in the window counts once, as remembered.
    unremembered = not_(oldest.c.grp == any_(window))

    def able_count(source: Any, *where: Any) -> Any:
        return select(func.count()).select_from(source).where(*where).scalar_subquery()

    # CASE stops at its first true branch: the window is probed only when the oldest
    # rows' groups are too few, and every group is visited only when both are.
    tier = (
        select(
            case(
                (able_count(oldest, oldest_able) >= want, literal(OLDEST)),
                (
                    able_count(oldest, oldest_able, unremembered)
                    + able_count(recalled, recalled_able)
                    >= want,
                    literal(RECALLED),
                ),
                else_=literal(VISITED),
            ).label("tier")
        )
        .cte(f"tier_{info.name}")
        .prefix_with("MATERIALIZED")
    )
    tier_is = select(tier.c.tier).scalar_subquery()

    def branch(source: Any, able: Any, recalled: bool, *where: Any) -> Any:
        marked = (true() if recalled else false()).label("recalled")
        return select(source.c.grp, source.c.since, able.label("able"), marked).where(*where)

    pool = union_all(
        branch(oldest, true(), False, oldest_able, tier_is == OLDEST),
        branch(oldest, true(), False, oldest_able, unremembered, tier_is == RECALLED),
        branch(recalled, recalled_able, True, recalled.c.since.isnot(None), tier_is == RECALLED),
        branch(every, every_able, False, every.c.since.isnot(None), tier_is == VISITED),
    ).subquery("pool")
    order = (pool.c.since, pool.c.grp)
    ranked = select(
        pool,
        func.count().filter(pool.c.able).over(order_by=order).label("able_rank"),
        func.row_number().over(order_by=order).label("rank"),
    ).subquery("ranked")
    chosen = ranked.c.able & (ranked.c.able_rank <= want)
    # Locked only once chosen, and only those: a filter ahead of the lock keeps it off
    # the rows returned for the memory alone.
    locked = case(
        (
            chosen,
            func.pg_try_advisory_xact_lock(
                func.hashtext(literal(info.table.fullname)),
                func.hashtext(cast(ranked.c.grp, Text)),
            ),
        ),
        else_=false(),
    )
    remembered = ranked.c.recalled | (
        (tier_is == VISITED) & (ranked.c.rank <= written(REMEMBERED_GROUPS))
    )
    return (
        select(
            ranked.c.grp,
            ranked.c.since,
            ranked.c.able,
            ranked.c.recalled,
            tier_is.label("tier"),
            locked.label("locked"),
        )
        .where(no_flush_wait(), chosen | remembered)
        .order_by(ranked.c.rank)
    )


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
        .select_from(allowance.join(oldest, true()))
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
