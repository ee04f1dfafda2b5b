"""The example workflows `duly dev` serves when DULY_APP is not set.

`Onboarding`, `Expense`, `Digest` and `Research`/`Lookup` call stub services
that log (`send_email`, `has_activated`, ...), so a local run shows every step.
`declare_engine_tables` maps the engine's tables on `Base`: `event_registry`
routes `expense.submitted` through the outbox to `start_expense`, and
`graph_runtime` runs the expense-approval graph (`functions.expense_graph`) on
`ExpenseClaim`. Importing the module configures nothing (`functions.cli` does).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Literal

from sqlalchemy import JSON, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    STATE_ASSIGNMENT,
    STATE_COMPLETION,
    ConditionRegistry,
    Cron,
    DatabaseEventRegistry,
    GraphRuntime,
    GraphSubject,
    Limit,
    StaticDirectory,
    Workflow,
    WorkflowEvent,
    child,
    declare_engine_tables,
    every,
    fan_out,
    step,
    wait_for,
    wake_in,
)
from functions import expense_graph

log = logging.getLogger("duly.examples")

sent_emails: list[tuple[str, str]] = []  # (address, template), for tests and the dev log
activated_users: set[str] = set()  # users has_activated() reports as active


async def send_email(address: str, template: str) -> None:
    """Stand-in for an email provider: logs and remembers what it would send."""
    sent_emails.append((address, template))
    log.info("send_email(%r, %r)", address, template)


digests_sent: list[str] = []  # one entry per email_digest() call
managers_notified: list[int] = []  # expense ids notify_manager() was called for


async def notify_manager(expense_id: int) -> None:
    """Stand-in for asking a manager to approve an expense."""
    managers_notified.append(expense_id)
    log.info("notify_manager(%r)", expense_id)


async def email_digest() -> None:
    """Stand-in for the digest job: logs and counts."""
    digests_sent.append("digest")
    log.info("email_digest()")


unreachable_companies: set[str] = set()  # lookup_provider() fails for these


async def lookup_provider(company: str) -> str:
    """Stand-in for a company data provider; fails for `unreachable_companies`."""
    if company in unreachable_companies:
        raise ConnectionError(f"provider unreachable for {company}")
    log.info("lookup_provider(%r)", company)
    return f"{company}: 42 employees"


async def has_activated(user_id: str) -> bool:
    """Stand-in for the product's own check."""
    return user_id in activated_users


class Base(DeclarativeBase):
    """The examples' declarative base."""


class Onboarding(Base, Workflow):
    __tablename__ = "onboarding"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[str] = mapped_column(String, unique=True)
    email: Mapped[str] = mapped_column(String)
    nudges: Mapped[int] = mapped_column(default=0)
    status: Mapped[str] = mapped_column(String, default="welcoming")

    @step(retries=3)
    async def welcome(self):
        await send_email(self.email, "welcome")
        self.status = "waiting"
        return wake_in(Onboarding.check, timedelta(days=3))

    @step
    async def check(self):
        if await has_activated(self.user_id):
            self.status = "activated"
            return None
        self.nudges += 1
        await send_email(self.email, f"nudge_{self.nudges}")
        return wake_in(Onboarding.check, timedelta(days=4)) if self.nudges < 2 else None

    @step
    async def activated(self, plan: Literal["free", "pro"]):
        self.status = f"activated:{plan}"


class Expense(Base, Workflow):
    __tablename__ = "expense"

    id: Mapped[int] = mapped_column(primary_key=True)
    amount: Mapped[int] = mapped_column()
    status: Mapped[str] = mapped_column(String, default="draft")

    @step
    async def request_approval(self):
        await notify_manager(self.id)
        self.status = "pending"
        return wait_for(
            Expense.decide,
            timeout=timedelta(days=2),
            on_timeout=Expense.escalate,
        )

    @step
    async def decide(self, verdict: Literal["approve", "reject"], *, by: str):
        self.status = f"{verdict} by {by}"

    @step
    async def escalate(self):
        self.status = "escalated"


class Digest(Base, Workflow):
    __tablename__ = "digest"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String, unique=True)

    @step
    async def send(self):
        await email_digest()
        return every(Digest.send, Cron("0 9 * * MON-FRI", "America/Los_Angeles"))


