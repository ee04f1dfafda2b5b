"""What a bulk action reports and how it goes on: its start, confirmed against the dry run's
count; its progress after each batch; the continuation a caller hands back to take it up
where a time budget stopped it, honoured only when it is the last one the audit trail
sealed for the same principal (`hold_position`)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import ColumnElement, FromClause, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from engine.base.audit import audit, record_action
from engine.base.errors import BulkChangedError, InvalidArgumentError
from engine.base.shown import json_value
from engine.model.connection import WorkflowConnection

BATCH_SIZE = 200  # rows a batch's transaction reads at most


@dataclass(frozen=True)
class AuditActor:
    """Who acts, and through which door (http, console, cli, lambda): the audit's actor and via."""

    id: str
    via: str


@dataclass(frozen=True)
class BulkProgress:
    """Where a bulk action stands after a batch: rows acted on, skipped, out of the total."""

    bulk_id: str
    action: str
    done: int  # rows acted on so far
    # Rows read but not acted on: a worker held them (a live lease, or a lock), or they no
    # longer match (a cancel's finished runs: nothing to end).
    skipped: int
    total: int  # the rows the confirmed dry run counted
    batches: int  # batches committed so far
    after: tuple[Any, ...] | None  # the last key read; None before the first batch
    upto: tuple[Any, ...] | None  # the snapshot bound: no row past this key is touched
    digest: str  # what the action and its filter are, so a continuation cannot change them
    finished: bool = False
    # The audit record of the last batch, whose detail holds this progress's seal; None only
    # for a start just confirmed against its dry run (a continuation always names one).
    record: int | None = None

    @classmethod
    def started(
        cls, action: str, expected: int, upto: tuple[Any, ...] | None, digest: str
    ) -> BulkProgress:
        """A new bulk action's progress, none done; finished already when the dry run matched
        nothing (no `upto`)."""
        return cls(new_bulk_id(), action, 0, 0, expected, 0, None, upto, digest, upto is None)

    def to_dict(self) -> dict[str, Any]:
        """As the API answers it: the counts, and `next` while there is more to do."""
        return {
            "bulk_id": self.bulk_id,
            "action": self.action,
            "done": self.done,
            "skipped": self.skipped,
            "total": self.total,
            "batches": self.batches,
            "finished": self.finished,
            "next": None if self.finished else self.encode(),
        }

    def encode(self) -> str:
        """The continuation as URL-safe text: the document and its audit record."""
        raw = json.dumps(self._document() | {"r": self.record}, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def seal(self) -> str:
        """What the audit record of the batch that reached this progress keeps of it (a walk's
        end too, so its last position cannot be gone on from)."""
        sealed = self._document() | {"f": self.finished}
        raw = json.dumps(sealed, separators=(",", ":"), sort_keys=True).encode()
        return hashlib.sha256(b"duly bulk " + raw).hexdigest()[:32]

    def _document(self) -> dict[str, Any]:
        return {
            "b": self.bulk_id,
            "x": self.action,
            "d": self.done,
            "s": self.skipped,
            "t": self.total,
            "n": self.batches,
            "a": None if self.after is None else [json_value(k) for k in self.after],
            "u": None if self.upto is None else [json_value(k) for k in self.upto],
            "h": self.digest,
        }

    @classmethod
    def decode(cls, text: str, digest: str) -> BulkProgress:
        """A continuation given back for the action and filter of `digest`; a DulyError if not."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            d = json.loads(raw)
            progress = cls(
                bulk_id=_text(d["b"]),
                action=_text(d["x"]),
                done=_count(d["d"]),
                skipped=_count(d["s"]),
                total=_count(d["t"]),
                batches=_count(d["n"]),
                after=_key(d["a"]),
                upto=_key(d["u"]),
                digest=_text(d["h"]),
                record=_count(d["r"]),
            )
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise InvalidArgumentError(
                f"{text[:80]!r} is not a bulk action's continuation: go on from the `next` "
                "an answer gave."
            ) from None
        if progress.digest != digest:
            raise BulkChangedError(
                "This continuation was given for another action or filter: go on with the "
                "same body, or dry-run the new one."
            )
        return progress

    def moved(self, done: int, skipped: int, after: tuple[Any, ...] | None) -> BulkProgress:
        """The progress after one more batch."""
        return replace(
            self,
            done=self.done + done,
            skipped=self.skipped + skipped,
            batches=self.batches + 1,
            after=after,
        )


def _key(given: Any) -> tuple[Any, ...]:
    """A key of a continuation: a list of strings and numbers (a batch has read one)."""
    if not isinstance(given, list) or not given:
        raise InvalidArgumentError("a key is a list")
    for value in given:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise InvalidArgumentError("a key's value is a string or a number")
    return tuple(given)


def _text(given: Any) -> str:
    if not isinstance(given, str):
        raise InvalidArgumentError("text")
    return given


def _count(given: Any) -> int:
    if isinstance(given, bool) or not isinstance(given, int) or not 0 <= given < 2**63:
        raise InvalidArgumentError("a count")
    return given


async def hold_position(
    session: AsyncSession, progress: BulkProgress, actor: AuditActor, *, action: str, workflow: str
) -> None:
    """Before a batch, in its transaction: a BulkChangedError unless `progress` is a start, or
    the last position this bulk action reached, sealed in its audit record for `actor`.

    The bulk's own lock (a transaction's advisory lock) keeps two callers from going on
    from the same position at once: the second one finds the first one's record.
    """
    if progress.record is None:
        return
    lock = func.hashtextextended(f"duly bulk {progress.bulk_id}", 0)
    await session.execute(select(func.pg_advisory_xact_lock(lock)))
    sealed = select(audit.c.actor, audit.c.action, audit.c.workflow, audit.c.detail).where(
        audit.c.id == progress.record
    )
    row = (await session.execute(sealed)).first()
    later = (
        select(audit.c.id)
        .where(audit.c.workflow == workflow, audit.c.id > progress.record)
        .where(audit.c.action == action, audit.c.detail["bulk"].astext == progress.bulk_id)
        .limit(1)
    )
    if (
        row is None
        or (row.actor, row.action, row.workflow) != (actor.id, action, workflow)
        or progress.seal() not in json.dumps(row.detail)
        or (await session.execute(later)).first() is not None
    ):
        raise BulkChangedError(
            "This continuation is not the last one this bulk action gave you: go on from the "
            "newest `next` you were given, or dry-run again."
        )


async def confirm_count(
    connection: WorkflowConnection,
    table: FromClause,
    bounded: Sequence[ColumnElement[bool]],
    *,
    expected: int,
    rows: str,
) -> None:
    """Count the rows an apply's filter matches up to the dry run's bound (`bounded`) again.

    A BulkChangedError when there are more than the dry run's `expected`: the set has grown
    since, and nobody confirmed the new rows. `rows` names them in the message, as
    "chore runs up to key 3". It writes nothing.
    """
    count = select(func.count()).select_from(table).where(*bounded)
    async with connection.sessionmaker() as session:
        now = int((await session.execute(count)).scalar_one())
    if now > expected:
        raise BulkChangedError(
            f"The filter now matches {now} {rows}, the dry run counted {expected}: "
            "dry-run again and confirm the new count."
        )


async def record_batch(
    session: AsyncSession,
    progress: BulkProgress,
    actor: AuditActor,
    *,
    read: int,
    done: int,
    after: tuple[Any, ...] | None,
    last: bool,
    action: str,
    workflow: str,
    subject: dict[str, Any],
    detail: dict[str, Any] | None = None,
) -> BulkProgress:
    """One batch's progress and its audit record, in the caller's transaction.

    The batch read `read` rows up to the key `after` and acted on `done` of them (the rest
    are skipped); `last` when no row is left past its window, so the walk is over. The record
    names `action` (the caller's, never a continuation's text), with `{bulk, batch,
    skipped}` and `detail` as its detail.
    """
    skipped = read - done
    moved = replace(progress.moved(done, skipped, after), finished=last)
    # The seal first: a detail too long to keep whole keeps its beginning.
    counts = {"seal": moved.seal(), "bulk": progress.bulk_id, "batch": moved.batches}
    record = await record_action(
        session,
        actor=actor.id,
        via=actor.via,
        action=action,
        workflow=workflow,
        subject=subject,
        count=done,
        detail=counts | {"skipped": skipped} | (detail or {}),
    )
    return replace(moved, record=record)


def digest_of(*parts: Any) -> str:
    """A short digest of an action and its filter, as JSON."""
    text = json.dumps([json_value(p) for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def new_bulk_id() -> str:
    """The id one bulk action's audit records share."""
    return uuid.uuid4().hex[:12]
