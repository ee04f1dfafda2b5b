"""A request body as the guard hands it on: bounded in size (413) and in time (408).

`read_body` reads a whole body for the guard (a signature covers it) and
`replayed` hands it to the app; `bounded` lets the app read a body itself
under the same two limits.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from fastapi import HTTPException

if TYPE_CHECKING:
    from starlette.types import Message, Receive


class BodyRefused(Exception):
    """A body that went past the size limit (413) or took too long to arrive (408)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def too_large(limit: int) -> str:
    """The sentence of a 413."""
    return f"The request body is larger than {limit} bytes (DULY_MAX_BODY_BYTES)."


def too_large_signed(limit: int) -> str:
    """The sentence of a signed request's 413: its body is read before the signer is known."""
    return f"A signed request's body is larger than {limit} bytes: send larger ones with a token."


def too_slow(seconds: float) -> str:
    """The sentence of a 408."""
    return f"The request body took longer than {seconds:g} s to arrive (DULY_BODY_TIMEOUT_SECONDS)."


class Limits:
    """A body's size and time limits, counted from the moment the request arrived."""

    def __init__(self, max_bytes: int, timeout: float) -> None:
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.size = 0
        self.complete = False
        self.refusal = too_large(max_bytes)  # the 413's sentence

    def narrow(self, max_bytes: int, refusal: str) -> None:
        """A smaller size limit (a signed body's), refused with its own sentence."""
        if max_bytes < self.max_bytes:
            self.max_bytes, self.refusal = max_bytes, refusal

    async def next(self, receive: Receive) -> Message:
        """The client's next message; BodyRefused past either limit."""
        if self.complete:
            return await receive()
        try:
            async with asyncio.timeout(max(self.deadline - time.monotonic(), 0.0)):
                message = await receive()
        except TimeoutError:
            raise BodyRefused(408, too_slow(self.timeout)) from None
        if message["type"] != "http.request":
            self.complete = True  # the client went away
            return message
        self.size += len(message.get("body", b""))
        if self.size > self.max_bytes:
            raise BodyRefused(413, self.refusal)
        self.complete = not message.get("more_body", False)
        return message


async def read_body(receive: Receive, limits: Limits) -> bytes:
    """The whole body; BodyRefused as soon as it passes a limit."""
    chunks: list[bytes] = []
    while not limits.complete:
        message = await limits.next(receive)
        chunks.append(message.get("body", b"") if message["type"] == "http.request" else b"")
    return b"".join(chunks)


def replayed(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app `body` whole, then the client's own messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def bounded(receive: Receive, limits: Limits) -> Receive:
    """A receive the app reads its own body through: an HTTPException past either limit."""

    async def next_message() -> Message:
        try:
            return await limits.next(receive)
        except BodyRefused as refused:
            raise HTTPException(refused.status, refused.detail) from None

    return next_message
