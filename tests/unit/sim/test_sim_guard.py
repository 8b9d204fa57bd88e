"""The dominant-resource guard in the replay: a CPU-only pod that would strand cards is refused."""

from __future__ import annotations

from random import Random

import pytest

from gpuledger_core.packing import Guard
from gpuledger_sim.replay import Config, arrival_order, replay
from gpuledger_sim.trace import TraceNode, TracePod

pytestmark = pytest.mark.timeout(20)

NODES = [TraceNode("n1", 16000, 65536, 2, "A")]
PODS = [
    TracePod("cpu-only", 12000, 4096, 0, 0),
    TracePod("gpu-a", 8000, 4096, 1, 1000),
    TracePod("gpu-b", 8000, 4096, 1, 1000),
]


def seed_with_cpu_pod_first() -> int:
    for seed in range(100):
        if arrival_order(PODS, Random(seed), 0, 2000)[0].name == "cpu-only":
            return seed
    raise AssertionError("no seed puts the CPU-only pod first")


def test_guard_in_the_traces_proportions_is_8_cores_a_card() -> None:
    seed = seed_with_cpu_pod_first()
    ran = replay(NODES, PODS, Config("default", seed, 0, guard_auto=True))
    assert ran.unallocated_gpu_pct_at_100 == 0.0
    assert ran.failed == 1 and ran.failed_gpu_pods == 0  # the CPU-only pod waits


def test_without_the_guard_the_cpu_only_pod_strands_both_cards() -> None:
    seed = seed_with_cpu_pod_first()
    ran = replay(NODES, PODS, Config("default", seed, 0))
    assert ran.unallocated_gpu_pct_at_100 == 100.0


def test_a_weak_guard_lets_it_through() -> None:
    seed = seed_with_cpu_pod_first()
    ran = replay(NODES, PODS, Config("default", seed, 0, Guard(2000, 0)))
    assert ran.unallocated_gpu_pct_at_100 == 100.0


def test_proportional() -> None:
    assert Guard.proportional(8.0, 4.096) == Guard(8000, 4096)
