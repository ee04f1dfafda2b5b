"""What the command-line front doors share: exit statuses, the app importable from here,
and the one notice that DULY_APP unset means duly's examples.

`duly` (functions/cli/) and what `duly dev` runs (functions/local/) exit with these.
"""

from __future__ import annotations

import os
import sys

from engine import settings as variables

USAGE_ERROR = 2  # exit status for bad settings or arguments, or a missing extra
FAILURE = 1  # exit status when the database cannot be reached or refuses
INTERRUPTED = 130  # exit status after Ctrl-C


def put_cwd_on_path() -> None:
    """Make DULY_APP importable from the current directory, as uvicorn and pytest do."""
    # The `duly` script's own directory is sys.path[0], not the directory it runs in.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def say_when_examples_serve() -> None:
    """With DULY_APP unset, say on stderr that duly's examples are the app, and how to name
    yours: every command says it in these words (`duly dev` as it starts serving)."""
    if variables.APP.text() is None:
        print(
            f"duly: DULY_APP is not set: using duly's examples ({variables.APP.default}); set "
            "DULY_APP to the module that maps your workflows (DULY_APP=myapp.workflows).",
            file=sys.stderr,
        )