class Research(Base, Workflow):
    __tablename__ = "research"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String)
    companies: Mapped[list[str]] = mapped_column(JSON, default=list)
    found: Mapped[int | None] = mapped_column(default=None)

    @step
    async def research_all(self):
        return fan_out(
            (
                child(
                    Lookup(key=f"{self.name}:{c}", customer=self.name, company=c),
                    Lookup.research,
                )
                for c in self.companies
            ),
            then=Research.report,
        )

    @step
    async def report(self):
        lookups = await self.children(Lookup).all()
        self.found = sum(lookup.summary is not None for lookup in lookups)


class Lookup(Base, Workflow):
    __tablename__ = "lookup"
    # However many companies one customer asks about, three lookups at a time.
    __workflow_limit__ = Limit(by="customer", at_most=3)

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String, unique=True)
    customer: Mapped[str] = mapped_column(String)
    company: Mapped[str] = mapped_column(String)
    summary: Mapped[str | None] = mapped_column(String, default=None)

    @step(retries=2, backoff=timedelta(seconds=30))
    async def research(self):
        self.summary = await lookup_provider(self.company)


# The engine's tables: the attempt log, the event layer's three, the graph workflows'.
engine_tables = declare_engine_tables(Base, graphs=True, names={"attempt_log": "workflow_attempt"})
WorkflowAttempt = engine_tables.attempt_log
Event = engine_tables.event
Outbox = engine_tables.outbox
Delivery = engine_tables.delivery


# -- events ------------------------------------------------------------------------------

EXPENSE_SUBMITTED = "expense.submitted"


def is_expense(event: WorkflowEvent) -> bool:
    """An `expense.submitted` payload names a whole-number expense id and amount.

    A payload that does not is dead-lettered at once: retrying cannot mend it.
    """
    payload = event.payload
    return all(
        isinstance(payload.get(name), int) and not isinstance(payload.get(name), bool)
        for name in ("expense_id", "amount")
    )


async def start_expense(event: WorkflowEvent) -> None:
    """Start the Expense run the event asks for; a second delivery starts nothing.

    The run's key is the expense id, so `start()` finds a run already there
    (a unique conflict) and returns False: the handler is idempotent.
    """
    expense = Expense(id=event.payload["expense_id"], amount=event.payload["amount"])
    if await expense.start(Expense.request_approval):
        log.info("expense %s: approval requested (event %s)", expense.id, event.event_id)
    else:
        log.info("expense %s has its run already; event %s starts none", expense.id, event.event_id)


event_registry = DatabaseEventRegistry(outbox=Outbox)
event_registry.register(EXPENSE_SUBMITTED, start_expense, validator=is_expense)


# -- graph workflows -------------------------------------------------------------------------


class ExpenseClaim(Base, GraphSubject):
    """The subject of the expense-approval graph: its `workflow_state` follows the graph."""

    __tablename__ = "expense_claims"
    __graph_owner_column__ = "submitted_by"  # whose claim it is: not theirs to approve

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(200), default="")
    amount: Mapped[int] = mapped_column(default=0)  # whole currency units
    submitted_by: Mapped[str] = mapped_column(String(200), default="")


graph_conditions = ConditionRegistry()


@graph_conditions.predicate("expense_over_limit")
def expense_over_limit(subject: ExpenseClaim, instance: Mapping[str, Any]) -> bool:
    """Above the limit, the director signs off too."""
    return subject.amount > expense_graph.LIMIT


async def notify_assignees(event: WorkflowEvent) -> None:
    """Stand-in for the assignment email: one per assignee, through the outbox."""
    template = f"state_assignment:{event.payload['state_code']}"
    for assignee in event.payload.get("assignees", []):
        await send_email(f"{assignee}@example.com", template)


async def notify_completion(event: WorkflowEvent) -> None:
    """Stand-in for the completion email to whoever submitted."""
    originator = event.payload.get("originator")
    if originator:
        await send_email(f"{originator}@example.com", "state_completion")


event_registry.register(STATE_ASSIGNMENT, notify_assignees)
event_registry.register(STATE_COMPLETION, notify_completion)

graph_runtime = GraphRuntime(
    engine_tables.graphs,
    directory=StaticDirectory(expense_graph.GROUPS),
    conditions=graph_conditions,
)
