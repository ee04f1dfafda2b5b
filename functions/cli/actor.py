"""Who acts from the command line, for the audit trail: the operating system's user.

The database login says nothing of a person; the user running the command does.
It is read from the process's user id (the password database), never from
$LOGNAME or $USER, which anyone sets to any name.
"""

from __future__ import annotations

import os

from engine import AuditActor

CLI = "cli"  # the audit's door


def cli_actor() -> AuditActor:
    """Who runs the command: the name of the process's user id (`cli` when it has none)."""
    return AuditActor(os_user() or CLI, CLI)


def os_user() -> str | None:
    """The name the password database gives the process's user id; None without one."""
    try:
        import pwd  # POSIX only

        return pwd.getpwuid(os.getuid()).pw_name or None
    except (ImportError, KeyError, OSError):
        return None
