"""Drives a `sam build` bundle as Lambda's Python runtime would, in a clean interpreter.

Run as `python3.12 -I -S tests/bundle_driver.py BUNDLE RUNTIME COMMAND [EVENTS]`: the path is
the bundle and RUNTIME (boto3, which Lambda provides) beside the standard library, nothing
else; the working directory is the bundle, as /var/task is. `imports` imports the five
handlers and names every module loaded from outside the bundle, RUNTIME and the standard
library; `invoke` creates the app's tables, then calls each [handler, event] of the EVENTS
file in turn. Each prints one JSON line.
"""

import asyncio
import json
import os
import sys
import sysconfig

HANDLERS = ("publish", "wake", "drain", "deliver", "http")
REMAINING_MS = 60_000  # what the fake context says is left of each invocation


class Context:
    """What Lambda's context object offers the handlers."""

    def __init__(self, name):
        self.invoked_function_arn = os.environ["DULY_WAKE_FUNCTION_ARN"].replace("wake", name)
        self.aws_request_id = f"request-{name}"

    def get_remaining_time_in_millis(self):
        return REMAINING_MS


def outsiders(allowed):
    """Loaded modules (but this script) whose file lies under none of `allowed`."""
    found = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if (
            path
            and name != "__main__"
            and not any(os.path.realpath(path).startswith(root) for root in allowed)
        ):
            found.append(f"{name}: {path}")
    return sorted(found)


def imports(bundle, runtime):
    from functions.lambdas import handlers, migrate

    missing = [name for name in HANDLERS if not callable(getattr(handlers, name, None))]
    if not callable(getattr(migrate, "on_deploy", None)):
        missing.append("migrate.on_deploy")
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    allowed = [os.path.realpath(bundle), os.path.realpath(runtime), stdlib]
    return {"missing": missing, "outsiders": outsiders(allowed)}


def invoke(events_file):
    from sqlalchemy.ext.asyncio import create_async_engine

    from functions.lambdas import handlers
    from infra.schema import create_schema, load_app
    from infra.schema.migrate import deployable_metadata
    from infra.settings import database_url

    async def create_tables():
        engine = create_async_engine(database_url(os.environ["DULY_DATABASE_URL"]))
        await create_schema(engine, deployable_metadata(load_app(os.environ["DULY_APP"])))
        await engine.dispose()

    asyncio.run(create_tables())
    with open(events_file) as file:
        calls = json.load(file)
    return [getattr(handlers, name)(event, Context(name)) for name, event in calls]


def main():
    bundle, runtime, command = sys.argv[1:4]
    sys.path[:0] = [bundle, runtime]
    os.chdir(bundle)
    answer = imports(bundle, runtime) if command == "imports" else invoke(sys.argv[4])
    print(json.dumps(answer, default=str))


main()
