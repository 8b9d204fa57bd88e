"""The pressure that model-constrained pods put on each card model, and ``default`` leaving the
pressed models to them."""

from __future__ import annotations

import pytest

from gpuledger_core.packing import Ask, CardState, Decision, NodeState, TypicalPod, Workload, gpu_ask, place
from gpuledger_core.packing.default import Default
from gpuledger_core.packing.scarcity import Scarcity

pytestmark = pytest.mark.timeout(10)

T4 = frozenset({"T4"})
ANY_POD = TypicalPod(4000, 1, 1000)
T4_POD = TypicalPod(4000, 1, 1000, T4)


def node(name: str, model: str, cards: int = 2) -> NodeState:
    cpu, mem = 64000, 1 << 20
    return NodeState(name, tuple(CardState(i, model) for i in range(cards)), None, cpu, mem, cpu, mem)


def test_pressure_is_constrained_demand_per_card_against_the_workloads() -> None:
    # half the GPU demand is T4-only; T4 holds a quarter of the cards: the T4-only pods want
    # twice the cards there are; nobody presses G2
    workload = Workload(((ANY_POD, 0.5), (T4_POD, 0.5)))
    assert Scarcity.of(workload, {"T4": 2, "G2": 6}).pressure == pytest.approx({"T4": 2.0, "G2": 0.0})


def test_a_pod_of_several_models_spreads_over_them_by_their_cards() -> None:
    either = TypicalPod(4000, 2, 1000, frozenset({"T4", "P100", "A10"}))  # A10 is not in the cluster
    workload = Workload(((ANY_POD, 0.5), (either, 0.5)))  # the pair is 2/3 of the GPU demand
    scarcity = Scarcity.of(workload, {"T4": 1, "P100": 3, "G2": 4})
    assert scarcity.pressure == pytest.approx({"T4": 4 / 3, "P100": 4 / 3, "G2": 0.0})


@pytest.mark.parametrize(
    ("workload", "supply"),
    [
        (Workload(((ANY_POD, 1.0),)), {"T4": 2, "G2": 6}),  # no pod names a model
        (Workload(((T4_POD, 1.0),)), {}),  # the cluster's cards are not known
        (Workload(((T4_POD, 1.0),)), {"G2": 6}),  # no card of its model here
        (Workload(((TypicalPod(4000, 0, 0, T4), 1.0),)), {"T4": 2}),  # wants no card
    ],
)
def test_nothing_is_pressed(workload: Workload, supply: dict[str, int]) -> None:
    scarcity = Scarcity.of(workload, supply)
    assert scarcity == Scarcity()
    assert scarcity.cost(["T4", "T4"], 1000, frozenset()) == 0.0


@pytest.mark.parametrize(
    ("models", "milli", "allowed", "expected"),
    [
        (["T4"], 1000, frozenset(), 2000.0),  # any model will do: G2 is the least pressed
        (["T4", "T4"], 500, frozenset(), 2000.0),
        (["G2"], 1000, frozenset(), 0.0),
        (["T4"], 1000, T4, 0.0),  # a pod with one choice pays nothing
        (["T4"], 1000, frozenset({"T4", "P100"}), 1000.0),  # P100 is pressed 1
        (["V100"], 1000, frozenset(), 0.0),  # a model the count missed: as the least pressed
    ],
)
def test_cost(models: list[str], milli: int, allowed: frozenset[str], expected: float) -> None:
    scarcity = Scarcity({"T4": 2.0, "P100": 1.0, "G2": 0.0})
    assert scarcity.cost(models, milli, allowed) == pytest.approx(expected)


# T4-only pods are few, but T4 cards fewer: fragmentation alone hardly tells the nodes apart
WORKLOAD = Workload(((ANY_POD, 0.95), (T4_POD, 0.05)))
SUPPLY = {"T4": 2, "G2": 198}


def chosen(nodes: list[NodeState], ask: Ask, policy: Default) -> str:
    decision = place(nodes, ask, policy)
    assert isinstance(decision, Decision)
    return decision.node


def test_a_pod_that_may_go_anywhere_leaves_the_pressed_model() -> None:
    nodes = [node("t4", "T4"), node("g2", "G2", 6)]
    anywhere = gpu_ask(1, cpu_milli=4000)
    assert chosen(nodes, anywhere, Default(WORKLOAD, supply=SUPPLY)) == "g2"
    # without the cluster's cards, or without the term, both nodes are alike: node order decides
    assert chosen(nodes, anywhere, Default(WORKLOAD)) == "t4"
    assert chosen(nodes, anywhere, Default(WORKLOAD, supply=SUPPLY, scarcity_weight=0)) == "t4"


def test_a_pod_with_one_model_still_gets_it() -> None:
    nodes = [node("g2", "G2", 6), node("t4", "T4")]
    only_t4 = gpu_ask(1, cpu_milli=4000, models=T4)
    assert chosen(nodes, only_t4, Default(WORKLOAD, supply=SUPPLY)) == "t4"
