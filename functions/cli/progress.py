"""Progress of the long commands (`bulk`, `prune --apply`, `replay-dead-letters`) with tqdm.

A bar on stderr when it is a terminal; nothing at all otherwise (tests, CI, a pipe), so
what a script reads is the command's report on stdout alone.
"""

from __future__ import annotations

import os
import shutil
from types import TracebackType
from typing import TextIO

from tqdm import tqdm

FALLBACK_SIZE = os.terminal_size((80, 24))  # columns, lines of a terminal with no size


class BatchBar:
    """Rows done (and skipped) of a total, or counted up when the total is unknown."""

    def __init__(self, stream: TextIO, description: str, total: int | None = None) -> None:
        self.shown = stream.isatty()
        size = shutil.get_terminal_size(FALLBACK_SIZE)
        self._bar = tqdm(
            total=total,
            desc=description,
            unit=" rows",
            file=stream,
            disable=not self.shown,
            # The terminal's size as COLUMNS and LINES or the terminal says, else 80 x 24: on
            # a terminal that reports no size (0 x 0) tqdm would draw nothing.
            ncols=size.columns or FALLBACK_SIZE.columns,
            nrows=size.lines or FALLBACK_SIZE.lines,
            leave=True,
        )

    def __enter__(self) -> BatchBar:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._bar.close()

    def update(self, done: int, skipped: int = 0, note: str = "") -> None:
        """Show `done` rows (and `skipped`, part of the way through the total) so far."""
        said = note or (f"{skipped} skipped" if skipped else "")
        self._bar.n = done + skipped
        self._bar.set_postfix_str(said, refresh=False)
        self._bar.refresh()
