"""The pressure bench's subprocesses: worker processes and the producer, always reaped.

Each speaks lines on stdout (`ready`, the producer's `offering PHASE <time>`)
and is stopped with SIGTERM (the producer with `stop`), then SIGKILL after
STOP_TIMEOUT; an open stdin ties each to the bench, so none outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from bench.harness import REPO_ROOT, stop_process

READY_TIMEOUT = 60.0  # seconds for a process to import and say "ready"
ANSWER_TIMEOUT = 30.0  # seconds for the producer to answer a command
STOP_TIMEOUT = 15.0  # seconds to stop before being killed


class Subprocess:
    """`python -m module *args` from the repository root, with pipes to talk to it."""

    def __init__(self, module: str, *args: str) -> None:
        self.command = [sys.executable, "-m", module, *args]
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.command,
            cwd=REPO_ROOT,
            stdin=asyncio.subprocess.PIPE,  # its end stops the process
            stdout=asyncio.subprocess.PIPE,  # stderr stays the bench's: tracebacks show
        )
        try:
            await self.expect("ready", READY_TIMEOUT)
        except BaseException:
            await self.stop()
            raise

    async def expect(self, word: str, timeout: float) -> list[str]:
        """The next line, which must begin with `word`; its other words."""
        assert self.process is not None and self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        parts = line.decode().split()
        if not parts or parts[0] != word:
            raise RuntimeError(f"{self.command[2]} said {line!r} where {word!r} was expected.")
        return parts[1:]

    @property
    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.returncode

    async def stop(self) -> bytes:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT; what it printed meanwhile."""
        return b"" if self.process is None else await stop_process(self.process, STOP_TIMEOUT)


class Producer(Subprocess):
    """`bench.pressure_producer`: offers runs at the rate and under the phase it is told."""

    def __init__(self, url: str, with_start_many: bool = False) -> None:
        super().__init__("bench.pressure_producer", url, *(["--start-many"] * with_start_many))
        self.failed_batches: int | None = None

    async def offer(self, rate: float, phase: str) -> float:
        """Offer `rate` runs a second tagged `phase` from now on; the time.time() it began."""
        return await self.tell(f"offer {rate}", phase)

    async def fill(self, target: int, phase: str) -> float:
        """Keep `target` runs unfinished, topped up with runs tagged `phase`; when it began."""
        return await self.tell(f"fill {target}", phase)

    async def tell(self, command: str, phase: str) -> float:
        """Send `command` for `phase`; the time.time() the producer began it."""
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(f"{command} {phase}\n".encode())
        await self.process.stdin.drain()
        answer = await self.expect("offering", ANSWER_TIMEOUT)
        if answer[0] != phase:
            raise RuntimeError(f"The producer began offering {answer[0]}, not {phase}.")
        return float(answer[1])

    async def finish(self) -> None:
        """Stop offering and end; note the batches the database refused."""
        process = self.process
        if process is None or process.returncode is not None or process.stdin is None:
            return
        process.stdin.write(b"stop\n")
        with contextlib.suppress(ConnectionError):
            await process.stdin.drain()
        try:
            rest, _ = await asyncio.wait_for(process.communicate(), STOP_TIMEOUT)
        except TimeoutError:
            await self.stop()
            return
        for line in rest.decode().splitlines():
            word, _, value = line.partition(" ")
            if word == "failed":
                self.failed_batches = int(value)
