"""Workflows the multi-process tests run in worker subprocesses.

Steps report what they do through files under DULY_TEST_MARKS, so a test can
see a step start in another process and count how often it ran.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from sqlalchemy import Float, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, declare_engine_tables, step
from engine.base.settings import TEST_MARKS

SLOW_STEP_SECONDS = 60.0  # long enough that only a kill or a lease ends it


class Base(DeclarativeBase):
    """The process tests' own base."""


def marks_folder() -> Path:
    """The folder the test gave in DULY_TEST_MARKS."""
    folder = TEST_MARKS.read()
    assert folder is not None, "the test sets DULY_TEST_MARKS"
    return Path(folder)


def mark(name: str) -> None:
    """Append a line to the marks file `name`: one line per time a step got there."""
    folder = marks_folder()
    with open(folder / name, "a") as handle:
        handle.write(f"{os.getpid()} {time.time()}\n")


def marks(folder: Path, name: str) -> list[str]:
    """The lines `mark(name)` wrote so far."""
    path = folder / name
    return path.read_text().splitlines() if path.exists() else []


class Chain(Base, Workflow):
    __tablename__ = "chain3"

    id: Mapped[int] = mapped_column(primary_key=True)
    done: Mapped[str] = mapped_column(String, default="")

    @step
    async def first(self) -> object:
        self.done += "a"
        return Chain.second

    @step
    async def second(self) -> object:
        self.done += "b"
        return Chain.third

    @step
    async def third(self) -> None:
        self.done += "c"


class Slow(Base, Workflow):
    """Its first attempt hangs (until killed); any later attempt finishes at once."""

    __tablename__ = "slow"

    id: Mapped[int] = mapped_column(primary_key=True)
    finished_by: Mapped[int | None] = mapped_column(default=None)

    @step
    async def work(self) -> None:
        first = not os.path.exists(marks_folder() / f"slow-{self.id}")
        mark(f"slow-{self.id}")
        if first:
            await asyncio.sleep(SLOW_STEP_SECONDS)
        self.finished_by = os.getpid()


class Timed(Base, Workflow):
    """Records when its step ran, by the machine's wall clock."""

    __tablename__ = "timed"

    id: Mapped[int] = mapped_column(primary_key=True)
    ran_at: Mapped[float | None] = mapped_column(Float, default=None)

    @step
    async def run(self) -> None:
        self.ran_at = time.time()


ChainAttempt = declare_engine_tables(
    Base, events=False, names={"attempt_log": "workflow_attempt"}
).attempt_log
