"""Properties over random clusters and asks: never over capacity, the incremental chooser chooses
exactly what a fresh look at every node chooses, and the policies' fast path refuses exactly the
nodes the filter's reasons name."""

from __future__ import annotations

from random import Random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger_core.packing import (
    POLICIES,
    Ask,
    CardState,
    Decision,
    Guard,
    NodeChooser,
    NodeState,
    TypicalPod,
    gpu_ask,
    make_policy,
    place,
)
from gpuledger_core.packing.engine import choose_node
from gpuledger_core.packing.fit import problem
from gpuledger_core.packing.state import UNTRACKED, charge, take

pytestmark = pytest.mark.timeout(30)

MODELS = ("A100", "T4")


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeState]:
    nodes = []
    for n in range(draw(st.integers(1, 5))):
        model = draw(st.sampled_from(MODELS))
        size = draw(st.sampled_from([1, 2, 4, 8]))
        mem = draw(st.sampled_from([UNTRACKED, 16384]))  # UNTRACKED: card memory not accounted (the trace)
        cards = tuple(CardState(i, model, 1000, mem, max(mem, 0)) for i in range(size))
        cpu = draw(st.sampled_from([UNTRACKED, 8000, 32000]))
        nodes.append(NodeState(f"n{n}", cards, None, cpu, 65536, cpu, 65536))
    return nodes


@st.composite
def asks(draw: st.DrawFn) -> Ask:
    count = draw(st.sampled_from([0, 1, 1, 1, 2, 4]))
    core = draw(st.sampled_from([None, 100, 250, 500, 810])) if count == 1 else None
    mem = draw(st.sampled_from([None, 2048, 8192])) if core else None
    models = draw(st.sampled_from([frozenset(), frozenset({"A100"}), frozenset(MODELS)]))
    cpu = draw(st.sampled_from([0, 1000, 4000]))
    return gpu_ask(count, core_milli=core, mem_mib=mem, models=models, cpu_milli=cpu,
                   memory_mib=draw(st.sampled_from([0, 4096, 16384])))  # fmt: skip


TYPICAL = [TypicalPod(1000, 1, 1000), TypicalPod(1000, 1, 500), TypicalPod(4000, 0, 0)]


def commit(node: NodeState, ask: Ask, cards: tuple[int, ...]) -> NodeState:
    after = charge(node, ask.cpu_milli, ask.memory_mib)
    return take(after, cards, ask.core, ask.mem, ask.exclusive) if cards else after


def within_capacity(node: NodeState) -> bool:
    host = (node.cpu_free == UNTRACKED or node.cpu_free >= 0) and node.mem_free >= 0
    cards = all(c.core_free >= 0 and (c.mem_total == UNTRACKED or c.mem_free >= 0) for c in node.cards)
    return host and cards


@settings(max_examples=40, deadline=None)
@given(clusters(), st.lists(asks(), min_size=1, max_size=25), st.sampled_from(POLICIES))
def test_node_chooser_matches_a_fresh_choice_and_never_overfills(
    nodes: list[NodeState], stream: list[Ask], policy_name: str
) -> None:
    policy = make_policy(policy_name, TYPICAL)
    chooser = NodeChooser(list(nodes), policy, None, Random(7))
    fresh = list(nodes)
    rng = Random(7)
    for ask in stream:
        got = chooser.choose(ask)
        want = choose_node(fresh, ask, make_policy(policy_name, TYPICAL), None, rng)
        assert (got is None) == (want is None)
        if got is None or want is None:
            continue
        assert got[0] == want[0]
        assert got[1].cards == want[1].cards
        at, option = got
        node = commit(chooser.nodes[at], ask, option.cards)
        assert within_capacity(node)
        assert len(set(option.cards)) == ask.count
        for p in option.cards:
            assert not ask.models or node.cards[p].model in ask.models
        chooser.update(at, node)
        fresh[at] = node


@settings(max_examples=30, deadline=None)
@given(clusters(), asks())
def test_a_node_with_nothing_left_is_never_chosen(nodes: list[NodeState], ask: Ask) -> None:
    drained = [
        NodeState(n.name, tuple(CardState(c.index, c.model, 0, idle=False) for c in n.cards),
                  None, 0, 0, 0, 0)
        for n in nodes
    ]  # fmt: skip
    needs_something = ask.count or ask.cpu_milli or ask.memory_mib
    found = choose_node(drained, ask, make_policy("default", TYPICAL))
    assert (found is None) == bool(needs_something)


@st.composite
def varied_nodes(draw: st.DrawFn) -> NodeState:
    """A node with some cards busy, its CPU and memory tight or untracked, perhaps stale."""
    (node,) = draw(clusters().map(lambda nodes: nodes[:1]))
    cards = tuple(
        CardState(c.index, c.model, 0, c.mem_total, 0, idle=False) if draw(st.integers(0, 3)) == 0 else c
        for c in node.cards
    )
    cpu = draw(st.sampled_from([UNTRACKED, 0, 1000, 8000, 64000]))
    mem = draw(st.sampled_from([UNTRACKED, 0, 4096, 65536, 1 << 20]))
    return NodeState(node.name, cards, None, cpu, mem, cpu, mem, draw(st.booleans()))


guards = st.none() | st.builds(Guard, st.sampled_from([0, 1000, 4000]), st.sampled_from([0, 4096, 32768]))
cpu_only = st.builds(Ask, st.none(), st.sampled_from([0, 1000, 4000, 16000]), st.sampled_from([0, 4096, 65536]))


@settings(max_examples=400, deadline=None)
@given(varied_nodes(), asks() | cpu_only, guards, st.sampled_from(POLICIES))
def test_the_policies_refuse_exactly_the_nodes_the_filter_names(
    node: NodeState, ask: Ask, guard: Guard | None, policy_name: str
) -> None:
    """One host rule and one card rule: ``place`` (the fast path, no sentence) decides on a node
    exactly when ``problem`` (the filter's reasons) has none, and otherwise gives its reason."""
    found = place([node], ask, make_policy(policy_name, TYPICAL), guard=guard, rng=Random(7))
    why = problem(node, ask, guard)
    assert isinstance(found, Decision) == (why == ""), (found, why)
    if not isinstance(found, Decision):
        assert found.reasons == ((node.name, why),)
