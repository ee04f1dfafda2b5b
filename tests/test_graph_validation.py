"""Template validation: one test per code of `engine.graphs.design.validation`, each built so it
fails when its rule is removed, and valid graphs that must pass untouched.

Valid graphs
- nested forks, a branch that ends at END instead of its join, loops back to earlier
  states, a condition, a deadline with its escalation: no problem:
  test_a_valid_graph_with_nested_forks_an_end_branch_and_loops_has_no_problem
- the same drawing with its joins matched by resolve_matched_joins: no problem:
  test_a_drawing_resolved_by_the_designer_has_no_problem

The frame
- S1 no START: test_s1_no_start; several: test_s1_several_starts
- S2 START with two transitions: test_s2_start_has_exactly_one_transition
- S3 START leading to an END: test_s3_start_leads_to_a_state_or_condition
- S4 a node START cannot reach: test_s4_unreachable_node
- S5 no END: test_s5_no_end
- S6 an unknown node type: test_s6_unknown_node_type
- S7 no state code; one outside the vocabulary: test_s7_state_without_code,
  test_s7_state_code_outside_the_vocabulary
- S8 a state without transitions; a loop with no way out:
  test_s8_state_without_outgoing_transition, test_s8_dead_end_loop

Forks, conditions, joins
- S9 a fork with one branch; with no matched join; matched to a state:
  test_s9_fork_with_one_branch, test_s9_fork_without_matched_join,
  test_s9_fork_matched_to_a_non_join
- S10 a condition with two "true" edges; a result on a state's edge:
  test_s10_condition_needs_one_true_and_one_false,
  test_s10_condition_result_outside_a_condition
- S11 a join no fork matches; a join two forks match: test_s11_unmatched_join,
  test_s11_join_matched_by_two_forks
- S12 two forks whose scopes cross: test_s12_overlapping_scopes
- S13 a branch whose only way on is back through its fork:
  test_s13_branch_reaching_neither_join_nor_end
- S14 an inner branch that jumps to the outer join: test_s14_branch_leaves_its_scope

People and predicates
- S15 a condition without predicate; with an unregistered one; an edge guard that is
  not registered: test_s15_condition_without_predicate,
  test_s15_unregistered_predicate, test_s15_unregistered_edge_guard
- S16 a state without assignees: test_s16_state_without_assignees (and its message)
- S17 an unknown threshold: test_s17_unknown_threshold
- S18 a join and an END with assignees: test_s18_non_state_with_assignees
- S19 a join with two transitions: test_s19_join_needs_exactly_one_transition
- S20 a deadline without escalation; a non-positive deadline; an escalation from a
  state without deadline; two escalations: test_s20_deadline_without_escalation,
  test_s20_deadline_must_be_positive, test_s20_escalation_without_deadline,
  test_s20_two_escalations
- S21 who may submit is none of any, owner or a role; each of those is fine:
  test_s21_who_may_submit

The shape of the answer
- problems come in code order, then node order: test_problems_are_in_code_then_node_order
- every code S1..S21 has one rule, in order, and the docstring's table lists them:
  test_rules_cover_every_code_in_order
- str(problem) is "code: message": test_problem_reads_code_then_message
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Iterable, Mapping
from typing import Any

from engine.graphs.design import validation
from engine.graphs.design.joins import resolve_matched_joins
from engine.graphs.design.model import Graph
from engine.graphs.design.problems import Problem
from engine.graphs.design.validation import validate_graph
from engine.graphs.tables import CONDITION, END, FORK, JOIN, START, STATE
from tests.graph_helpers import EdgeSpec, NodeSpec, graph_of

PREDICATES = frozenset({"amount_over_1000"})


def state(code: str, *users: str) -> tuple[str, str, list[str]]:
    return (STATE, code, list(users or ["ann"]))


def expense_nodes(*, matched: bool = True) -> dict[str, NodeSpec]:
    """An expense approval: a send-back loop, a fork into finance (itself a loop), legal
    (which may reject at an END), an inner fork into tax and audit, and an archive branch
    that always ends at an END; then a condition on the amount and a deadline."""
    fork: dict[str, Any] = {"type": FORK}
    inner: dict[str, Any] = {"type": FORK}
    if matched:
        fork["matched_join"] = "merged"
        inner["matched_join"] = "inner_merged"
    return {
        "start": START,
        "submit": state("draft", "ann"),
        "manager": {
            "type": STATE,
            "state_code": "manager",
            "assignee_groups": ["managers"],
            "deadline_seconds": 86400,
        },
        "director": state("director", "dan"),
        "split": fork,
        "finance": state("finance", "fin"),
        "finance_check": state("finance_check", "fin2"),
        "legal": state("legal", "lee"),
        "inner": inner,
        "tax": state("tax", "tom"),
        "audit": state("audit", "aud"),
        "inner_merged": JOIN,
        "archive": state("archive", "arc"),
        "merged": JOIN,
        "big": {"type": CONDITION, "condition": "amount_over_1000"},
        "cfo": state("cfo", "cfo"),
        "done": END,
        "rejected": END,
    }


EXPENSE_EDGES: list[EdgeSpec] = [
    ("start", "submit"),
    ("submit", "manager"),
    ("manager", "submit"),  # send back for changes
    ("manager", "split"),
    ("manager", "director", {"escalation": True}),
    ("director", "split"),
    ("split", "finance"),
    ("split", "legal"),
    ("split", "inner"),
    ("split", "archive"),
    ("finance", "finance_check"),
    ("finance_check", "finance"),  # a loop inside a branch
    ("finance_check", "merged"),
    ("legal", "merged"),
    ("legal", "rejected"),  # a branch may end at an END instead of its join
    ("inner", "tax"),
    ("inner", "audit"),
    ("tax", "inner_merged"),
    ("audit", "inner_merged"),
    ("inner_merged", "merged"),
    ("archive", "done"),  # this branch never reaches the join
    ("merged", "big"),
    ("big", "cfo", {"condition_result": "true"}),
    ("big", "done", {"condition_result": "false"}),
    ("cfo", "done", {"condition": "amount_over_1000"}),
]


def codes(graph: Graph) -> list[str]:
    return [problem.code for problem in validate_graph(graph, PREDICATES)]


def small(nodes: Mapping[str, NodeSpec], edges: Iterable[EdgeSpec], **options: Any) -> list[str]:
    """The codes of a small graph."""
    return codes(graph_of(nodes, edges, **options))


def review(**fields: Any) -> dict[str, Any]:
    """A valid state node, with `fields` changed."""
    return {"type": STATE, "state_code": "review", "assignee_users": ["ann"], **fields}


LINE: list[EdgeSpec] = [("start", "review"), ("review", "done")]


def line(**fields: Any) -> dict[str, NodeSpec]:
    """start -> review -> done, the review node changed by `fields`."""
    return {"start": START, "review": review(**fields), "done": END}


def fork_graph(fork: Mapping[str, Any], edges: Iterable[EdgeSpec], **extra: NodeSpec) -> list[str]:
    """The codes of start -> draft -> fork -> `edges`, with states a and b and a join."""
    nodes: dict[str, NodeSpec] = {
        "start": START,
        "draft": state("draft"),
        "fork": {"type": FORK, **fork},
        "a": state("a"),
        "b": state("b"),
        "join": JOIN,
        "done": END,
        **extra,
    }
    return small(nodes, [("start", "draft"), ("draft", "fork"), *edges])


# Valid graphs.


def test_a_valid_graph_with_nested_forks_an_end_branch_and_loops_has_no_problem() -> None:
    graph = graph_of(expense_nodes(), EXPENSE_EDGES)
    assert validate_graph(graph, PREDICATES) == []


def test_a_drawing_resolved_by_the_designer_has_no_problem() -> None:
    drawing = graph_of(expense_nodes(matched=False), EXPENSE_EDGES)
    assert "S9" in codes(drawing)
    assert validate_graph(resolve_matched_joins(drawing), PREDICATES) == []


# The frame.


def test_s1_no_start() -> None:
    assert small({"review": review(), "done": END}, [("review", "done")]) == ["S1"]


def test_s1_several_starts() -> None:
    nodes: dict[str, NodeSpec] = {"start": START, "again": START, "review": review(), "done": END}
    edges: list[EdgeSpec] = [*LINE, ("again", "review")]
    assert small(nodes, edges) == ["S1"]


def test_s2_start_has_exactly_one_transition() -> None:
    nodes: dict[str, NodeSpec] = {
        "start": START,
        "review": review(),
        "other": state("other"),
        "done": END,
    }
    edges: list[EdgeSpec] = [*LINE, ("start", "other"), ("other", "done")]
    assert small(nodes, edges) == ["S2"]


def test_s3_start_leads_to_a_state_or_condition() -> None:
    assert small({"start": START, "done": END}, [("start", "done")]) == ["S3"]


def test_s4_unreachable_node() -> None:
    nodes: dict[str, NodeSpec] = {**line(), "island": state("island")}
    problems = validate_graph(graph_of(nodes, [*LINE, ("island", "done")]), PREDICATES)
    assert [(p.code, p.node_key) for p in problems] == [("S4", "island")]


def test_s5_no_end() -> None:
    # review loops on itself: with no END anywhere, S5 says it once, not S8 per node.
    nodes: dict[str, NodeSpec] = {"start": START, "review": review()}
    assert small(nodes, [("start", "review"), ("review", "review")]) == ["S5"]


def test_s6_unknown_node_type() -> None:
    nodes: dict[str, NodeSpec] = {**line(), "odd": "approval"}
    edges: list[EdgeSpec] = [("start", "review"), ("review", "odd"), ("odd", "done")]
    assert small(nodes, edges) == ["S6"]


def test_s7_state_without_code() -> None:
    assert small(line(state_code=None), LINE) == ["S7"]


def test_s7_state_code_outside_the_vocabulary() -> None:
    assert small(line(), LINE, state_choices=["draft", "approved"]) == ["S7"]


def test_s7_an_end_may_name_a_final_code_from_the_vocabulary_only() -> None:
    ended = {**line(), "done": {"type": END, "state_code": "approved"}}
    assert small(ended, LINE, state_choices=["review", "approved"]) == []
    assert small(ended, LINE, state_choices=["review"]) == ["S7"]


def test_s8_state_without_outgoing_transition() -> None:
    nodes: dict[str, NodeSpec] = {**line(), "stuck": state("stuck")}
    problems = validate_graph(graph_of(nodes, [*LINE, ("review", "stuck")]), PREDICATES)
    assert [(p.code, p.node_key) for p in problems] == [("S8", "stuck")]
    assert "no outgoing transition" in problems[0].message


def test_s8_dead_end_loop() -> None:
    nodes: dict[str, NodeSpec] = {**line(), "a": state("a"), "b": state("b")}
    edges: list[EdgeSpec] = [*LINE, ("review", "a"), ("a", "b"), ("b", "a")]
    problems = validate_graph(graph_of(nodes, edges), PREDICATES)
    assert [(p.code, p.node_key) for p in problems] == [("S8", "a"), ("S8", "b")]
    assert "cannot reach any END" in problems[0].message


# Forks, conditions, joins.

FORK_EDGES: list[EdgeSpec] = [
    ("fork", "a"),
    ("fork", "b"),
    ("a", "join"),
    ("b", "join"),
    ("join", "done"),
]


def test_a_fork_graph_of_the_tests_below_is_valid() -> None:
    assert fork_graph({"matched_join": "join"}, FORK_EDGES) == []


def test_s9_fork_with_one_branch() -> None:
    edges: list[EdgeSpec] = [("fork", "a"), ("a", "join"), ("join", "done")]
    nodes: dict[str, NodeSpec] = {"b": state("b")}
    assert fork_graph({"matched_join": "join"}, edges, **nodes) == ["S4", "S8", "S9"]
    # ("b" is left over, unreachable and stuck.)


def test_s9_fork_without_matched_join() -> None:
    assert fork_graph({}, FORK_EDGES) == ["S9", "S11"]


def test_s9_fork_matched_to_a_non_join() -> None:
    assert fork_graph({"matched_join": "a"}, FORK_EDGES) == ["S9", "S11"]


def test_s10_condition_needs_one_true_and_one_false() -> None:
    nodes: dict[str, NodeSpec] = {
        **line(),
        "check": {"type": CONDITION, "condition": "amount_over_1000"},
    }
    edges: list[EdgeSpec] = [
        ("start", "check"),
        ("check", "review", {"condition_result": "true"}),
        ("check", "done", {"condition_result": "true"}),
        ("review", "done"),
    ]
    assert small(nodes, edges) == ["S10"]


def test_s10_condition_result_outside_a_condition() -> None:
    edges: list[EdgeSpec] = [("start", "review"), ("review", "done", {"condition_result": "true"})]
    assert small(line(), edges) == ["S10"]


def test_s11_unmatched_join() -> None:
    nodes: dict[str, NodeSpec] = {**line(), "join": JOIN}
    edges: list[EdgeSpec] = [("start", "review"), ("review", "join"), ("join", "done")]
    assert small(nodes, edges) == ["S11"]


def test_s11_join_matched_by_two_forks() -> None:
    # fork -> [a, b -> inner -> [c, d]] and both forks name "join".
    edges: list[EdgeSpec] = [
        ("fork", "a"),
        ("fork", "b"),
        ("a", "join"),
        ("b", "inner"),
        ("inner", "c"),
        ("inner", "d"),
        ("c", "join"),
        ("d", "join"),
        ("join", "done"),
    ]
    extra: dict[str, NodeSpec] = {
        "inner": {"type": FORK, "matched_join": "join"},
        "c": state("c"),
        "d": state("d"),
    }
    assert fork_graph({"matched_join": "join"}, edges, **extra) == ["S11"]


def test_s12_overlapping_scopes() -> None:
    # A person picks "fork" or "other" at "pick"; the two forks share "b", and each of
    # their scopes holds nodes the other's does not.
    nodes: dict[str, NodeSpec] = {
        "start": START,
        "pick": state("pick"),
        "fork": {"type": FORK, "matched_join": "join"},
        "other": {"type": FORK, "matched_join": "other_join"},
        "a": state("a"),
        "b": state("b"),
        "c": state("c"),
        "join": JOIN,
        "other_join": JOIN,
        "done": END,
    }
    edges: list[EdgeSpec] = [
        ("start", "pick"),
        ("pick", "fork"),
        ("pick", "other"),
        ("fork", "a"),
        ("fork", "b"),
        ("other", "b"),
        ("other", "c"),
        ("a", "join"),
        ("b", "join"),
        ("b", "other_join"),
        ("c", "other_join"),
        ("join", "done"),
        ("other_join", "done"),
    ]
    problems = validate_graph(graph_of(nodes, edges), PREDICATES)
    assert [(p.code, p.node_key) for p in problems] == [
        ("S12", "other"),
        # b of each fork also reaches the other's join: S14 says it, once per branch.
        ("S14", "fork"),
        ("S14", "other"),
    ]


def test_s13_branch_reaching_neither_join_nor_end() -> None:
    # b only sends back to before the fork: it reaches END, but only by firing the fork
    # again, which would start a second scope inside the first.
    nodes: dict[str, NodeSpec] = {
        "start": START,
        "draft": state("draft"),
        "fork": {"type": FORK, "matched_join": "join"},
        "a": state("a"),
        "b": state("b"),
        "join": JOIN,
        "done": END,
    }
    edges: list[EdgeSpec] = [
        ("start", "draft"),
        ("draft", "fork"),
        ("fork", "a"),
        ("fork", "b"),
        ("a", "join"),
        ("b", "draft"),
        ("join", "done"),
    ]
    problems = validate_graph(graph_of(nodes, edges), PREDICATES)
    assert [(p.code, p.node_key) for p in problems] == [("S13", "fork")]
    assert "'b'" in problems[0].message


def test_s14_branch_leaves_its_scope() -> None:
    # fork -> [a, inner -> [c, d]]: d jumps straight to the outer join.
    edges: list[EdgeSpec] = [
        ("fork", "a"),
        ("fork", "inner"),
        ("a", "join"),
        ("inner", "c"),
        ("inner", "d"),
        ("c", "inner_join"),
        ("d", "join"),
        ("inner_join", "join"),
        ("join", "done"),
    ]
    extra: dict[str, NodeSpec] = {
        "inner": {"type": FORK, "matched_join": "inner_join"},
        "c": state("c"),
        "d": state("d"),
        "inner_join": JOIN,
    }
    nodes: dict[str, NodeSpec] = {
        "start": START,
        "draft": state("draft"),
        "fork": {"type": FORK, "matched_join": "join"},
    }
    graph = graph_of(
        {**nodes, "a": state("a"), "join": JOIN, "done": END, **extra},
        [("start", "draft"), ("draft", "fork"), *edges],
    )
    problems = validate_graph(graph, PREDICATES)
    assert [(p.code, p.node_key) for p in problems] == [("S14", "inner")]
    assert "'d'" in problems[0].message and "'join'" in problems[0].message


# People and predicates.


def condition_graph(**fields: Any) -> list[str]:
    nodes: dict[str, NodeSpec] = {**line(), "check": {"type": CONDITION, **fields}}
    edges: list[EdgeSpec] = [
        ("start", "check"),
        ("check", "review", {"condition_result": "true"}),
        ("check", "done", {"condition_result": "false"}),
        ("review", "done"),
    ]
    return small(nodes, edges)


def test_s15_condition_without_predicate() -> None:
    assert condition_graph(condition="amount_over_1000") == []
    assert condition_graph() == ["S15"]


def test_s15_unregistered_predicate() -> None:
    assert condition_graph(condition="weekday") == ["S15"]


def test_s15_unregistered_edge_guard() -> None:
    edges: list[EdgeSpec] = [("start", "review"), ("review", "done", {"condition": "weekday"})]
    assert small(line(), edges) == ["S15"]


def test_s16_state_without_assignees() -> None:
    graph = graph_of(line(assignee_users=[], name="Closed"), LINE)
    problems = validate_graph(graph, PREDICATES)
    assert problems == [
        Problem(
            "S16",
            "'Closed' has no assignees. Name at least one user or group who may move this state.",
            "review",
        )
    ]
    assert [str(p) for p in problems] == [
        "S16: 'Closed' has no assignees. Name at least one user or group who may move this state."
    ]
    # A group is enough.
    assert small(line(assignee_users=[], assignee_groups=["clerks"]), LINE) == []


def test_s17_unknown_threshold() -> None:
    assert small(line(approval_threshold="most"), LINE) == ["S17"]


def test_s18_non_state_with_assignees() -> None:
    nodes: dict[str, NodeSpec] = {
        "start": START,
        "draft": state("draft"),
        "review": review(),
        "join": {"type": JOIN, "assignee_users": ["ann"]},
        "done": {"type": END, "assignee_groups": ["clerks"]},
        "fork": {"type": FORK, "matched_join": "join"},
        "a": state("a"),
    }
    edges: list[EdgeSpec] = [
        ("start", "draft"),
        ("draft", "fork"),
        ("fork", "review"),
        ("fork", "a"),
        ("review", "join"),
        ("a", "join"),
        ("join", "done"),
    ]
    problems = validate_graph(graph_of(nodes, edges), PREDICATES)
    assert [(p.code, p.node_key) for p in problems] == [("S18", "join"), ("S18", "done")]


def test_s19_join_needs_exactly_one_transition() -> None:
    edges: list[EdgeSpec] = [*FORK_EDGES, ("join", "c"), ("c", "done")]
    assert fork_graph({"matched_join": "join"}, edges, c=state("c")) == ["S19"]


def deadline_graph(edges: Iterable[EdgeSpec], **fields: Any) -> list[str]:
    nodes: dict[str, NodeSpec] = {**line(**fields), "boss": state("boss")}
    return small(nodes, [*LINE, ("boss", "done"), *edges])


def test_s20_deadline_without_escalation() -> None:
    assert deadline_graph([("review", "boss", {"escalation": True})], deadline_seconds=60) == []
    assert deadline_graph([("review", "boss")], deadline_seconds=60) == ["S20"]


def test_s20_deadline_must_be_positive() -> None:
    escalation: list[EdgeSpec] = [("review", "boss", {"escalation": True})]
    assert deadline_graph(escalation, deadline_seconds=0) == ["S20"]


def test_s20_escalation_without_deadline() -> None:
    assert deadline_graph([("review", "boss", {"escalation": True})]) == ["S20"]


def test_s20_two_escalations() -> None:
    nodes: dict[str, NodeSpec] = {
        **line(deadline_seconds=60),
        "boss": state("boss"),
        "chief": state("chief"),
    }
    edges: list[EdgeSpec] = [
        *LINE,
        ("review", "boss", {"escalation": True}),
        ("review", "chief", {"escalation": True}),
        ("boss", "done"),
        ("chief", "done"),
    ]
    assert small(nodes, edges) == ["S20"]


def test_s21_who_may_submit() -> None:
    graph = graph_of(line(), LINE)
    assert codes(dataclasses.replace(graph, submitters="nobody")) == ["S21"]
    for rule in ("any", "owner", "viewer", "operator", "designer", "admin"):
        assert codes(dataclasses.replace(graph, submitters=rule)) == []


# The shape of the answer.


def test_problems_are_in_code_then_node_order() -> None:
    nodes: dict[str, NodeSpec] = {
        "start": START,
        "first": {"type": STATE, "state_code": "first", "approval_threshold": "most"},
        "second": {"type": STATE, "state_code": "second", "approval_threshold": "most"},
        "done": END,
    }
    edges: list[EdgeSpec] = [("start", "first"), ("first", "second"), ("second", "done")]
    problems = validate_graph(graph_of(nodes, edges), PREDICATES)
    assert [(p.code, p.node_key) for p in problems] == [
        ("S16", "first"),
        ("S16", "second"),
        ("S17", "first"),
        ("S17", "second"),
    ]


def test_rules_cover_every_code_in_order() -> None:
    expected = [f"S{number}" for number in range(1, 22)]
    assert [code for code, _ in validation.RULES] == expected
    rules = inspect.getdoc(validation.validate_graph) or ""
    table = re.findall(r"^(S\d+) ", rules, flags=re.MULTILINE)
    assert table == expected


def test_problem_reads_code_then_message() -> None:
    problem = Problem("S5", "The graph has no END node.")
    assert str(problem) == "S5: The graph has no END node."
    assert problem.node_key is None
