"""The headers every response carries: no sniffing, no framing, no caching of pages, HSTS.

Pages that set a policy of their own (the console's `render`) keep it; every other page
(the login form, a refusal, the docs, an error) gets a frame-only policy, so no other site
can frame it. Over https, browsers are told to come back over https alone.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Frames and form targets only: the docs' pages run inline scripts a stricter policy stops.
PAGE_POLICY = "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
HSTS = "max-age=31536000"  # a year


class SecurityHeaders:
    """Adds the headers to every HTTP response, refusals and errors included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        https = scope.get("scheme") == "https"

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("X-Content-Type-Options", "nosniff")
                if headers.get("content-type", "").startswith("text/html"):
                    headers.setdefault("Content-Security-Policy", PAGE_POLICY)
                    headers.setdefault("X-Frame-Options", "DENY")
                    headers.setdefault("Cache-Control", "no-store")
                    headers.setdefault("Referrer-Policy", "same-origin")
                if https:
                    headers.setdefault("Strict-Transport-Security", HSTS)
            await send(message)

        await self.app(scope, receive, send_with_headers)
