"""Lease upkeep: the leases of the rows a worker holds, renewed, handed back or released.

A claim leases its rows for `lease`; a worker keeps the lease of every step
still running by renewing it at a third of its length, hands back the rows
of steps it abandons at shutdown (due again at once, announced), and gives
up the lease that `run()` left a preempted step, so the new step starts as
soon as the old one's commit was fenced, not when its lease ends. A row
naming a step this code does not have is handed back unrun, as it was before
the claim (due since the same instant, its attempts and error untouched), so
its age still tells how long no worker has taken it. Each is a single-row
statement, fenced like every write to a claimed row.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from datetime import timedelta

from sqlalchemy import DateTime, literal, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Executable

from engine.base.clock import db_now
from engine.base.notify import announcement
from engine.claims.claim import Claim
from engine.model.due import scheduled
from engine.model.rows import key_clause

log = logging.getLogger("duly.worker")

RENEWALS_PER_LEASE = 3  # a lease is renewed when a third of it has passed


class LeaseKeeper:
    """Keeps the leases of a worker's claims: `held` is the worker's own map of them."""

    def __init__(
        self, engine: AsyncEngine, lease: timedelta, held: Mapping[asyncio.Task[None], Claim]
    ) -> None:
        self._engine = engine  # autocommit: each statement its own transaction
        self._lease = lease
        self._held = held

    async def keep(self) -> None:
        """Renew the lease of every running step, a third of a lease apart, until cancelled."""
        interval = self._lease.total_seconds() / RENEWALS_PER_LEASE
        while True:
            await asyncio.sleep(interval)
            for task, claim in list(self._held.items()):
                try:
                    async with self._engine.connect() as conn:
                        kept = await renew(conn, claim, self._lease)
                except SQLAlchemyError as exc:
                    log.warning("could not renew a lease (%s); retrying next round", exc)
                    break
                if not kept and self._held.get(task) is claim:
                    # Not our own commit moving the version on: another worker or run().
                    log.warning("lost the lease of %s[%s]", claim.info.name, claim.key)

    async def release_preempted(self, claim: Claim) -> None:
        """Give up the lease of a step whose commit was fenced (see `release_preempted`)."""
        try:
            async with self._engine.connect() as conn:
                await release_preempted(conn, claim)
        except SQLAlchemyError as exc:
            log.warning(
                "could not release %s[%s] (%s); its lease will end", claim.info.name, claim.key, exc
            )

    async def hand_back(self, claims: Iterable[Claim]) -> None:
        """Make the rows of abandoned steps due again at once, for any worker."""
        for claim in claims:
            try:
                async with self._engine.connect() as conn:
                    await hand_back(conn, claim)
            except SQLAlchemyError:
                log.exception("could not hand back %s[%s]", claim.info.name, claim.key)


async def hand_back(conn: AsyncConnection, claim: Claim) -> bool:
    """Release a lease so any worker may take the row at once, and say so."""
    return (await conn.execute(hand_back_statement(claim))).first() is not None


async def hand_back_unrun(conn: AsyncConnection, claim: Claim) -> bool:
    """Give back a row whose step this worker does not have, as it was before the claim.

    False when `run()` or `cancel()` moved the row on meanwhile: then the lease
    `run()` left in place is released, so the step it set starts now.
    """
    if (await conn.execute(hand_back_unrun_statement(claim))).first() is not None:
        return True
    await release_preempted(conn, claim)
    return False


async def renew(conn: AsyncConnection, claim: Claim, lease: timedelta) -> bool:
    """Extend a lease, keeping the version; False when the row moved on without us."""
    renewed = (await conn.execute(renew_statement(claim, lease))).first()
    if renewed is None:
        return False
    claim.lease_end = renewed.claimed_until
    return True


async def release_preempted(conn: AsyncConnection, claim: Claim) -> bool:
    """After a fenced commit, give up the lease `run()` left in place, so its step starts now.

    `run()` moves the version on but leaves a running step its lease; the
    lease is still ours if `claimed_until` is the value we last wrote. A row
    another worker took over, or that `cancel()` ended, is left alone.
    """
    if claim.lease_end is None:
        return False
    return (await conn.execute(release_statement(claim))).first() is not None


def hand_back_statement(claim: Claim) -> Executable:
    """Due again now for any worker, if still at the claimed version; announced."""
    table = claim.info.table
    moved = (
        update(table)
        .where(key_clause(claim.info, claim.key), table.c.wf_version == claim.version)
        .values(claimed_until=None, wake_at=db_now(), wf_version=claim.version + 1)
        .returning(table.c.wf_version)
        .cte("moved")
    )
    return select(announcement(table.name)).select_from(moved)


def hand_back_unrun_statement(claim: Claim) -> Executable:
    """Not leased, due at the instant it was due before the claim, if still at the claimed
    version; announced, for the workers that have its step. Attempts and error stay."""
    table = claim.info.table
    # The claim's RETURNING read the row's wake_at before it moved it to the lease's end.
    was_due = (
        db_now() if claim.scheduled_at is None else literal(claim.scheduled_at, DateTime(True))
    )
    moved = (
        update(table)
        .where(key_clause(claim.info, claim.key), table.c.wf_version == claim.version)
        .values(claimed_until=None, wake_at=was_due)
        .returning(table.c.wf_version)
        .cte("moved")
    )
    return select(announcement(table.name)).select_from(moved)


def renew_statement(claim: Claim, lease: timedelta) -> Executable:
    """The lease (and the due time it sets) moved to `lease` from now, if still ours."""
    table = claim.info.table
    lease_end = db_now() + literal(lease)
    return (
        update(table)
        .where(key_clause(claim.info, claim.key), table.c.wf_version == claim.version)
        .values(claimed_until=lease_end, wake_at=lease_end)
        .returning(table.c.claimed_until)
    )


def release_statement(claim: Claim) -> Executable:
    """A preempted step's lease given up, if it is still the one we wrote; announced."""
    table = claim.info.table
    moved = (
        update(table)
        .where(
            key_clause(claim.info, claim.key),
            table.c.claimed_until == claim.lease_end,
            scheduled(table.c.next_step),
        )
        .values(claimed_until=None, wake_at=db_now())
        .returning(table.c.wf_version)
        .cte("moved")
    )
    return select(announcement(table.name)).select_from(moved)
