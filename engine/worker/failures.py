"""What a failed attempt keeps besides its error line: its traceback and its arguments.

Both are made only for a failed attempt, so a step that succeeds costs nothing more.
The traceback is `traceback.format_exception`'s text (never a frame's locals) with
every secret scrubbed, cut to TRACEBACK_LIMIT bytes: its head and its tail, where the
innermost frames and the exception line are, with a marked cut between them.
"""

from __future__ import annotations

import traceback
from typing import Any

from engine.base.scrubbing import scrub_secrets
from engine.base.shown import bounded_value

TRACEBACK_LIMIT = 8 * 1024  # bytes (UTF-8) of a failed attempt's traceback kept
TRACEBACK_HEAD = 2 * 1024  # bytes of those from its start; the rest are from its end
CUT = "\n[… {count} bytes cut …]\n"  # what stands where a long traceback was cut


def failure_traceback(exc: BaseException) -> str:
    """The exception's traceback as text, its secrets scrubbed, at most TRACEBACK_LIMIT bytes."""
    text = scrub_secrets("".join(traceback.format_exception(exc)))
    return bounded_text(text, TRACEBACK_LIMIT)


def bounded_text(text: str, limit: int) -> str:
    """`text` if it fits in `limit` UTF-8 bytes; else its head and tail around a marked cut."""
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    marker_room = len(CUT.format(count=len(encoded)).encode())
    head_size = min(TRACEBACK_HEAD, limit // 4)
    tail_size = limit - head_size - marker_room
    # A cut through a character drops its bytes rather than keep half of it.
    head = encoded[:head_size].decode(errors="ignore")
    tail = encoded[len(encoded) - tail_size :].decode(errors="ignore")
    cut = len(encoded) - len(head.encode()) - len(tail.encode())
    return head + CUT.format(count=cut) + tail


def failure_arguments(next_args: Any) -> Any:
    """The attempt's stored arguments as the log keeps them: nested at most as a read shows."""
    return None if next_args is None else bounded_value(next_args)
