"""Kicking the wake function after a commit that leaves work ready now, debounced per process.

`kick_wake_after_commits(connection, aws_wake_invoke())` hangs an `AsyncKicker`
on `WorkflowConnection.kicks`: at most one asynchronous invoke per `interval`,
the first kick at once and the rest of a burst as one send at its end, so a
kick is merged, never dropped. A publisher that commits with its own session
kicks after its commit; on Lambda, `await kicker.flush()` before a handler
returns. A failed invoke is logged and retried, never raised into the caller:
`survive_aws_call` is the one place a call to AWS that follows a committed write
fails quietly (a warning, a count), for this kicker and the Lambda runtime alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from engine import (
    ConfigurationError,
    WorkflowConnection,
    first_line,
    settings as variables,
    telemetry,
)
from infra.aws.scheduler import wake_invoker

log = logging.getLogger("duly.kicks")

DEFAULT_INTERVAL = 0.2  # seconds: at most one invoke per process this often
RETRIES = 3  # failed invokes in a row retried, one interval apart
BOTO_TIMEOUTS = {"connect_timeout": 3, "read_timeout": 10}  # seconds
# Three tries in all: an AWS that cannot be reached (a VPC with no route to it) holds an
# answer about ten seconds at most before the failure is logged, not a minute.
BOTO_RETRIES = {"mode": "standard", "total_max_attempts": 3}

Invoke = Callable[[], Awaitable[None]]

# What each call after a commit does, as the warning of its failure says it.
AFTER_COMMIT_CALLS = {
    "kick": "invoke the wake function",
    "schedule": "register the next wake-up with EventBridge Scheduler",
}


async def survive_aws_call(call: str, send: Invoke, *, aws_errors_only: bool = False) -> bool:
    """Run `send`, a call to AWS that follows a committed write; whether it succeeded.

    A failure never reaches the caller, whose write stands: it is logged once,
    as a warning with the error's class and first line (no payload, no
    traceback), and counted (`telemetry.kick_failed`). The safety-net schedule
    bounds the delay it causes. `call` is a key of AFTER_COMMIT_CALLS. With
    `aws_errors_only`, an error that is not boto3's (the database's) is raised.
    """
    try:
        await send()
    except Exception as error:
        if aws_errors_only and not is_aws_error(error):
            raise
        telemetry.kick_failed(call)
        log.warning(
            "Could not %s: %s: %s. The write stands; the safety-net schedule bounds the delay.",
            AFTER_COMMIT_CALLS[call],
            type(error).__name__,
            first_line(error, "no message"),
        )
        return False
    return True


def is_aws_error(error: BaseException) -> bool:
    """Whether `error` is botocore's (AWS refused, or could not be reached), told without
    importing botocore."""
    return type(error).__module__.partition(".")[0] in ("botocore", "boto3")


class AsyncKicker:
    """A debounced `invoke()`: at once after a quiet interval, else once at the interval's end.

    Call it with a workflow name (as `WorkflowConnection.kicks` does) on the
    event loop; it never blocks and never raises. It belongs to one loop at
    a time: a kick from another thread is handed to that loop, and a kick on
    a new loop once the old one stopped moves it there.
    """

    def __init__(self, invoke: Invoke, interval: float = DEFAULT_INTERVAL) -> None:
        if not interval >= 0:
            raise ConfigurationError(f"The kick interval is seconds, at least 0, not {interval!r}.")
        self.invoke = invoke
        self.interval = float(interval)
        self.requested = 0  # kicks asked for
        self.sent = 0  # invokes started
        self.failed = 0  # invokes that raised
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_sent: float | None = None  # loop.time() of the last send
        self._timer: asyncio.TimerHandle | None = None  # the trailing send, when one waits
        self._sending: set[asyncio.Task[None]] = set()
        self._failures_in_a_row = 0

    def __call__(self, workflow: str = "") -> None:
        """Ask for a wake: `workflow` has work ready now (any name; the wake serves them all)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        bound = self._loop
        if bound is not None and bound is not loop and bound.is_running():
            # Another thread's kick: the bound loop owns the timer and the sends.
            bound.call_soon_threadsafe(self._request)
            return
        if loop is None:
            log.warning("A kick for %s came with no event loop running: not sent.", workflow)
            return
        if bound is not loop:
            self._move_to(loop)
        self._request()

    async def flush(self) -> None:
        """Send a waiting trailing kick now, and wait until every invoke started has returned.

        Await it before a Lambda handler returns: a frozen container sends nothing.
        """
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._send()
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)

    @property
    def waiting(self) -> bool:
        """Whether a trailing send is scheduled (a kick is folded into it)."""
        return self._timer is not None

    def _move_to(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve `loop` from now on; a trailing send left on a stopped loop is sent here."""
        left_behind = self._timer is not None
        if self._timer is not None:
            self._timer.cancel()
        self._loop, self._timer, self._last_sent = loop, None, None
        self._sending = set()
        if left_behind:
            self._send()

    def _request(self) -> None:
        """One kick, on the bound loop."""
        self.requested += 1
        self._schedule()

    def _schedule(self) -> None:
        """Send now, or fold into the trailing send at the end of the interval."""
        if self._timer is not None:
            return  # a send after this kick is already scheduled
        loop = self._loop
        assert loop is not None
        now = loop.time()
        wait = 0.0 if self._last_sent is None else self._last_sent + self.interval - now
        if wait <= 0:
            self._send()
        else:
            self._timer = loop.call_later(wait, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._send()

    def _send(self) -> None:
        loop = self._loop
        assert loop is not None
        self._last_sent = loop.time()
        self.sent += 1
        task = loop.create_task(self._invoke())
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _invoke(self) -> None:
        if await survive_aws_call("kick", self.invoke):
            self._failures_in_a_row = 0
            return
        self.failed += 1
        self._failures_in_a_row += 1
        if self._failures_in_a_row <= RETRIES:
            self._schedule()  # retried after the interval, RETRIES times in a row at most


@contextlib.asynccontextmanager
async def kick_wake_after_commits(
    connection: WorkflowConnection, invoke: Invoke, interval: float = DEFAULT_INTERVAL
) -> AsyncIterator[AsyncKicker]:
    """Invoke the wake function (debounced) whenever `connection` leaves work ready now.

    `invoke` is the asynchronous invoke of the wake function (`aws_wake_invoke()`,
    or `infra.aws.scheduler.wake_invoker`). Leaving the block stops listening and
    flushes: a kick still waiting is sent, and the sends are awaited.
    """
    kicker = AsyncKicker(invoke, interval)
    connection.kicks.append(kicker)
    try:
        yield kicker
    finally:
        connection.kicks.remove(kicker)
        await kicker.flush()


def aws_wake_invoke(
    function_arn: str | None = None, client: Any | Callable[[], Any] | None = None
) -> Invoke:
    """The asynchronous (Event) invoke of the deployment's wake function.

    `function_arn` defaults to DULY_WAKE_FUNCTION_ARN; `client` to a boto3
    `lambda` client made (and boto3 imported) on the first kick.
    """
    arn = function_arn or variables.WAKE_FUNCTION_ARN.read()
    if not arn:
        raise ConfigurationError(
            "No wake function to kick: set DULY_WAKE_FUNCTION_ARN (the wake function's ARN, "
            "an output of duly's template) or pass function_arn."
        )
    return wake_invoker(client if client is not None else _lambda_client, arn)


def _lambda_client() -> Any:
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "lambda", config=Config(**BOTO_TIMEOUTS, retries=BOTO_RETRIES)
    )
