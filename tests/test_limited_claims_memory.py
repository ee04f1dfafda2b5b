"""A limited claim behind one group's backlog: what the worker remembers of the groups.

Rules tested, on `Lookup` (at most three running per customer):
- one customer's backlog owns the oldest due rows: the first claim visits
  every group, and the claims after it take the longest-waiting groups from
  memory, in exactly the order a visit would give, without visiting again;
- a remembered group found with nothing due is forgotten, and the claims go
  on to the next remembered groups;
- the claims from memory keep each group within `at_most`, and spend each
  group's bucket and no more;
- a group the memory does not know is passed over only until the memory
  expires; the visit then takes it first (the fairness the memory costs);
- the memory's window: the longest-waiting first, those at their limit
  probed without counting; a claim that fails forgets everything;
- a worker serves every customer behind one customer's backlog, within the
  limit, before that backlog is done.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Row, update
from sqlalchemy.exc import InvalidRequestError
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.claims.group_memory import OLDEST, RECALLED, VISITED, WINDOW_PER_SLOT, GroupMemory
from engine.claims.limited import claim_limited
from engine.model.registry import workflow_info
from engine.testing import drain
from tests.apps import limited
from tests.apps.limited import AT_MOST, Charge, Lookup, WorkflowRate
from tests.conftest import Database
from tests.helpers import is_burst

WANT = 8
LEASE = timedelta(minutes=5)
HOT_ROWS = 400  # more than the oldest rows a claim of WANT reads (32 a row wanted)
INFO = workflow_info(Lookup)
CHARGE = workflow_info(Charge)


def never_expires() -> float:
    """A clock that stands still: the memory stays fresh, so visits are only the needed ones."""
    return 0.0


async def filled_session(db: Database, customers: int, rows_each: int) -> Any:
    """`HOT_ROWS` due rows of 'hot', the oldest; then `customers` customers' rows, in turns.

    Customer i's n-th row is due at base + (n * customers + i) ms, so each
    customer's first row waited longer than any customer's second.
    """
    Session = await db.create(limited.Base.metadata)
    args = '\'{"args": [0], "kwargs": {}}\'::json'
    db.sql(
        f"INSERT INTO lookup (customer, next_step, next_args, wake_at) "
        f"SELECT 'hot', 'work', {args}, now() - interval '2 days' + i * interval '1 ms' "
        f"FROM generate_series(1, {HOT_ROWS}) AS i"
    )
    db.sql(
        f"INSERT INTO lookup (customer, next_step, next_args, wake_at) "
        f"SELECT 'c' || lpad((i % {customers})::text, 5, '0'), 'work', {args}, "
        f"now() - interval '1 day' + i * interval '1 ms' "
        f"FROM generate_series(0, {customers * rows_each - 1}) AS i"
    )
    db.sql("ANALYZE lookup")
    return Session


async def filled(db: Database, customers: int, rows_each: int) -> AsyncEngine:
    """The same, and the engine its session factory binds."""
    engine: AsyncEngine = (await filled_session(db, customers, rows_each)).kw["bind"]
    return engine


async def claim(engine: AsyncEngine, memory: GroupMemory | None) -> list[Row[Any]]:
    """One limited claim of WANT rows, as a worker makes it."""
    async with engine.connect() as conn:
        return await claim_limited(conn, INFO, WANT, LEASE, None, None, memory)


async def finish(engine: AsyncEngine, rows: list[Row[Any]]) -> None:
    """The claimed runs are done: nothing of theirs is due or running."""
    table = INFO.table
    async with engine.begin() as conn:
        await conn.execute(
            update(table)
            .where(table.c.id.in_([row.id for row in rows]))
            .values(next_step=None, claimed_until=None, wake_at=None)
        )


def exact_order(db: Database, count: int) -> list[str]:
    """The `count` longest-waiting customers that can start now: what a visit of all chooses."""
    rows = db.sql(
        f"""
        SELECT customer FROM lookup AS waiting
        WHERE next_step IS NOT NULL AND wake_at <= now()
            AND (SELECT count(*) FROM lookup AS leased
                 WHERE leased.customer = waiting.customer AND leased.claimed_until > now())
                < {AT_MOST}
        GROUP BY customer ORDER BY min(wake_at), customer LIMIT {count}
        """
    )
    return [str(row[0]) for row in rows]


def taken(rows: list[Row[Any]]) -> dict[str, int]:
    """How many rows of each customer a claim took."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.customer] = counts.get(row.customer, 0) + 1
    return counts


