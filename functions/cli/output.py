"""What the commands print with: aligned columns, refusals, and progress on a terminal."""

from __future__ import annotations

import sys
from typing import TextIO

from engine import DulyError, NotFoundError
from functions.command_line import FAILURE, USAGE_ERROR

TTY_TICK = 0.25  # seconds between redraws of drain's progress bar
PLAIN_TICK = 5.0  # seconds between drain's progress lines when not on a terminal
BAR_WIDTH = 30  # characters of the progress bar


def aligned(lines: list[list[str]], right: set[int]) -> str:
    """Rows of cells as columns, the `right` ones right-aligned."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                  for i, (cell, w) in enumerate(zip(line, widths, strict=True))).rstrip()
        for line in lines
    )  # fmt: skip


def refused(exc: DulyError) -> int:
    """Say why a read was refused; exit 1 for what does not exist, 2 for a bad argument."""
    print(f"duly: {exc}", file=sys.stderr)
    return FAILURE if isinstance(exc, NotFoundError) else USAGE_ERROR


class ProgressBar:
    """Events routed out of those due: a bar redrawn in place on a terminal, lines otherwise."""

    def __init__(self, stream: TextIO, total: int, *, tty: bool) -> None:
        self.stream = stream
        self.total = total
        self.tty = tty
        self._last: int | None = None

    def show(self, done: int) -> None:
        """Draw `done` of the total (a line only when it changed, off a terminal)."""
        if self.tty:
            filled = BAR_WIDTH if not self.total else BAR_WIDTH * done // self.total
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            self.stream.write(f"\rrouting [{bar}] {done}/{self.total}")
        elif done != self._last:
            self.stream.write(f"duly drain: {done} of {self.total} events routed\n")
        self._last = done
        self.stream.flush()

    def finish(self, done: int) -> None:
        """The last state, and the end of the bar's line."""
        self.show(done)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
