"""What makes a template graph runnable: the rules S1-S21 a save reports, activation enforces."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from itertools import combinations

from engine.graphs.design.joins import branch_reach, fork_scope, matched_join
from engine.graphs.design.model import NODE_TYPES_WITHOUT_ASSIGNEES, Graph
from engine.graphs.design.problems import (
    GraphCheck,
    Problem,
    Rule,
    fork_branches,
    reachable_from,
    reaching,
)
from engine.graphs.tables import (
    CONDITION,
    END,
    FORK,
    JOIN,
    NODE_TYPES,
    START,
    STATE,
    SUBMITTERS,
    THRESHOLDS,
)

CONDITION_RESULTS = ("false", "true")  # sorted: what a condition's edges must carry


def validate_graph(graph: Graph, conditions: Collection[str]) -> list[Problem]:
    """Every problem of `graph`, in code order then node order; empty when it can run.

    Each rule has a stable code; a problem reads `"S16: 'Closed' has no assignees. ..."`.

    =====  ==================================================================
    Code   Rule
    =====  ==================================================================
    S1     the graph has exactly one START node (none, or several)
    S2     START has exactly one outgoing transition
    S3     START's transition leads to a state or a condition
    S4     a node cannot be reached from START
    S5     the graph has no END node
    S6     a node's type is not one of start/state/condition/fork/join/end
    S7     a state has no state code, or one not in the template's vocabulary;
           an END names a final state code that is not in it
    S8     a state, condition or join has no outgoing transition, or a
           non-END node cannot reach any END (a dead end)
    S9     a fork has fewer than two outgoing transitions, or no matched join,
           or a matched join that is not a join node of this graph
    S10    a condition does not have exactly one "true" and one "false" edge,
           or an edge leaving a non-condition node carries a condition result
    S11    a join is not matched by exactly one fork (none, or several)
    S12    fork scopes do not nest and are not disjoint
    S13    a branch of a fork can reach neither its matched join nor an END
    S14    a branch of a fork reaches a join other than its fork's matched
           join (leaving its scope) before its own
    S15    a condition has no predicate, or names one that is not registered;
           an edge's manual guard names an unregistered predicate
    S16    a state has no assignees (users or groups)
    S17    an approval threshold is not single/majority/unanimous
    S18    a start, condition, fork, join or end node has assignees
    S19    a join does not have exactly one outgoing transition
    S20    a state with a deadline has not exactly one escalation edge, or the
           deadline is not positive; an escalation edge leaves a node that is
           not a state with a deadline
    S21    who may submit is not any, owner or a role (viewer, operator,
           designer, admin)
    =====  ==================================================================

    Problems come in code order, then node order. Rules do not pile on: a rule
    that needs what another rule checks (a START, an END, a fork's matched join)
    says nothing when it is missing, and a node with no outgoing transition is
    reported by the rule of its type, not again as a dead end.
    """
    check = GraphCheck(graph, conditions)
    return [problem for _, rule in RULES for problem in rule(check)]


# S1-S5: the graph's frame.


def _one_start(check: GraphCheck) -> Iterator[Problem]:
    starts = check.graph.of_type(START)
    if not starts:
        yield check.problem("S1", "The graph has no START node. Add one where instances begin.")
    elif len(starts) > 1:
        names = ", ".join(repr(n.title) for n in starts)
        yield check.problem(
            "S1",
            f"The graph has {len(starts)} START nodes ({names}). Keep exactly one.",
            starts[1].id,
        )


def _start_has_one_transition(check: GraphCheck) -> Iterator[Problem]:
    for start in check.graph.of_type(START):
        count = len(check.graph.outgoing(start.id))
        if count != 1:
            yield check.problem(
                "S2",
                f"{start.title!r} has {count} outgoing transitions. "
                "Give it exactly one, to the first state or condition.",
                start.id,
            )


def _start_leads_to_state_or_condition(check: GraphCheck) -> Iterator[Problem]:
    for start in check.graph.of_type(START):
        for edge in check.graph.outgoing(start.id):
            target = check.graph.nodes.get(edge.target_id)
            if target is None or target.node_type not in (STATE, CONDITION):
                yield check.problem(
                    "S3",
                    f"{start.title!r} leads to {check.title(edge.target_id)}, "
                    "which is not a state or a condition. Start at a state or a condition.",
                    start.id,
                )


def _reachable_from_start(check: GraphCheck) -> Iterator[Problem]:
    starts = check.graph.of_type(START)
    if not starts:
        return  # S1 says so
    reached = reachable_from(check.graph, [s.id for s in starts])
    for node in check.nodes():
        if node.id not in reached:
            yield check.problem(
                "S4",
                f"{node.title!r} cannot be reached from START. Connect it, or remove it.",
                node.id,
            )


def _has_end(check: GraphCheck) -> Iterator[Problem]:
    if not check.graph.of_type(END):
        yield check.problem("S5", "The graph has no END node. Add one where instances finish.")


# S6-S8: each node on its own.


def _known_type(check: GraphCheck) -> Iterator[Problem]:
    for node in check.nodes():
        if node.node_type not in NODE_TYPES:
            yield check.problem(
                "S6",
                f"{node.title!r} has the type {node.node_type!r}, which is not one of "
                f"{', '.join(NODE_TYPES)}.",
                node.id,
            )


def _state_code_in_vocabulary(check: GraphCheck) -> Iterator[Problem]:
    for state in check.graph.of_type(STATE):
        if not state.state_code:
            yield check.problem(
                "S7",
                f"{state.title!r} has no state code. "
                "Pick one from the template's state vocabulary.",
                state.id,
            )
        elif state.state_code not in check.graph.state_choices:
            yield check.problem(
                "S7",
                f"{state.title!r} has the state code {state.state_code!r}, which is not "
                "in the template's state vocabulary.",
                state.id,
            )

    # An END may name the code its subject ends with: one of the vocabulary's.
    for end in check.graph.of_type(END):
        if end.state_code and end.state_code not in check.graph.state_choices:
            yield check.problem(
                "S7",
                f"{end.title!r} ends with the state code {end.state_code!r}, which is not "
                "in the template's state vocabulary.",
                end.id,
            )


def _no_dead_end(check: GraphCheck) -> Iterator[Problem]:
    ends = check.graph.of_type(END)
    to_end = reaching(check.graph, [e.id for e in ends])
    for node in check.nodes():
        if node.node_type == END:
            continue
        if not check.graph.outgoing(node.id):
            # Starts, forks and unknown types without transitions have rules of their own.
            if node.node_type in (STATE, CONDITION, JOIN):
                yield check.problem(
                    "S8",
                    f"{node.title!r} has no outgoing transition. "
                    "Add one, so instances can leave it.",
                    node.id,
                )
        elif ends and node.id not in to_end:  # with no END at all, S5 says so once
            yield check.problem(
                "S8",
                f"{node.title!r} cannot reach any END. Add a way out of it toward an END.",
                node.id,
            )


# S9-S14: forks, conditions and joins.


def _fork_is_well_formed(check: GraphCheck) -> Iterator[Problem]:
    for fork in check.graph.of_type(FORK):
        count = len(check.graph.outgoing(fork.id))
        if count < 2:
            yield check.problem(
                "S9",
                f"{fork.title!r} has {count} outgoing transition{'s' if count != 1 else ''}. "
                "A fork needs at least two, one per branch.",
                fork.id,
            )
        if fork.matched_join_id is None:
            yield check.problem(
                "S9",
                f"{fork.title!r} has no matched join. "
                "Bring all its branches to one join (or to an END).",
                fork.id,
            )
        elif matched_join(check.graph, fork) is None:
            yield check.problem(
                "S9",
                f"{fork.title!r} is matched to a node that is not a join of this graph. "
                "Match it to the join that closes its branches.",
                fork.id,
            )


def _condition_has_true_and_false(check: GraphCheck) -> Iterator[Problem]:
    for node in check.nodes():
        edges = check.graph.outgoing(node.id)
        if node.node_type == CONDITION:
            results = sorted(edge.condition_result or "no result" for edge in edges)
            if tuple(results) != CONDITION_RESULTS:
                yield check.problem(
                    "S10",
                    f"{node.title!r} needs exactly two transitions, one 'true' and one "
                    f"'false'; it has {len(edges)} ({', '.join(results) or 'none'}).",
                    node.id,
                )
            continue
        for edge in edges:
            if edge.condition_result:
                yield check.problem(
                    "S10",
                    f"{check.transition(edge)} carries the condition result "
                    f"{edge.condition_result!r}, but only a condition's transitions may. "
                    "Clear it.",
                    node.id,
                )


def _join_matched_once(check: GraphCheck) -> Iterator[Problem]:
    forks = check.graph.of_type(FORK)
    for join in check.graph.of_type(JOIN):
        matching = [f for f in forks if f.matched_join_id == join.id]
        if not matching:
            yield check.problem(
                "S11",
                f"{join.title!r} is not matched by any fork. "
                "Remove it, or draw the fork whose branches it closes.",
                join.id,
            )
        elif len(matching) > 1:
            names = ", ".join(repr(f.title) for f in matching)
            yield check.problem(
                "S11",
                f"{join.title!r} is matched by {len(matching)} forks ({names}). "
                "Give each fork a join of its own.",
                join.id,
            )


def _scopes_nest(check: GraphCheck) -> Iterator[Problem]:
    scoped = [
        (fork, scope)
        for fork in check.graph.of_type(FORK)
        if (scope := fork_scope(check.graph, fork))
    ]
    for (first, first_scope), (second, second_scope) in combinations(scoped, 2):
        shared = first_scope & second_scope
        if shared and not (first_scope <= second_scope or second_scope <= first_scope):
            yield check.problem(
                "S12",
                f"The scopes of {first.title!r} and {second.title!r} overlap without one "
                "containing the other. Close an inner fork's branches before its outer "
                "fork's join.",
                second.id,
            )


def _branch_reaches_join_or_end(check: GraphCheck) -> Iterator[Problem]:
    for fork, join, edge in fork_branches(check.graph):
        reach = branch_reach(check.graph, fork, edge)
        # Reaching another join is S14's problem; here the branch goes nowhere.
        if not reach.joins and not reach.reaches_end:
            yield check.problem(
                "S13",
                f"The branch of {fork.title!r} to {check.title(edge.target_id)} can reach "
                f"neither its join {join.title!r} nor an END without going back through "
                "the fork. Lead it to the join or to an END.",
                fork.id,
            )


def _branch_stays_in_scope(check: GraphCheck) -> Iterator[Problem]:
    for fork, join, edge in fork_branches(check.graph):
        reach = branch_reach(check.graph, fork, edge)
        others = [check.graph.nodes[j] for j in reach.joins if j != join.id]
        if others:
            names = ", ".join(repr(n.title) for n in sorted(others, key=lambda n: (n.order, n.key)))
            yield check.problem(
                "S14",
                f"The branch of {fork.title!r} to {check.title(edge.target_id)} reaches "
                f"{names} before its own join {join.title!r}. "
                "A branch must stay in its fork's scope.",
                fork.id,
            )


# S15-S20: what people and predicates a node names.


def _predicates_registered(check: GraphCheck) -> Iterator[Problem]:
    for node in check.nodes():
        if node.node_type == CONDITION:
            if not node.condition:
                yield check.problem(
                    "S15",
                    f"{node.title!r} names no predicate. Pick a registered one.",
                    node.id,
                )
            elif node.condition not in check.conditions:
                yield check.problem(
                    "S15",
                    f"{node.title!r} names the predicate {node.condition!r}, "
                    "which is not registered.",
                    node.id,
                )
        for edge in check.graph.outgoing(node.id):
            if edge.condition and edge.condition not in check.conditions:
                yield check.problem(
                    "S15",
                    f"{check.transition(edge)} is guarded by the predicate "
                    f"{edge.condition!r}, which is not registered.",
                    node.id,
                )


def _state_has_assignees(check: GraphCheck) -> Iterator[Problem]:
    for state in check.graph.of_type(STATE):
        if not state.has_assignees:
            yield check.problem(
                "S16",
                f"{state.title!r} has no assignees. "
                "Name at least one user or group who may move this state.",
                state.id,
            )


def _threshold_known(check: GraphCheck) -> Iterator[Problem]:
    for node in check.nodes():
        if node.approval_threshold not in THRESHOLDS:
            yield check.problem(
                "S17",
                f"{node.title!r} has the approval threshold {node.approval_threshold!r}. "
                f"Use one of {', '.join(THRESHOLDS)}.",
                node.id,
            )


def _only_states_have_assignees(check: GraphCheck) -> Iterator[Problem]:
    for node in check.nodes():
        if node.node_type in NODE_TYPES_WITHOUT_ASSIGNEES and node.has_assignees:
            yield check.problem(
                "S18",
                f"{node.title!r} is a {node.node_type} and has assignees. "
                "Only states are moved by people: remove them.",
                node.id,
            )


def _join_has_one_transition(check: GraphCheck) -> Iterator[Problem]:
    for join in check.graph.of_type(JOIN):
        count = len(check.graph.outgoing(join.id))
        if count != 1:
            yield check.problem(
                "S19",
                f"{join.title!r} has {count} outgoing transitions. "
                "A join continues automatically, so it needs exactly one.",
                join.id,
            )


def _deadline_escalates(check: GraphCheck) -> Iterator[Problem]:
    for node in check.nodes():
        escalations = [e for e in check.graph.outgoing(node.id) if e.escalation]
        has_deadline = node.node_type == STATE and node.deadline_seconds is not None
        if not has_deadline:
            for edge in escalations:
                yield check.problem(
                    "S20",
                    f"{check.transition(edge)} is an escalation, but {node.title!r} is not "
                    "a state with a deadline. Give the state a deadline, or clear the "
                    "escalation.",
                    node.id,
                )
            continue
        if node.deadline_seconds is not None and node.deadline_seconds <= 0:
            yield check.problem(
                "S20",
                f"{node.title!r} has a deadline of {node.deadline_seconds} seconds. "
                "A deadline must be positive.",
                node.id,
            )
        if len(escalations) != 1:
            yield check.problem(
                "S20",
                f"{node.title!r} has a deadline and {len(escalations)} escalation "
                "transitions. Give it exactly one, taken when the deadline passes.",
                node.id,
            )


def _submitters_known(check: GraphCheck) -> Iterator[Problem]:
    if check.graph.submitters not in SUBMITTERS:
        yield check.problem(
            "S21",
            f"Who may submit is {check.graph.submitters!r}: say one of {', '.join(SUBMITTERS)}.",
        )


RULES: tuple[tuple[str, Rule], ...] = (
    ("S1", _one_start),
    ("S2", _start_has_one_transition),
    ("S3", _start_leads_to_state_or_condition),
    ("S4", _reachable_from_start),
    ("S5", _has_end),
    ("S6", _known_type),
    ("S7", _state_code_in_vocabulary),
    ("S8", _no_dead_end),
    ("S9", _fork_is_well_formed),
    ("S10", _condition_has_true_and_false),
    ("S11", _join_matched_once),
    ("S12", _scopes_nest),
    ("S13", _branch_reaches_join_or_end),
    ("S14", _branch_stays_in_scope),
    ("S15", _predicates_registered),
    ("S16", _state_has_assignees),
    ("S17", _threshold_known),
    ("S18", _only_states_have_assignees),
    ("S19", _join_has_one_transition),
    ("S20", _deadline_escalates),
    ("S21", _submitters_known),
)