async def test_behind_one_backlog_the_claims_after_one_visit_take_the_exact_order_from_memory(
    db: Database,
) -> None:
    engine = await filled(db, customers=300, rows_each=4)
    memory = GroupMemory(clock=never_expires)
    for _ in range(30):
        first, second, third = exact_order(db, 3)
        rows = await claim(engine, memory)
        # 'hot' at its limit, then the two longest-waiting customers: three rows and two.
        assert taken(rows) == {first: AT_MOST, second: AT_MOST, third: WANT - 2 * AT_MOST}
        await finish(engine, rows)
    assert memory.visits == 1, "a claim the remembered groups could fill visited every group"


async def test_a_remembered_group_with_nothing_due_is_forgotten_and_the_next_ones_are_claimed(
    db: Database,
) -> None:
    customers = 200
    engine = await filled(db, customers=customers, rows_each=1)
    memory = GroupMemory(clock=never_expires)
    served: list[str] = []
    remembered = []
    while customers - len(served) >= WANT:  # enough groups left to fill a claim
        expected = exact_order(db, WANT)[1 : WANT - AT_MOST + 1]
        rows = await claim(engine, memory)
        assert taken(rows) == {"hot": AT_MOST} | dict.fromkeys(expected, 1)
        served += expected
        remembered.append(len(memory))
        await finish(engine, rows)
    assert served == [f"c{i:05d}" for i in range(len(served))]
    assert memory.visits == 1
    # Those found with nothing due left the memory.
    assert remembered[-1] < remembered[0] - customers // 2, remembered


async def test_claims_from_memory_keep_each_group_within_its_limit(db: Database) -> None:
    """The runs stay leased: each claim must count what the ones before it took."""
    engine = await filled(db, customers=40, rows_each=5)
    memory = GroupMemory(clock=never_expires)
    claimed = 0
    while rows := await claim(engine, memory):
        claimed += len(rows)
    leased = db.sql(
        "SELECT customer, count(*) FROM lookup WHERE claimed_until > now() GROUP BY customer"
    )
    assert {customer: count for customer, count in leased} == {
        "hot": AT_MOST,
        **{f"c{i:05d}": AT_MOST for i in range(40)},
    }
    assert claimed == 41 * AT_MOST


async def test_claims_from_memory_spend_each_groups_bucket_and_no_more(db: Database) -> None:
    """`Charge`: sixty starts a minute per provider, one provider's backlog ahead of all."""
    Session = await db.create(limited.Base.metadata)
    args = '\'{"args": [], "kwargs": {}}\'::json'
    db.sql(
        f"INSERT INTO charge (provider, charged, next_step, next_args, wake_at) "
        f"SELECT 'hot', 0, 'charge', {args}, now() - interval '2 days' + i * interval '1 ms' "
        f"FROM generate_series(1, {HOT_ROWS}) AS i"
    )
    db.sql(
        f"INSERT INTO charge (provider, charged, next_step, next_args, wake_at) "
        f"SELECT 'p' || lpad((i % 30)::text, 2, '0'), 0, 'charge', {args}, "
        f"now() - interval '1 day' + i * interval '1 ms' FROM generate_series(0, 89) AS i"
    )
    engine: AsyncEngine = Session.kw["bind"]
    bucket = WorkflowRate.__table__
    memory = GroupMemory(clock=never_expires)
    claims = 0
    while True:
        async with engine.connect() as conn:
            rows = await claim_limited(conn, CHARGE, WANT, LEASE, None, bucket, memory)
        if not rows:
            break
        claims += 1
        await finish_charges(engine, rows)
    started = dict(
        db.sql("SELECT provider, count(*) FROM charge WHERE next_step IS NULL GROUP BY provider")
    )
    # The burst, and what real time refilled while the claims ran (a token a second).
    assert is_burst(int(started.pop("hot")))
    assert started == {f"p{i:02d}": 3 for i in range(30)}
    assert memory.visits < claims // 2, (memory.visits, claims)


async def finish_charges(engine: AsyncEngine, rows: list[Row[Any]]) -> None:
    """The claimed charges are done."""
    table = CHARGE.table
    async with engine.begin() as conn:
        await conn.execute(
            update(table)
            .where(table.c.id.in_([row.id for row in rows]))
            .values(next_step=None, claimed_until=None, wake_at=None)
        )


