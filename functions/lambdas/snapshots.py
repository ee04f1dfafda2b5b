"""Lambda SnapStart's runtime hooks: no connection in a snapshot, no shared random state after it.

With SnapStart on, Lambda snapshots a published version's container once its init is
done, and starts new containers from that snapshot. `before_snapshot` closes what must not
be in it: the runtime's engine is disposed (every pooled connection closed), its container,
loop and boto3 clients dropped, all made afresh by the first invocation after a restore.
`after_restore` gives `random` a fresh state from `os.urandom` (and so `uuid1` a fresh clock
sequence): every container restored from one snapshot would otherwise share the one it held.
What a first invocation would import on demand (boto3; FastAPI, mangum and the app for the
http entry) is imported before the snapshot instead: imports only, nothing connects.
`register` hands both to snapshot-restore-py, part of Lambda's Python runtimes; where it is
not installed it registers nothing. Why: docs/architecture.md, "On AWS Lambda".
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random

from functions.lambdas.runtime import existing

HOOKS_MODULE = "snapshot_restore_py"
HANDLER_VARIABLE = "_HANDLER"  # Lambda's: the function's handler, as the template names it
HTTP_HANDLER = "functions.lambdas.handlers.http"
PRIMED = ("boto3", "botocore.config")  # every function's clients (the secret, the scheduler)
PRIMED_HTTP = ("mangum", "functions.app")  # what the http entry's first event imports


def before_snapshot() -> None:
    """Import what a first invocation would, then close every connection the container holds:
    the engine's pool, the AWS clients'."""
    prime()
    release()


def prime() -> list[str]:
    """Import the modules a first invocation of this function imports on demand (those that
    are installed); their names."""
    http = os.environ.get(HANDLER_VARIABLE) == HTTP_HANDLER
    imported = []
    for name in (*PRIMED, *(PRIMED_HTTP if http else ())):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
            imported.append(name)
    return imported


def after_restore() -> None:
    """Give this container what it must not share with the others restored from its snapshot:
    `random`'s state, drawn afresh. Anything still held is dropped as before a snapshot (a
    no-op after `before_snapshot`)."""
    random.setstate(random.Random().getstate())  # a new Random() reads os.urandom
    release()


def release() -> None:
    """Dispose of the runtime's engine, drop its container, loop and clients, if it has any."""
    rt = existing()
    if rt is not None:
        rt.close()


def register() -> bool:
    """Register the hooks with snapshot-restore-py when it imports; whether they were."""
    try:
        hooks = importlib.import_module(HOOKS_MODULE)
    except ImportError:
        return False
    hooks.register_before_snapshot(before_snapshot)
    hooks.register_after_restore(after_restore)
    return True
