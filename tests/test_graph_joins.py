"""Matching forks to joins from the drawing (`resolve_matched_joins`).

- a fork whose branches all reach one join is matched to it:
  test_a_simple_fork_is_matched_to_its_join
- nested forks: the inner fork gets the inner join, and the outer walk skips the inner
  pair to find the outer join: test_nested_forks_each_get_their_own_join
- a branch that ends at an END without a join takes no part in the match:
  test_a_branch_to_an_end_is_left_out_of_the_match
- branches with no join in common leave the fork unmatched:
  test_branches_with_no_common_join_leave_the_fork_unmatched
- several joins in common is no match either: test_two_common_joins_are_no_match
- a fork whose branches all end at ENDs has no join: test_a_fork_with_only_end_branches_has_no_join
- a loop back to an earlier state, and one back through the fork, end the walk:
  test_loops_end_the_walk
- a drawn match is replaced by the one the drawing says:
  test_a_stale_match_is_replaced
- the graph given is not changed; a new one is returned:
  test_the_given_graph_is_left_unchanged
"""

from __future__ import annotations

import uuid

from engine.graphs.design.joins import resolve_matched_joins
from engine.graphs.design.model import Graph
from engine.graphs.tables import END, FORK, JOIN, START, STATE
from tests.graph_helpers import graph_of


def matched(graph: Graph) -> dict[str, str | None]:
    """Each fork's matched join, by key."""
    resolved = resolve_matched_joins(graph)
    keys = {node.id: node.key for node in resolved.nodes.values()}
    return {
        fork.key: keys[fork.matched_join_id] if fork.matched_join_id else None
        for fork in resolved.of_type(FORK)
    }


def state(code: str) -> tuple[str, str, list[str]]:
    return (STATE, code, ["ann"])


def test_a_simple_fork_is_matched_to_its_join() -> None:
    graph = graph_of(
        {
            "start": START,
            "fork": FORK,
            "a": state("a"),
            "b": state("b"),
            "join": JOIN,
            "done": END,
        },
        [
            ("start", "fork"),
            ("fork", "a"),
            ("fork", "b"),
            ("a", "join"),
            ("b", "join"),
            ("join", "done"),
        ],
    )
    assert matched(graph) == {"fork": "join"}


def test_nested_forks_each_get_their_own_join() -> None:
    # outer -> [a, inner -> [c, d] -> inner_join] -> outer_join: the outer walk meets
    # inner_join first on its second branch, but inner_join belongs to the inner fork.
    graph = graph_of(
        {
            "start": START,
            "outer": FORK,
            "a": state("a"),
            "inner": FORK,
            "c": state("c"),
            "d": state("d"),
            "inner_join": JOIN,
            "after_inner": state("after"),
            "outer_join": JOIN,
            "done": END,
        },
        [
            ("start", "outer"),
            ("outer", "a"),
            ("outer", "inner"),
            ("a", "outer_join"),
            ("inner", "c"),
            ("inner", "d"),
            ("c", "inner_join"),
            ("d", "inner_join"),
            ("inner_join", "after_inner"),
            ("after_inner", "outer_join"),
            ("outer_join", "done"),
        ],
    )
    assert matched(graph) == {"outer": "outer_join", "inner": "inner_join"}


def test_a_branch_to_an_end_is_left_out_of_the_match() -> None:
    graph = graph_of(
        {
            "start": START,
            "fork": FORK,
            "a": state("a"),
            "b": state("b"),
            "escape": state("escape"),
            "join": JOIN,
            "done": END,
            "dropped": END,
        },
        [
            ("start", "fork"),
            ("fork", "a"),
            ("fork", "b"),
            ("fork", "escape"),
            ("a", "join"),
            ("b", "join"),
            ("escape", "dropped"),
            ("join", "done"),
        ],
    )
    assert matched(graph) == {"fork": "join"}


def test_branches_with_no_common_join_leave_the_fork_unmatched() -> None:
    graph = graph_of(
        {
            "start": START,
            "fork": FORK,
            "a": state("a"),
            "b": state("b"),
            "one": JOIN,
            "two": JOIN,
            "done": END,
        },
        [
            ("start", "fork"),
            ("fork", "a"),
            ("fork", "b"),
            ("a", "one"),
            ("b", "two"),
            ("one", "done"),
            ("two", "done"),
        ],
    )
    assert matched(graph) == {"fork": None}


def test_two_common_joins_are_no_match() -> None:
    # Each branch may go to either join: which closes the fork is ambiguous.
    graph = graph_of(
        {
            "start": START,
            "fork": FORK,
            "a": state("a"),
            "b": state("b"),
            "one": JOIN,
            "two": JOIN,
            "done": END,
        },
        [
            ("start", "fork"),
            ("fork", "a"),
            ("fork", "b"),
            ("a", "one"),
            ("a", "two"),
            ("b", "one"),
            ("b", "two"),
            ("one", "done"),
            ("two", "done"),
        ],
    )
    assert matched(graph) == {"fork": None}


def test_a_fork_with_only_end_branches_has_no_join() -> None:
    graph = graph_of(
        {"start": START, "fork": FORK, "a": state("a"), "b": state("b"), "done": END},
        [("start", "fork"), ("fork", "a"), ("fork", "b"), ("a", "done"), ("b", "done")],
    )
    assert matched(graph) == {"fork": None}


def test_loops_end_the_walk() -> None:
    # a sends back to itself through a fix-up state; b sends back to before the fork.
    graph = graph_of(
        {
            "start": START,
            "draft": state("draft"),
            "fork": FORK,
            "a": state("a"),
            "fix": state("fix"),
            "b": state("b"),
            "join": JOIN,
            "done": END,
        },
        [
            ("start", "draft"),
            ("draft", "fork"),
            ("fork", "a"),
            ("fork", "b"),
            ("a", "fix"),
            ("fix", "a"),
            ("a", "join"),
            ("b", "draft"),
            ("b", "join"),
            ("join", "draft"),
            ("join", "done"),
        ],
    )
    assert matched(graph) == {"fork": "join"}


def test_a_stale_match_is_replaced() -> None:
    graph = graph_of(
        {
            "start": START,
            "fork": {"type": FORK, "matched_join": "b"},
            "a": state("a"),
            "b": state("b"),
            "join": JOIN,
            "done": END,
        },
        [
            ("start", "fork"),
            ("fork", "a"),
            ("fork", "b"),
            ("a", "join"),
            ("b", "join"),
            ("join", "done"),
        ],
    )
    assert matched(graph) == {"fork": "join"}


def test_the_given_graph_is_left_unchanged() -> None:
    graph = graph_of(
        {"start": START, "fork": FORK, "a": state("a"), "b": state("b"), "join": JOIN},
        [("start", "fork"), ("fork", "a"), ("fork", "b"), ("a", "join"), ("b", "join")],
    )
    resolved = resolve_matched_joins(graph)
    fork = graph.by_key("fork")
    assert fork is not None and fork.matched_join_id is None
    new_fork = resolved.by_key("fork")
    join = graph.by_key("join")
    assert new_fork is not None and join is not None
    assert new_fork.matched_join_id == join.id
    assert resolved is not graph
    assert resolved.edges == graph.edges
    assert resolved.outgoing(fork.id) == graph.outgoing(fork.id)
    assert isinstance(resolved.template_id, uuid.UUID)
