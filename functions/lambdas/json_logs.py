"""JSON log lines on Lambda: one object a line, with the invocation's request id.

`JsonFormatter` writes the time, level, logger and message, the request id of the
invocation running (`invocation_started`), the workflow and run key when the line was
written from a step's body (`telemetry.current_run`), and a traceback when there is one.
`use_json_logs()` gives the root logger's handlers (the Lambda runtime's) this format;
`restore_logs()` undoes it. Why the standard library: docs/architecture.md.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from engine import current_run

# The invocation a container runs now: Lambda gives a container one at a time.
_request_id: list[str | None] = [None]
_replaced: list[tuple[logging.Handler, logging.Formatter | None]] = []
_added: list[logging.Handler] = []


def invocation_started(request_id: str | None) -> None:
    """Say which invocation the lines written from now on belong to."""
    _request_id[0] = request_id


class JsonFormatter(logging.Formatter):
    """A log record as one JSON object, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": _request_id[0],
        }
        run = current_run()
        if run is not None:
            line["workflow"], line["run_key"] = run
        for name in ("workflow", "run_key"):  # given as `extra=` by the line's own call
            given = record.__dict__.get(name)
            if given is not None:
                line[name] = given
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def use_json_logs() -> None:
    """Format every line of the root logger's handlers as JSON (a stdout handler if none)."""
    if _replaced or _added:
        return
    root = logging.getLogger()
    formatter = JsonFormatter()
    if not root.handlers:
        added = logging.StreamHandler(sys.stdout)
        root.addHandler(added)
        _added.append(added)
    for handler in root.handlers:
        _replaced.append((handler, handler.formatter))
        handler.setFormatter(formatter)


def restore_logs() -> None:
    """Give the handlers their formats back and remove a handler added (tests)."""
    root = logging.getLogger()
    for handler, formatter in _replaced:
        handler.setFormatter(formatter)
    for handler in _added:
        root.removeHandler(handler)
    _replaced.clear()
    _added.clear()
    _request_id[0] = None