async def test_a_group_the_memory_does_not_know_waits_only_until_the_memory_expires(
    db: Database,
) -> None:
    engine = await filled(db, customers=50, rows_each=4)
    now = [0.0]
    memory = GroupMemory(clock=lambda: now[0])
    await finish(engine, await claim(engine, memory))
    assert memory.visits == 1
    # Work of a customer nobody has seen, written as due before every remembered customer's.
    db.sql(
        "INSERT INTO lookup (customer, next_step, next_args, wake_at) "
        "SELECT 'late', 'work', '{\"args\": [0], \"kwargs\": {}}'::json, "
        "now() - interval '1 day' - interval '1 hour'"
    )
    assert exact_order(db, 2) == ["hot", "late"]
    rows = await claim(engine, memory)
    assert "late" not in taken(rows), "the claim from memory passed over the unknown customer"
    await finish(engine, rows)
    now[0] += 1000.0  # past any memory's expiry
    rows = await claim(engine, memory)
    assert memory.visits == 2
    assert taken(rows)["late"] == 1, "the visit after the memory expired takes it at once"


def seen_row(group: str, since: datetime, able: bool = True, recalled: bool = False) -> Any:
    """A row as the choose statement answers it, for the memory alone."""
    return _Seen(grp=group, since=since, able=able, recalled=recalled)


class _Seen:
    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def test_the_window_is_the_longest_waiting_groups_and_those_at_their_limit_do_not_count() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    memory = GroupMemory(clock=never_expires)
    assert memory.window(2) == [], "an empty memory: the claim visits every group"
    groups = [seen_row(f"g{i}", start + timedelta(seconds=i), able=i % 2 == 0) for i in range(100)]
    memory.learn(VISITED, groups, seconds=0.01)
    window = memory.window(2)
    # Two rows wanted: WINDOW_PER_SLOT * 2 groups that could start, and the busy ones between.
    assert window == [f"g{i}" for i in range(2 * 2 * WINDOW_PER_SLOT - 1)]
    # Probed: g0 now waits since later than every other; g1 has nothing due any more.
    probed = [
        seen_row(g, start + timedelta(seconds=500 if g == "g0" else int(g[1:])), recalled=True)
        for g in window
        if g != "g1"
    ]
    memory.learn(RECALLED, probed, seconds=0.0)
    assert len(memory) == 99
    assert memory.window(1)[:2] == ["g2", "g3"]
    # A claim that did not need the window gives it back as it was.
    memory.learn(OLDEST, [], seconds=0.0)
    assert memory.window(1)[:2] == ["g2", "g3"]
    memory.forget()
    assert len(memory) == 0 and memory.window(8) == []


def test_a_memory_expires_after_its_time_and_slow_visits_make_it_last_longer() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    now = [0.0]
    memory = GroupMemory(clock=lambda: now[0])
    memory.learn(VISITED, [seen_row("a", start)], seconds=0.01)
    now[0] = 0.9
    assert memory.window(1) == ["a"]
    now[0] = 1.1
    assert memory.window(1) == [], "a second after its visit, the memory is not used"
    memory.learn(VISITED, [seen_row("a", start)], seconds=0.5)  # a slow visit, at 1.1
    now[0] = 10.0
    assert memory.window(1) == ["a"], "visits may take at most a share of the time"


async def test_a_claim_that_fails_forgets_what_it_remembered(db: Database) -> None:
    engine = await filled(db, customers=20, rows_each=2)
    memory = GroupMemory(clock=never_expires)
    await claim(engine, memory)
    assert len(memory) > 0
    async with engine.connect() as conn:
        await conn.begin()  # a connection already in a transaction: the claim cannot begin
        with pytest.raises(InvalidRequestError):
            await claim_limited(conn, INFO, WANT, LEASE, None, None, memory)
    assert len(memory) == 0


async def test_a_worker_serves_every_customer_behind_one_backlog_within_the_limit(
    db: Database,
) -> None:
    customers = 60
    Session = await filled_session(db, customers=customers, rows_each=1)
    assert await drain(Session, [Lookup]) == HOT_ROWS + customers
    order = [str(row[0]) for row in db.sql("SELECT customer FROM lookup ORDER BY started, id")]
    # While 'hot' runs three at a time, the others take the rest of each pass.
    hot_before_last_customer = order[: order.index(f"c{customers - 1:05d}")].count("hot")
    assert hot_before_last_customer <= HOT_ROWS // 2, hot_before_last_customer
