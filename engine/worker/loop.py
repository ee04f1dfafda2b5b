"""The worker: passes that claim due rows, run their steps, and sleep until more is due.

A pass claims what is due, up to the free share of `max_concurrency`, from
each table in turn, and then, if it took less than it had room for, asks the
database when the next row comes due. The worker then sleeps until that instant, a NOTIFY, or a
step of its own finishing, whichever is first, and never longer than
`max_idle_interval`. Nothing polls on a short timer: `poll_interval` only
spaces out passes while something is due that this worker could not take.

A claimed row naming a step this code does not have (renamed, removed, or
only in the next release) is handed back unrun, and from then on the worker
claims that table by the step names it has (`engine.claims.stranded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
)

from engine.base.notify import EVERYONE
from engine.claims.claim import Claim, claim_due, served_steps
from engine.claims.floors import DueFloors
from engine.claims.group_memory import GroupMemory
from engine.claims.limited import claim_limited, needs_bucket
from engine.claims.next_due import NextDue, next_due
from engine.claims.stranded import StrandedWatch, stranded_after
from engine.model.connection import WorkflowConnection
from engine.model.registry import WorkflowInfo
from engine.model.rows import build_row, claimed_key
from engine.model.telemetry import rows_claimed
from engine.worker import heap
from engine.worker.committer import Committer
from engine.worker.execution import StepContext, execute
from engine.worker.floor_keeper import FloorKeeper
from engine.worker.held import HeldConnection
from engine.worker.idle import IdleContract
from engine.worker.leases import LeaseKeeper, hand_back_unrun
from engine.worker.listener import Listener
from engine.worker.options import (
    PassResult,
    WorkerOptions,
)

log = logging.getLogger("duly.worker")

FIRST_ERROR_DELAY = 0.1  # seconds before a pass is retried after a database error
MAX_ERROR_DELAY = 5.0  # seconds
WALL_CLOCK_CHECK = 5.0  # seconds between re-reading the wall clock during a long sleep
COMMITS_AHEAD = 4  # claims may run ahead of commits by this many times max_concurrency


class Worker:
    """Claims and runs the due steps of one connection's workflow tables."""

    def __init__(self, connection: WorkflowConnection, options: WorkerOptions) -> None:
        self.connection = connection
        self.options = options
        # The steps this worker takes, per table (None: all of them); a table it can run
        # nothing of is not served at all.
        self._served = {
            info.name: served_steps(info, options.lanes) for info in connection.workflows
        }
        self.tables = {
            info.name: info for info in connection.workflows if self._served[info.name] != ()
        }
        needs_bucket(list(self.tables.values()), connection.rate_bucket)
        self._buckets = connection.rate_bucket.__table__ if connection.rate_bucket else None
        # What each limited table's claims remember of its groups between visits of all.
        self._group_memories = {
            name: GroupMemory() for name, info in self.tables.items() if info.limit is not None
        }
        self._engine = connection.engine
        self._autocommit = connection.autocommit
        # The pass loop's claims and next-due questions, one after another on one connection.
        self._pass_connection = HeldConnection(self._autocommit)
        self._claims: dict[asyncio.Task[None], Claim] = {}  # every row held, committing or not
        self._leases = LeaseKeeper(self._autocommit, options.lease, self._claims)
        self._committer = Committer(
            self._autocommit, connection.attempt_log, options.lease, connection.engine
        )
        self._context = StepContext(
            committer=self._committer,
            lease=options.lease,
            may_continue=lambda lane: not self._stopping and lane in options.lanes,
            release_slot=self._release_slot,
            release_preempted=self._leases.release_preempted,
        )
        # The steps handed back unrun because this code lacks them, and when to look again.
        self._stranded = StrandedWatch(stranded_after())
        self._busy: set[asyncio.Task[None]] = set()  # steps whose body holds a slot
        self._due_again = False  # the last pass saw work due that it did not take
        self._wakeup = asyncio.Event()
        # Where each table's claims read the due index from, and the probe beneath.
        self._floors = DueFloors()
        self._floor_keeper = FloorKeeper(
            self._autocommit, self._floors, self._floored_tables, self._wakeup.set
        )
        self._exact = False  # run_until_idle: a pass that finds nothing must be sure
        self._stopping = False
        self._rotation = 0
        self._background: list[asyncio.Task[None]] = []
        self._loop_task: asyncio.Task[None] | None = None
        self.listener: Listener | None = None
        self.passes = 0
        self.steps_started = 0
        self.idle = IdleContract(options.on_idle)
        # The wall clock, read in short steps while sleeping: the loop's own clock stops
        # while a machine is suspended, the wall clock does not.
        self.wall_clock: Callable[[], float] = time.time
        self.wall_clock_check = WALL_CLOCK_CHECK

    # -- life cycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Start the pass loop, the lease keeper and (if listening) the listener."""
        heap.settle()
        if self.options.listen and self.tables:
            self.listener = Listener(
                self.options.listen_engine or self._engine,
                self.kick,
                self.options.max_idle_interval.total_seconds(),
            )
            self._background.append(asyncio.create_task(self.listener.run()))
        self._background.append(asyncio.create_task(self._leases.keep()))
        self._background.append(asyncio.create_task(self._floor_keeper.keep()))
        self._committer.start()
        self._loop_task = asyncio.create_task(self._serve())

    async def stop(self) -> None:
        """Stop claiming, give running steps shutdown_timeout, hand back the rest."""
        self._stopping = True
        self._wakeup.set()
        if self._loop_task is not None:
            await self._loop_task
        abandoned: list[Claim] = []
        running = set(self._claims)
        if running:
            timeout = self.options.shutdown_timeout.total_seconds()
            _, unfinished = await asyncio.wait(running, timeout=timeout)
            abandoned = [self._claims[task] for task in unfinished if task in self._claims]
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
        # What finished steps queued is written before their abandoned neighbours go back.
        await self._committer.stop()
        await self._pass_connection.close()
        await self._leases.hand_back(abandoned)
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    async def run_until_idle(self) -> int:
        """Make passes until one finds nothing due and no step is left running.

        Tests use it (through `engine.testing.drain`) to take one deterministic
        step of the world: no listener, no sleeping, no clock of its own; and
        `duly drain` routes the outbox with it. Running steps' leases are renewed.
        """
        heap.settle()
        self._committer.start()
        # Leases are kept here too: `duly drain` runs this way, and its routes may run long.
        keeper = asyncio.create_task(self._leases.keep())
        claimed_before = self.steps_started
        self._exact = True
        try:
            while True:
                free = self._free_slots()
                started = self.steps_started
                if free > 0:
                    await self._pass(free)
                if self._claims:
                    await asyncio.wait(set(self._claims), return_when=asyncio.FIRST_COMPLETED)
                elif self.steps_started == started:
                    break
                # A step claimed by this pass may have finished (and made its next step
                # due) while the pass went on to ask what is due next: look again.
        finally:
            self._exact = False
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            await self._committer.stop()
            await self._pass_connection.close()
        return self.steps_started - claimed_before

    async def wake(self, timeout: float) -> bool:
        """Look now; True once caught up and reported (see `engine.wake`)."""
        return await self.idle.wait_caught_up(self.passes, timeout, lambda: self.kick(EVERYONE))

    def kick(self, payload: str) -> None:
        """Wake the pass loop if `payload` names one of this worker's tables (or everyone)."""
        if payload == EVERYONE:
            self._floors.forget()  # news for all (clock moved, a reconnect): read from the start
        if payload == EVERYONE or payload in self.tables:
            self._wakeup.set()

    # -- the pass loop ------------------------------------------------------------

    async def _serve(self) -> None:
        error_delay = FIRST_ERROR_DELAY
        while not self._stopping:
            self._wakeup.clear()
            free = self._free_slots()
            try:
                result = await self._pass(free) if free > 0 else None
            except (SQLAlchemyError, OSError) as exc:
                log.warning("worker pass failed (%s); retrying in %.1f s", exc, error_delay)
                await self._sleep(error_delay)
                error_delay = min(error_delay * 2, MAX_ERROR_DELAY)
                continue
            error_delay = FIRST_ERROR_DELAY
            if result is not None and result.filled:
                continue
            wait = self._sleep_for(free, result)
            until_check = self._stranded.seconds_until_check()
            if result is not None and until_check is not None:
                wait = min(wait, until_check)  # a pass makes the stranded check when due
            if wait > 0 and not self._claims:
                # Nothing runs or commits: an idle worker keeps no connection checked out.
                await self._pass_connection.close()
                await self._committer.release()
            await self._sleep(wait)

    async def _pass(self, free: int) -> PassResult:
        """Claim up to `free` due rows, start their steps, and ask what is due next if idle."""
        self.passes += 1
        infos = self._rotated()
        upcoming: NextDue | None = None
        async with self._pass_connection.connect() as conn:
            claimed = await self._claim_shares(conn, infos, free)
            if not claimed and not self._claims and self._floors and self._answer_awaited():
                # Caught up, and told so: sure only when read from the due index's start.
                self._floors.forget()
                claimed = await self._claim_shares(conn, infos, free)
            # Start the steps first: asking when more is due can wait, they cannot.
            unrun: list[tuple[WorkflowInfo, Any]] = []
            for info, values in claimed:
                if info.resolve(values.next_step) is None:
                    unrun.append((info, values))  # a step this code does not have
                    continue
                claim = claim_of(info, values)
                task = asyncio.create_task(self._run(claim, build_row(info, values)))
                self._claims[task] = claim
                self._busy.add(task)
                self.steps_started += 1
            if unrun:
                await self._hand_back_unrun(conn, unrun)
            # Rows handed back were not this worker's work: they count as neither claimed
            # nor running, and the next-due question below no longer sees them.
            started = len(claimed) - len(unrun)
            # A step still running (or committing) as the question is asked may change the
            # answer after it: such a pass does not count as caught up, even if the step is
            # done by the time the answer comes back.
            running = bool(self._claims)
            if started < free:
                upcoming = await next_due(
                    conn,
                    infos,
                    [self._served[i.name] for i in infos],
                    self._buckets,
                    [self._floors.floor(i.name) for i in infos],
                    looking_again=not self._answer_awaited(),
                )
            if self._stranded.watching:
                await self._watch_stranded(conn, claimed, upcoming)
        if started < free:
            await self.idle.after_pass(
                self.passes,
                started,
                upcoming.at if upcoming is not None else None,
                running=running or bool(self._claims),
            )
        return PassResult(started, free, upcoming)

    async def _claim_shares(
        self, conn: AsyncConnection, infos: list[WorkflowInfo], free: int
    ) -> list[tuple[WorkflowInfo, Any]]:
        """Each table's share of `free` first, so a backlog in one cannot hold the whole
        worker; what a table leaves of its share goes round in turn."""
        claimed: list[tuple[WorkflowInfo, Any]] = []
        share = max(1, free // len(infos)) if infos else 0
        filled: list[WorkflowInfo] = []
        for info in infos:
            want = min(share, free - len(claimed))
            rows = await self._claim(conn, info, want)
            claimed.extend((info, row) for row in rows)
            if want > 0 and len(rows) == want:
                filled.append(info)
        for info in filled:
            rows = await self._claim(conn, info, free - len(claimed))
            claimed.extend((info, row) for row in rows)
        return claimed

    def _answer_awaited(self) -> bool:
        """Someone acts on this worker being caught up: run_until_idle, on_idle, wake()."""
        return self._exact or self.options.on_idle is not None or self.idle.waiting

    def _floored_tables(self) -> list[tuple[WorkflowInfo, tuple[str, ...] | None]]:
        """The tables whose claims read from a floor (those without a limit), and their steps."""
        return [
            (info, self._served[name]) for name, info in self.tables.items() if info.limit is None
        ]

    async def _hand_back_unrun(
        self, conn: AsyncConnection, unrun: list[tuple[WorkflowInfo, Any]]
    ) -> None:
        """Give back rows naming a step this code lacks, untouched, and claim by name from now.

        Claiming by the names it knows, the worker never takes those rows again
        and its next-due answer ignores them: no loop, and a worker that has the
        step (during a rolling deploy, the other release's) takes them.
        """
        for info, values in unrun:
            claim = claim_of(info, values)
            await hand_back_unrun(conn, claim)
            self._stranded.handed_back(
                info, values.next_step, values.duly_scheduled_at, values.duly_claimed_at
            )
            served = served_steps(info, self.options.lanes, listed=True)
            self._served[info.name] = served
            if not served:
                self.tables.pop(info.name, None)  # no step left: nothing here to claim

    async def _watch_stranded(
        self,
        conn: AsyncConnection,
        claimed: list[tuple[WorkflowInfo, Any]],
        upcoming: NextDue | None,
    ) -> None:
        """Read the database's time from this pass's answers; check for stranded runs if due."""
        if claimed:
            self._stranded.observe(claimed[-1][1].duly_claimed_at)
        elif upcoming is not None:
            self._stranded.observe(upcoming.at - timedelta(seconds=upcoming.seconds))
        if self._stranded.check_due():
            await self._stranded.check(conn)

    @property
    def served(self) -> dict[str, tuple[str, ...] | None]:
        """The step names this worker claims, per table (None: every step), as of now.

        A table's entry becomes an explicit list once the worker has handed back
        a row naming a step its code does not have.
        """
        return dict(self._served)

    async def _claim(self, conn: AsyncConnection, info: WorkflowInfo, want: int) -> list[Any]:
        """Claim up to `want` due rows of one table, of the steps this worker serves."""
        if want <= 0:
            return []
        steps = self._served[info.name]
        if info.limit is None:
            floor = self._floors.floor(info.name)
            rows = await claim_due(conn, info, want, self.options.lease, steps, floor)
            self._floors.after_claim(info.name, rows)
            if rows:
                self._floor_keeper.claimed()
        else:
            async with self._engine.connect() as claiming:
                memory = self._group_memories[info.name]
                rows = await claim_limited(
                    claiming, info, want, self.options.lease, steps, self._buckets, memory
                )
        rows_claimed(info.name, len(rows))
        return list(rows)

    def _free_slots(self) -> int:
        """Slots for new claims: bodies running count, and so, past a bound, do commits.

        A step gives its slot back when its body returns, before its commit; the
        bound keeps claims from running ahead of commits without limit.
        """
        concurrency = self.options.max_concurrency
        return min(concurrency - len(self._busy), COMMITS_AHEAD * concurrency - len(self._claims))

    def _release_slot(self) -> None:
        task = asyncio.current_task()
        if task in self._busy:
            self._busy.discard(task)
            self._wakeup.set()

    def _sleep_for(self, free: int, result: PassResult | None) -> float:
        idle = self.options.max_idle_interval.total_seconds()
        if free <= 0 or result is None:
            return idle  # every slot busy: a finishing step wakes us
        upcoming = result.upcoming
        if upcoming is None:
            self._due_again = False
            return idle
        if upcoming.seconds > 0:
            self._due_again = False
            # Work a limit holds back may be freed by another worker's step without a
            # word: look again every poll_interval.
            wait = min(upcoming.seconds, idle)
            return min(wait, self.options.poll_interval.total_seconds()) if upcoming.held else wait
        # Due now but not taken: it came due after the claim, or another transaction
        # holds it. Look again at once the first time, then every poll_interval.
        if self._due_again:
            return self.options.poll_interval.total_seconds()
        self._due_again = True
        return 0.0

    async def _sleep(self, seconds: float) -> None:
        """Wait `seconds` by the wall clock, or until kicked; a suspended machine wakes on time."""
        deadline = self.wall_clock() + seconds
        while not self._wakeup.is_set():
            remaining = deadline - self.wall_clock()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), min(remaining, self.wall_clock_check))

    def _rotated(self) -> list[Any]:
        infos = list(self.tables.values())
        if not infos:
            return infos
        self._rotation = (self._rotation + 1) % len(infos)
        return infos[self._rotation :] + infos[: self._rotation]

    # -- steps --------------------------------------------------------------------

    async def _run(self, claim: Claim, row: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            going_on: tuple[Claim, Any] | None = (claim, row)
            while going_on is not None:
                claim, row = going_on
                self._claims[task] = claim
                going_on = await execute(self._context, claim, row)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "%s[%s]: the engine failed around the step; its lease will end",
                claim.info.name,
                claim.key,
            )
        finally:
            self._claims.pop(task, None)
            self._busy.discard(task)
            self._wakeup.set()


def claim_of(info: WorkflowInfo, values: Any) -> Claim:
    """The Claim of a row a claim statement returned (its columns, then the claim's own)."""
    return Claim(
        info,
        claimed_key(info, values),
        values.wf_version,
        lease_end=values.claimed_until,
        scheduled_at=values.duly_scheduled_at,
        claimed_at=values.duly_claimed_at,
    )
