"""The example graph workflow `duly dev` ships: expense approval, drawn as the designer saves it.

    start → manager review ─approve→ fork ─→ finance review ─┐
              │   └─reject→ rejected     └─→ legal review ───┴→ join → over 1,000?
              └─2 days, no decision→ director review              yes → director sign-off
                  (approve → fork, reject → rejected)             no  → approved

People are opaque ids: `mia` is the manager, the `finance` group (`fred`,
`fay`, `flo`) decides by majority, `lee` is legal, `dana` the director.
"""

from __future__ import annotations

from typing import Any

EXPENSE_APPROVAL = "expense-approval"
LIMIT = 1000  # an expense above this needs the director's sign-off

GROUPS = {"finance": ["fred", "fay", "flo"], "directors": ["dana"]}

STATES = [
    "manager_review",
    "director_review",
    "finance_review",
    "legal_review",
    "director_signoff",
    "approved",
    "rejected",
]


def _node(key: str, node_type: str, name: str, row: int, column: int = 0, **more: Any) -> Any:
    place = {"x": 360 + column * 280, "y": 60 + row * 150}
    return {"id": key, "type": node_type, "name": name, **place, **more}


NODES = [
    _node("start", "start", "Submitted", 0),
    _node(
        "manager",
        "state",
        "Manager review",
        1,
        stateCode="manager_review",
        assigneeUserIds=["mia"],
        deadlineSeconds=2 * 24 * 3600,
    ),
    _node(
        "director",
        "state",
        "Director review",
        1,
        1,
        stateCode="director_review",
        assigneeGroupIds=["directors"],
    ),
    _node("reviews", "fork", "Finance and legal", 2),
    _node(
        "finance",
        "state",
        "Finance review",
        3,
        -1,
        stateCode="finance_review",
        assigneeGroupIds=["finance"],
        threshold="majority",
    ),
    _node(
        "legal", "state", "Legal review", 3, 1, stateCode="legal_review", assigneeUserIds=["lee"]
    ),
    _node("reviewed", "join", "Reviews done", 4),
    _node("large", "condition", "Over the limit?", 5, condition="expense_over_limit"),
    _node(
        "signoff",
        "state",
        "Director sign-off",
        6,
        1,
        stateCode="director_signoff",
        assigneeGroupIds=["directors"],
    ),
    # An END may name the code its subject ends with (else the subject keeps its last).
    _node("approved", "end", "Approved", 7, stateCode="approved"),
    _node("rejected", "end", "Rejected", 2, 2, stateCode="rejected"),
]

CONNECTIONS = [
    {"source": "start", "target": "manager"},
    {"source": "manager", "target": "reviews", "label": "Approve"},
    {"source": "manager", "target": "rejected", "label": "Reject", "commentRequired": True},
    {"source": "manager", "target": "director", "label": "No decision in time", "escalation": True},
    {"source": "director", "target": "reviews", "label": "Approve"},
    {"source": "director", "target": "rejected", "label": "Reject", "commentRequired": True},
    {"source": "reviews", "target": "finance"},
    {"source": "reviews", "target": "legal"},
    {"source": "finance", "target": "reviewed", "label": "Finance approves"},
    {"source": "legal", "target": "reviewed", "label": "Legal approves"},
    {"source": "reviewed", "target": "large"},
    {"source": "large", "target": "signoff", "conditionResult": "true"},
    {"source": "large", "target": "approved", "conditionResult": "false"},
    {"source": "signoff", "target": "approved", "label": "Sign off"},
    {"source": "signoff", "target": "rejected", "label": "Reject", "commentRequired": True},
]

DESIGN: dict[str, Any] = {
    "name": EXPENSE_APPROVAL,
    "description": "Manager review, finance and legal in parallel, the director above the limit.",
    "stateChoices": STATES,
    "nodes": NODES,
    "connections": CONNECTIONS,
}
