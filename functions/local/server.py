"""`duly dev`'s uvicorn: its config, and a protocol that closes a connection whose head is late.

uvicorn times a connection out only once it has answered a request
(`timeout_keep_alive`): one that sends nothing after connecting, or its
request head a byte at a time, is held for as long as it likes. `HeadTimed`
is uvicorn's h11 protocol with a timer on the head; why a protocol and not
a setting is in docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

if TYPE_CHECKING:
    from starlette.types import ASGIApp

HEAD_TIMEOUT = 10.0  # seconds from connecting (or from the last answer) to a whole request head
KEEP_ALIVE = 5  # seconds an idle connection is kept after an answer (uvicorn's default)
FORWARDED_ALLOW_IPS = "FORWARDED_ALLOW_IPS"  # uvicorn's: the proxies whose X-Forwarded-For counts
MAX_HEAD_BYTES = 16 * 1024  # a request head larger than this is 400 (h11's default, said here)


class HeadTimed(H11Protocol):
    """uvicorn's h11 protocol; a connection without a whole request head HEAD_TIMEOUT
    seconds after it opened, or after its last answer, is closed."""

    head_timeout = HEAD_TIMEOUT
    head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        """Time the next request head from now: a new cycle is the sign that it came."""
        self._stop_timer()
        if not self.transport.is_closing():
            self.head_timer = self.loop.call_later(self.head_timeout, self._head_late, self.cycle)

    def _head_late(self, waited_after: RequestResponseCycle | None) -> None:
        # No new cycle since the timer started, and none answering (a pipelined request
        # may be running): the head never came whole.
        idle = waited_after is None or waited_after.response_complete
        if self.cycle is waited_after and idle and not self.transport.is_closing():
            self.transport.close()

    def _stop_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None


def dev_config(app: ASGIApp, host: str, port: int) -> uvicorn.Config:
    """uvicorn's config for `duly dev`: the head timed, keep-alive and head size bounded."""
    # log_config None: keep the format configure_logging set.
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        log_config=None,
        http=HeadTimed,
        timeout_keep_alive=KEEP_ALIVE,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        **proxy_options(),
    )


def proxy_options(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """uvicorn's proxy options for `duly dev`: X-Forwarded-For is believed only from the
    addresses FORWARDED_ALLOW_IPS names, and from nobody when it is unset (uvicorn's own
    default believes loopback, so any local process could name any client address)."""
    allowed = (os.environ if environ is None else environ).get(FORWARDED_ALLOW_IPS)
    if not allowed:
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": allowed}
