"""The FGD fragmentation measure and the typical-pod workload."""

from __future__ import annotations

import pytest

from gpuledger_core.packing import (
    CardState,
    NodeState,
    TypicalPod,
    Workload,
    WorkloadTracker,
    gpu_ask,
)
from gpuledger_core.packing.fgd import growth
from gpuledger_core.packing.frag import FragMeter, without_memory

pytestmark = pytest.mark.timeout(10)


def node(rooms: list[int], cpu: int = 32000, model: str = "T4", mem: int = 65536) -> NodeState:
    cards = tuple(CardState(i, model, r, idle=r == 1000) for i, r in enumerate(rooms))
    return NodeState("n", cards, None, cpu, mem, cpu, mem)


def meter(*pods: tuple[TypicalPod, float]) -> FragMeter:
    return FragMeter(Workload(pods))


HALF = TypicalPod(1000, 1, 500)
WHOLE = TypicalPod(1000, 1, 1000)
CPU_ONLY = TypicalPod(1000, 0, 0)

CASES = [
    # (rooms, typical pods with popularity, cpu, expected fragmentation)
    ([1000, 1000], [(WHOLE, 1.0)], 32000, 0.0),
    ([1000, 300], [(WHOLE, 1.0)], 32000, 300.0),  # the 300 left can't hold a whole card
    ([1000, 300], [(HALF, 1.0)], 32000, 300.0),
    ([600, 300], [(HALF, 1.0)], 32000, 300.0),
    ([400, 300], [(HALF, 1.0)], 32000, 700.0),  # nothing can host it: all idle GPU is fragment
    ([1000, 1000], [(CPU_ONLY, 1.0)], 32000, 2000.0),  # a CPU pod never uses GPUs
    ([1000, 1000], [(WHOLE, 1.0)], 500, 2000.0),  # not enough CPU to host it
    ([1000, 300], [(WHOLE, 0.5), (HALF, 0.5)], 32000, 300.0),
    ([0, 0], [(WHOLE, 1.0)], 32000, 0.0),
]


@pytest.mark.parametrize(("rooms", "pods", "cpu", "expected"), CASES)
def test_fragmentation(
    rooms: list[int], pods: list[tuple[TypicalPod, float]], cpu: int, expected: float
) -> None:
    assert meter(*pods).node(node(rooms, cpu)) == pytest.approx(expected)


def test_model_constraint_makes_other_models_fragment() -> None:
    only_a100 = TypicalPod(1000, 1, 1000, frozenset({"A100"}))
    assert meter((only_a100, 1.0)).node(node([1000, 1000])) == 2000.0
    assert meter((only_a100, 1.0)).node(node([1000, 1000], model="A100")) == 0.0


def test_memory_counts_only_when_typical_pods_carry_it() -> None:
    big = TypicalPod(1000, 1, 1000, memory_mib=100000)
    assert meter((big, 1.0)).node(node([1000], mem=65536)) == 1000.0
    stripped = without_memory([big])[0]
    assert meter((stripped, 1.0)).node(node([1000], mem=65536)) == 0.0


def test_workload_takes_the_popular_shapes_to_95_percent() -> None:
    pods = [WHOLE] * 60 + [HALF] * 36 + [CPU_ONLY] * 3 + [TypicalPod(5, 1, 10)]
    workload = Workload.of(pods)
    shapes = dict(workload.pods)
    assert set(shapes) == {WHOLE, HALF}  # 96 % covered after two shapes
    assert shapes[WHOLE] == pytest.approx(60 / 96)
    assert sum(shapes.values()) == pytest.approx(1.0)
    assert Workload.of(reversed(pods)) == workload


def test_tracker_keeps_a_sliding_window() -> None:
    tracker = WorkloadTracker(window=3)
    for pod in (WHOLE, WHOLE, HALF, CPU_ONLY):
        tracker.observe(pod)
    assert sorted(tracker.seen(), key=repr) == sorted([WHOLE, HALF, CPU_ONLY], key=repr)
    assert tracker.version == 4


def test_shared_ask_takes_the_card_that_fragments_least() -> None:
    m = meter((HALF, 0.5), (WHOLE, 0.5))
    state = node([1000, 700, 500])
    found = growth(m, state, gpu_ask(1, core_milli=500))
    assert found is not None
    # 500 -> 0 leaves nothing behind; 700 -> 200 or 1000 -> 500 would
    assert found[1] == (2,)
