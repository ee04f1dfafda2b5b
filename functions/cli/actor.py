"""Who acts from the command line, for the audit trail: the operating system's user.

The database login says nothing of a person; the user running the command does.
"""

from __future__ import annotations

import getpass

from engine.bulk import Actor

CLI = "cli"  # the audit's door


def cli_actor() -> Actor:
    """Who runs the command: the operating system's user name."""
    try:
        return Actor(getpass.getuser(), CLI)
    except (OSError, KeyError):  # no user name in this environment
        return Actor(CLI, CLI)
