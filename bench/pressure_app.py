"""The pressure bench's workflow: one no-op step that records when it started, and how often.

Each run carries the phase it was offered in and when the producer offered it
(`time.time()`); its step stores `time.time()` as it begins and counts its
own commits, so pickup latency, lost runs and runs that ran twice are all
read from the table afterwards. The attempt log is mapped too: its `ok` rows
are the second count of commits, and its growth is part of the pressure.
"""

from __future__ import annotations

import time

from sqlalchemy import BigInteger, Float, Integer, String, Table, func, insert, literal, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql import Executable

from bench.harness import EMPTY_ARGS
from engine import Workflow, declare_engine_tables, step
from engine.base.notify import CHANNEL

TABLE = "pressure_probe"
ATTEMPTS_TABLE = "pressure_attempts"
WORKER_APPLICATION = "duly-pressure-worker"  # what pg_terminate_backend picks the workers by


class Base(DeclarativeBase):
    """The pressure bench's tables: the probes and the engine's attempt log."""


declare_engine_tables(Base, events=False, attempts=True, prefix="pressure_")


class Probe(Base, Workflow):
    """A no-op run that times its own pickup and counts its own commits."""

    __tablename__ = TABLE

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    phase: Mapped[str] = mapped_column(String(40))
    offered_at: Mapped[float] = mapped_column(Float)  # the producer's time.time() at its start
    started_at: Mapped[float | None] = mapped_column(Float, default=None)  # the step's, likewise
    ran: Mapped[int] = mapped_column(
        Integer, default=0, server_default="0"
    )  # commits of the step: exactly 1

    @step
    async def run(self) -> None:
        self.started_at = time.time()
        self.ran += 1


def offer_probes(phase: str, runs: int, offered_at: float) -> tuple[Executable, Executable]:
    """One INSERT … SELECT of `runs` probes due now, tagged `phase` and stamped `offered_at`
    (`time.time()`), and the NOTIFY that announces them: what start_many() costs the database,
    without building a row in Python."""
    table = Probe.__table__
    assert isinstance(table, Table)
    rows = select(
        literal(phase), literal(offered_at), literal("run"), literal(EMPTY_ARGS, JSONB), func.now()
    ).select_from(func.generate_series(1, runs))
    columns = ["phase", "offered_at", "next_step", "next_args", "wake_at"]
    return insert(table).from_select(columns, rows), select(func.pg_notify(CHANNEL, table.name))
