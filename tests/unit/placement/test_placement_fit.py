"""Whether an ask fits a node, and the reasons people read when it does not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuledger_core.packing import Ask, CardState, Guard, NodeState, gpu_ask
from gpuledger_core.packing.fit import card_takes, problem

pytestmark = pytest.mark.timeout(10)


def node(*cards: CardState, cpu: int = 32000, mem: int = 131072, stale: bool = False) -> NodeState:
    return NodeState("n1", cards, None, cpu, mem, cpu, mem, stale)


def idle(index: int, model: str = "A100", mem: int = 40960) -> CardState:
    return CardState(index, model, 1000, mem, mem)


def used(index: int, core_free: int, mem_free: int, model: str = "A100") -> CardState:
    return CardState(index, model, core_free, 40960, mem_free, idle=False)


def slotted(card: CardState, free: int) -> CardState:
    return replace(card, slots_free=free)


CASES = [
    ("fits", node(idle(0)), gpu_ask(1), ""),
    ("stale", node(idle(0), stale=True), gpu_ask(1), "stale"),
    ("stale gets no cpu pod either", node(idle(0), stale=True), Ask(None, 100), "stale"),
    ("cpu", node(idle(0), cpu=1000), gpu_ask(1, cpu_milli=1500), "1000m CPU free, 500m short"),
    (
        "memory",
        node(idle(0), mem=1024),
        gpu_ask(1, memory_mib=4096),
        "1024 MiB memory free, 3072 MiB short of 4096 MiB",
    ),
    ("model", node(idle(0, "T4")), gpu_ask(1, models=frozenset({"A100"})), "no card of model A100"),
    ("model ok", node(idle(0, "T4")), gpu_ask(1, models=frozenset({"A100", "T4"})), ""),
    (
        "health",
        node(replace(idle(0), healthy=False), idle(1)),
        gpu_ask(2),
        "1 healthy card(s) of the 2 needed",
    ),
    ("exclusive", node(used(0, 500, 20000), idle(1)), gpu_ask(2), "1 free whole card(s)"),
    (
        "card memory",
        node(used(0, 900, 512), used(1, 900, 1024), used(2, 900, 800)),
        gpu_ask(1, mem_mib=2560),
        "card 1 has 1024 MiB free, 1536 MiB short of 2560 MiB",
    ),
    (
        "card compute",
        node(used(0, 200, 20000)),
        gpu_ask(1, core_milli=300),
        "card 0 has 20% compute free, 10% short of 30%",
    ),
    ("shared fits", node(used(0, 300, 20000)), gpu_ask(1, core_milli=300, mem_mib=20000), ""),
    ("cpu only", node(), Ask(None, 1000, 1024), ""),
    ("a free slot", node(slotted(used(0, 900, 40000), 1)), gpu_ask(1, core_milli=10), ""),
    (
        "slots used up",
        node(slotted(used(0, 900, 40000), 0), slotted(used(1, 900, 40000), 0)),
        gpu_ask(1, core_milli=10),
        "slots used up: 2 card(s) have every kubelet slot held, 0 card(s) with a free slot of the 1 needed",
    ),
    (
        "slots used up on one of two",
        node(slotted(used(0, 900, 40000), 0), slotted(idle(1), 8)),
        gpu_ask(2, core_milli=10),
        "slots used up: 1 card(s) have every kubelet slot held, 1 card(s) with a free slot of the 2 needed",
    ),
    (
        "the card with slots lacks memory",
        node(slotted(used(0, 900, 40000), 0), slotted(used(1, 900, 100), 3)),
        gpu_ask(1, mem_mib=1000),
        "card 1 has 100 MiB free, 900 MiB short of 1000 MiB; 1 other card(s) have every kubelet slot held",
    ),
    ("slots not counted", node(used(0, 900, 40000)), gpu_ask(1, core_milli=10), ""),
    (
        "a card of unknown memory size",
        node(CardState(0, "A100", 1000, 0, 0)),
        gpu_ask(1, mem_mib=500),
        "card 0 has 0 MiB free, 500 MiB short of 500 MiB",
    ),
    ("a card of unknown size, compute only", node(CardState(0, "A100", 1000, 0, 0)), gpu_ask(1, core_milli=10), ""),
    ("card memory not counted (the trace)", node(CardState(0, "A100")), gpu_ask(1, mem_mib=500), ""),
]


@pytest.mark.parametrize(
    ("card", "ask", "takes"),
    [
        (slotted(used(0, 900, 40000), 0), gpu_ask(1, core_milli=10), False),
        (slotted(used(0, 900, 40000), 1), gpu_ask(1, core_milli=10), True),
        (used(0, 900, 40000), gpu_ask(1, core_milli=10), True),  # UNTRACKED: the trace counts no slots
        (slotted(idle(0), 8), gpu_ask(1), True),
    ],
)
def test_a_card_without_a_free_slot_takes_no_new_holder(card: CardState, ask: Ask, takes: bool) -> None:
    assert card_takes(card, ask) is takes
    assert (card.room > 0) is takes  # and has no room left for the fragmentation measures


@pytest.mark.parametrize(("case", "state", "ask", "expected"), CASES, ids=[c[0] for c in CASES])
def test_problem(case: str, state: NodeState, ask: Ask, expected: str) -> None:
    why = problem(state, ask)
    if expected:
        assert expected in why
    else:
        assert why == ""


def test_guard_keeps_cpu_and_memory_for_free_cards() -> None:
    state = node(idle(0), idle(1), cpu=20000, mem=100000)
    guard = Guard(cpu_per_card=8000, mem_per_card=32768)
    assert problem(state, Ask(None, 4000, 1024), guard) == ""
    assert "CPU left would be 3000m, below the 16000m" in problem(state, Ask(None, 17000), guard)
    assert "memory left" in problem(state, Ask(None, 1000, 40000), guard)
    assert problem(state, gpu_ask(1, cpu_milli=17000), guard) == ""  # GPU pods are not held back


def test_guard_counts_partly_used_cards() -> None:
    state = node(used(0, 500, 20480), cpu=10000)
    guard = Guard(cpu_per_card=8000, mem_per_card=0)
    assert problem(state, Ask(None, 6000), guard) == ""  # keeps 4000m for half a card
    assert "below the 4000m" in problem(state, Ask(None, 6500), guard)
