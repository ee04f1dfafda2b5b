"""Progress of the long commands (`bulk`, `prune --apply`, `replay-dead-letters`) with rich.

A bar on stderr when it is a terminal; nothing at all otherwise (tests, CI, a pipe), so
what a script reads is the command's report on stdout alone.
"""

from __future__ import annotations

from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)


class BatchBar:
    """Rows done (and skipped) of a total, or counted up when the total is unknown."""

    def __init__(self, stream: TextIO, description: str, total: int | None = None) -> None:
        self.shown = stream.isatty()
        columns = [TextColumn("{task.description}"), BarColumn()]
        if total is not None:
            columns.append(MofNCompleteColumn())
        columns += [TextColumn("{task.fields[note]}"), TimeElapsedColumn()]
        self._progress = Progress(
            *columns, console=Console(file=stream), disable=not self.shown, transient=False
        )
        self._task = self._progress.add_task(description, total=total, note="")

    def __enter__(self) -> BatchBar:
        self._progress.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def update(self, done: int, skipped: int = 0, note: str = "") -> None:
        """Show `done` rows (and `skipped`, part of the way through the total) so far."""
        said = note or (f"{skipped} skipped" if skipped else "")
        self._progress.update(self._task, completed=done + skipped, note=said)
