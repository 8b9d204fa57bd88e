"""GPU stranded behind a node's CPU and memory, and ``default`` steering around it."""

from __future__ import annotations

import pytest

from gpuledger_core.packing import Ask, CardState, Decision, NodeState, TypicalPod, Workload, gpu_ask, place
from gpuledger_core.packing.balance import Balance
from gpuledger_core.packing.default import Default
from gpuledger_core.packing.state import UNTRACKED

pytestmark = pytest.mark.timeout(10)


def node(name: str, cards: int, cpu: int, mem: int = 1 << 20) -> NodeState:
    return NodeState(name, tuple(CardState(i, "T4") for i in range(cards)), None, cpu, mem, cpu, mem)


def test_proportions_are_the_popularity_weighted_means_of_pods_with_cards() -> None:
    workload = Workload(
        ((TypicalPod(8000, 1, 1000, memory_mib=4000), 0.4), (TypicalPod(2000, 1, 500), 0.4),
         (TypicalPod(32000, 0, 0), 0.2))
    )  # fmt: skip
    balance = Balance.of(workload)
    assert balance.cpu_per_gpu == pytest.approx((0.4 * 8000 + 0.4 * 2000) / (0.4 * 1000 + 0.4 * 500))
    assert balance.mem_per_gpu == pytest.approx(0.4 * 4000 / 600)


def test_no_pod_with_cards_counts_nothing() -> None:
    assert Balance.of(Workload(((TypicalPod(4000, 0, 0), 1.0),))) == Balance(0.0, 0.0)


@pytest.mark.parametrize(
    ("gpu", "cpu", "mem", "expected"),
    [
        (4000, 16000, 1 << 20, 0.0),  # 16 cores serve 4 cards at 4 cores a card
        (4000, 8000, 1 << 20, 2000.0),  # 8 cores serve 2 of 4 cards
        (4000, 0, 1 << 20, 4000.0),
        (4000, 16000, 8192, 2000.0),  # memory is the shorter: 8 GiB serve 2 cards at 4 GiB
        (4000, UNTRACKED, UNTRACKED, 0.0),  # nobody counts: never stranded
        (0, 0, 0, 0.0),
    ],
)
def test_stranded(gpu: int, cpu: int, mem: int, expected: float) -> None:
    assert Balance(4.0, 4.096).stranded(gpu, cpu, mem) == pytest.approx(expected)


def test_growth_is_the_change_a_pod_makes() -> None:
    balance = Balance(4.0, 0.0)
    assert balance.growth(4000, 16000, UNTRACKED, 1000, 4000, 0) == pytest.approx(0.0)
    assert balance.growth(4000, 16000, UNTRACKED, 1000, 12000, 0) == pytest.approx(2000.0)


LIGHT = Workload(((TypicalPod(4000, 1, 1000), 1.0),))


def chosen(nodes: list[NodeState], ask: Ask, policy: Default) -> str:
    decision = place(nodes, ask, policy)
    assert isinstance(decision, Decision)
    return decision.node


def test_a_cpu_heavy_pod_goes_where_cpu_is_plentiful() -> None:
    poor, rich = node("poor", 4, 16000), node("rich", 4, 128000)
    heavy = gpu_ask(1, cpu_milli=12000)
    assert chosen([poor, rich], heavy, Default(LIGHT)) == "rich"
    # without the balance both leave room for the typical pod: node order decides
    assert chosen([poor, rich], heavy, Default(LIGHT, balance_weight=0)) == "poor"


def test_a_light_pod_is_not_pushed_off_a_cpu_poor_node() -> None:
    poor, rich = node("poor", 4, 16000), node("rich", 4, 128000)
    light = gpu_ask(1, cpu_milli=4000)
    assert chosen([poor, rich], light, Default(LIGHT)) == "poor"
