"""What the command-line front doors share: exit statuses, and the app importable from here.

`duly` (functions/cli/) and what `duly dev` runs (functions/local/) exit with these.
"""

from __future__ import annotations

import os
import sys

USAGE_ERROR = 2  # exit status for bad settings or arguments, or a missing extra
FAILURE = 1  # exit status when the database cannot be reached or refuses
INTERRUPTED = 130  # exit status after Ctrl-C


def put_cwd_on_path() -> None:
    """Make DULY_APP importable from the current directory, as uvicorn and pytest do."""
    # The `duly` script's own directory is sys.path[0], not the directory it runs in.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
