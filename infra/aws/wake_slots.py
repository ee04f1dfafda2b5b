"""How many wake invocations work at once: numbered slot leases in the database.

A wake works only while it holds one of `size` slots (rows of
`duly_wake_slots`), taken with one UPDATE ... RETURNING until its own deadline
and freed when done, or by expiry. One refused a slot rings every holder, and
a holder frees its slot only if nobody rang since it last looked, so no
wake-up is lost. Take, ring and release run in short transactions under one
transaction-level advisory lock (a pooler would break a session lock).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import (
    Column,
    DateTime,
    Float,
    Integer,
    MetaData,
    Table,
    Text,
    and_,
    bindparam,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import ColumnElement, Executable

TABLE = "duly_wake_slots"
LOCK_KEY = 0x4E1D7A2B9C35F011  # pg_advisory_xact_lock's key for the slot table (fixed, arbitrary)
SLOT_SLACK = 5.0  # seconds a slot outlives its holder's deadline (clock skew, a slow stop)

metadata = MetaData()
wake_slots = Table(
    TABLE,
    metadata,
    Column("slot", Integer, primary_key=True, autoincrement=False),
    Column("held_until", DateTime(timezone=True)),  # NULL: free
    Column("holder", Text),  # the holding invocation's id
    Column("rang_at", DateTime(timezone=True)),  # last time a wake was refused while held
)

_c = wake_slots.c


def _now() -> ColumnElement[datetime]:
    # The wall clock, not db_now(): a slot lasts as long as a Lambda invocation, which
    # the test clock (duly_clock) does not move.
    return func.clock_timestamp()


def _free() -> ColumnElement[bool]:
    return or_(_c.held_until.is_(None), _c.held_until < _now())


def _mine() -> ColumnElement[bool]:
    return and_(_c.slot == bindparam("b_slot"), _c.holder == bindparam("b_holder"))


def take_statement() -> Executable:
    """The lowest free or expired slot of 1..:size, held by :holder for :seconds; its number."""
    chosen = (
        select(_c.slot)
        .where(_c.slot.between(1, bindparam("b_size")), _free())
        .order_by(_c.slot)
        .limit(1)
        .scalar_subquery()
    )
    until = _now() + func.make_interval(0, 0, 0, 0, 0, 0, bindparam("b_seconds", type_=Float))
    return (
        update(wake_slots)
        .where(_c.slot == chosen)
        .values(held_until=until, holder=bindparam("b_holder"), rang_at=None)
        .returning(_c.slot)
    )


def ring_statement() -> Executable:
    """Tell every holder of 1..:size that a wake was refused now."""
    held = and_(_c.slot.between(1, bindparam("b_size")), _c.held_until >= _now())
    return update(wake_slots).where(held).values(rang_at=_now())


def release_statement() -> Executable:
    """Free :slot if :holder still has it and nobody rang since :since; whether it was freed.

    No row: the slot is not ours any more (it expired and was taken), nothing to free.
    """
    since = bindparam("b_since", type_=DateTime(timezone=True))
    keep = and_(since.is_not(None), _c.rang_at.is_not(None), _c.rang_at >= since)
    return (
        update(wake_slots)
        .where(_mine(), ~keep)
        .values(held_until=None, holder=None, rang_at=None)
        .returning(_c.slot)
    )


def fill_statement() -> Executable:
    """Rows 1..:size, free (existing rows stay as they are)."""
    numbers = select(func.generate_series(1, bindparam("b_size")).label("slot"))
    return insert(wake_slots).from_select(["slot"], numbers).on_conflict_do_nothing()


def free_count_statement() -> Executable:
    """How many of 1..:size are free or expired."""
    return select(func.count()).where(_c.slot.between(1, bindparam("b_size")), _free())


@dataclass
class WakeSlots:
    """The slot table of one database, `size` slots (the `max_wakes` setting)."""

    engine: AsyncEngine
    size: int
    _ready: bool = False

    async def ensure(self) -> None:
        """Create the table and its rows if missing: once per container, serialized.

        Migrations should create it (see `metadata`); this makes a fresh database work.
        """
        if self._ready:
            return
        async with self.engine.begin() as conn:
            await _lock(conn)
            await conn.run_sync(metadata.create_all, checkfirst=True)
            await conn.execute(fill_statement(), {"b_size": self.size})
        self._ready = True

    async def take(self, holder: str, seconds: float) -> int | None:
        """A slot for `seconds` (plus slack), or None after ringing its holders."""
        await self.ensure()
        params = {"b_size": self.size, "b_holder": holder, "b_seconds": seconds + SLOT_SLACK}
        async with self.engine.begin() as conn:
            await _lock(conn)
            slot = (await conn.execute(take_statement(), params)).scalar()
            if slot is None:
                await conn.execute(ring_statement(), {"b_size": self.size})
        return int(slot) if slot is not None else None

    async def now(self) -> datetime:
        """The database's wall clock, the one `rang_at` is written by."""
        async with self.engine.connect() as conn:
            now: datetime = (await conn.execute(select(_now()))).scalar_one()
        return now

    async def release(self, slot: int, holder: str, since: datetime | None = None) -> bool:
        """Free `slot`; False (still held) when a wake was refused at or after `since`."""
        params = {"b_slot": slot, "b_holder": holder, "b_since": since}
        async with self.engine.begin() as conn:
            await _lock(conn)
            freed = (await conn.execute(release_statement(), params)).first()
            if freed is None and since is not None:
                mine = select(_c.slot).where(_mine())
                if (await conn.execute(mine, params)).first() is not None:
                    return False  # rang: look again
        return True

    async def free(self) -> int:
        """How many slots are free now (a hint: a wake invoked on it may still be refused)."""
        async with self.engine.connect() as conn:
            count = (await conn.execute(free_count_statement(), {"b_size": self.size})).scalar()
        return int(count or 0)

    async def held(self) -> int:
        """How many slots are held now."""
        return self.size - await self.free()


async def _lock(conn: AsyncConnection) -> None:
    await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
