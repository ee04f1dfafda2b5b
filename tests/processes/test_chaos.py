"""The chaos soak, short (issue 13, "Done when" 4): under kill -9, a PostgreSQL crash and a
pooler, every invariant of `bench/chaos.py` holds, counted from the database.

Three worker processes (one behind PgBouncer in transaction mode) serve a mixed
load for SOAK_SECONDS while one is killed every 3-5 s and PostgreSQL restarts
once in immediate mode; `bench/chaos.py --seconds 600` is the long version.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.chaos import SoakSettings, format_report, soak
from infra.embedded import EmbeddedPostgres, start_embedded

SOAK_SECONDS = 50.0


@pytest.fixture
def own_server() -> Iterator[EmbeddedPostgres]:
    """A server of this test's own: the soak restarts it. Not tuned for tests: with fsync
    and synchronous_commit off, a crash may lose what PostgreSQL said it committed, and
    the soak checks what survives one."""
    server = start_embedded()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.timeout(400)
async def test_the_soak_keeps_every_invariant_under_kills_a_crash_and_a_pooler(
    own_server: EmbeddedPostgres,
) -> None:
    report = await soak(own_server, SoakSettings(seconds=SOAK_SECONDS))
    print(format_report(report))
    # One every 3-5 s, a little less often on a loaded machine (a new worker takes a while).
    assert report.kills >= SOAK_SECONDS // 6, f"a kill every 3-5 s: {report.kills}"
    assert report.restarts == 1
    assert report.runs > 1000 and report.events > 100, "a load worth the name"
    assert report.violations == dict.fromkeys(report.violations, 0), format_report(report)
