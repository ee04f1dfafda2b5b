"""The bench's output: figures with their peers' numbers, as a table and as JSON."""

from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy

from infra.embedded import EmbeddedPostgres

# What the settings below decide: what one commit costs.
COMMIT_SETTINGS = ["fsync", "synchronous_commit", "wal_sync_method", "full_page_writes"]


@dataclass(frozen=True)
class Figure:
    """One line of the report; value None when its measurement failed."""

    key: str
    metric: str
    value: float | None
    unit: str
    reference: str


@dataclass
class Report:
    """Everything one bench run found, in the shape its JSON takes."""

    machine: dict[str, Any]
    sizes: dict[str, Any]
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def add(
        self, key: str, metric: str, value: float | None, unit: str, reference: str = ""
    ) -> None:
        """Record one figure."""
        self.figures.append(Figure(key, metric, value, unit, reference))

    def as_json(self) -> dict[str, Any]:
        """The report as plain JSON values."""
        return {
            "machine": self.machine,
            "sizes": self.sizes,
            "figures": [asdict(f) for f in self.figures],
            "details": self.details,
            "errors": self.errors,
        }


async def machine_info(server: EmbeddedPostgres, worker_concurrency: int) -> dict[str, Any]:
    """What the figures depend on besides the engine: CPUs, versions, commit settings."""
    async with await psycopg.AsyncConnection.connect(server.conninfo_for(), autocommit=True) as c:
        version = await (await c.execute("SHOW server_version")).fetchone()
        settings = await (
            await c.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", (COMMIT_SETTINGS,)
            )
        ).fetchall()
    cpu_model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "postgres": str(version[0]) if version else None,
        "postgres_settings": dict(settings),
        "psycopg": psycopg.__version__,
        "sqlalchemy": sqlalchemy.__version__,
        "worker_concurrency": worker_concurrency,
    }


def format_value(value: float | None, unit: str) -> str:
    """Rates as whole numbers with separators, ms to a tenth; seconds, ratios and WAL writes or
    flushes per step to a hundredth."""
    if value is None:
        return "failed"
    if unit in ("s", "x") or unit.startswith(("syncs/", "writes/")):  # seconds, ratios, WAL I/O
        return f"{value:,.2f}"
    return f"{value:,.1f}" if unit == "ms" else f"{value:,.0f}"


def format_table(report: Report) -> str:
    """The figures as a plain-text table, with the failures named under it."""
    rows = [("metric", "value", "unit", "reference")]
    rows += [(f.metric, format_value(f.value, f.unit), f.unit, f.reference) for f in report.figures]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for metric, value, unit, reference in rows:
        line = f"{metric:<{widths[0]}}  {value:>{widths[1]}}  {unit:<{widths[2]}}  {reference}"
        lines.append(line.rstrip())
    lines.insert(1, "-" * (sum(widths) + 6))
    lines += [f"! {name}: {error}" for name, error in report.errors.items()]
    return "\n".join(lines)
