"""The CloudFormation custom resource protocol: read a request, PUT its one answer.

CloudFormation sends Create, Update and Delete requests and waits (up to the
resource's ServiceTimeout) for a JSON answer PUT to the request's presigned
`ResponseURL`. `answer` sends it with the standard library, retried while the
invocation has time; the request's ids are copied, the PhysicalResourceId kept
stable. Why a custom resource: docs/architecture.md, "Migrations on deploy".
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

log = logging.getLogger("duly.lambda")

REQUEST_TYPES = ("Create", "Update", "Delete")
MAX_REASON = 1000  # characters: the whole answer must stay under 4096 bytes
PUT_TIMEOUT = 5.0  # seconds, for one attempt at the presigned URL
PUT_PAUSE = 0.5  # seconds between attempts

Status = Literal["SUCCESS", "FAILED"]


class RequestUnreadable(ValueError):
    """The event is not a CloudFormation custom resource request."""


@dataclass(frozen=True)
class Request:
    """The fields of a custom resource request that the answer needs."""

    request_type: str  # Create, Update or Delete
    response_url: str
    stack_id: str
    request_id: str
    logical_resource_id: str
    physical_resource_id: str  # the event's (Update, Delete), else one made from the ids
    properties: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, event: Any) -> Request:
        """The request in `event`; RequestUnreadable when a field the answer needs is missing."""
        if not isinstance(event, dict):
            raise RequestUnreadable("The event is not a JSON object.")
        required = ("RequestType", "ResponseURL", "StackId", "RequestId", "LogicalResourceId")
        missing = [name for name in required if not isinstance(event.get(name), str)]
        if missing:
            raise RequestUnreadable(
                "The event is not a CloudFormation custom resource request: no "
                + ", ".join(missing)
                + "."
            )
        stack_name = event["StackId"].split("/")[1] if "/" in event["StackId"] else "stack"
        properties = event.get("ResourceProperties")
        return cls(
            request_type=event["RequestType"],
            response_url=event["ResponseURL"],
            stack_id=event["StackId"],
            request_id=event["RequestId"],
            logical_resource_id=event["LogicalResourceId"],
            # Stable: CloudFormation reads a changed id as a replacement, then deletes the old.
            physical_resource_id=str(
                event.get("PhysicalResourceId") or f"{stack_name}-{event['LogicalResourceId']}"
            ),
            properties=properties if isinstance(properties, dict) else {},
        )


@dataclass(frozen=True)
class Outcome:
    """What to answer: the status, a reason without secrets, and the resource's attributes."""

    status: Status
    reason: str
    data: Mapping[str, str] = field(default_factory=dict)


def response_body(request: Request, outcome: Outcome) -> bytes:
    """The answer's JSON, as CloudFormation reads it."""
    reason = outcome.reason
    if len(reason) > MAX_REASON:
        reason = reason[: MAX_REASON - 3] + "..."
    body: dict[str, Any] = {
        "Status": outcome.status,
        "Reason": reason,
        "PhysicalResourceId": request.physical_resource_id,
        "StackId": request.stack_id,
        "RequestId": request.request_id,
        "LogicalResourceId": request.logical_resource_id,
        "NoEcho": False,
        "Data": dict(outcome.data),
    }
    return json.dumps(body).encode()


def answer(request: Request, outcome: Outcome, time_left: Callable[[], float]) -> bool:
    """PUT the answer to the request's URL, retried while `time_left()` (seconds) allows one
    more attempt; whether it was taken. Never raises: there is nobody else to tell."""
    body = response_body(request, outcome)
    attempt = 0
    while True:
        attempt += 1
        timeout = min(PUT_TIMEOUT, max(0.5, time_left() - PUT_PAUSE))
        try:
            _put(request.response_url, body, timeout)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log.warning("The answer to CloudFormation was not taken (attempt %d): %s", attempt, exc)
            if time_left() < PUT_PAUSE + 1.0:
                log.error("CloudFormation was never answered %s: %s", outcome.status, body)
                return False
            time.sleep(PUT_PAUSE)
            continue
        log.info("Answered CloudFormation %s: %s", outcome.status, outcome.reason)
        return True


def _put(url: str, body: bytes, timeout: float) -> None:
    # The URL is presigned with no content type: any other than the empty one is refused.
    put = urllib.request.Request(
        url,
        data=body,
        method="PUT",
        headers={"Content-Type": "", "Content-Length": str(len(body))},
    )
    if put.type not in ("https", "http"):
        raise ValueError(f"The ResponseURL is not an HTTP(S) URL: {put.type}.")
    with urllib.request.urlopen(put, timeout=timeout) as response:
        response.read()
