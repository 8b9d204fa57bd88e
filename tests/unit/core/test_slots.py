"""Counting kubelet slots: what each holder takes, what a node state shows, and fit honouring it."""

from __future__ import annotations

import pytest

from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, release
from gpuledger_core.model import Allocation, Grant, Owner, OwnerKind, Request
from gpuledger_core.packing import from_ledger
from gpuledger_core.packing.state import UNTRACKED
from gpuledger_core.slots import assign_device_ids, device_id, slot_problem, slots_held, slots_taken

from .builders import NODE, holding, ledger, share, uuid_of


def tool(allocation_id: str, *grants: Grant) -> Allocation:
    return Allocation(AllocationId(allocation_id), Owner(OwnerKind.TOOL, allocation_id), NODE, grants)


def ids(*pairs: tuple[int, int]) -> tuple[str, ...]:
    return tuple(device_id(uuid_of(card), slot) for card, slot in pairs)


@pytest.mark.parametrize(
    ("allocation", "taken"),
    [
        (holding("a", share(0, 10), share(1, 10)), {0: 1, 1: 1}),  # planned, no IDs yet: one per card
        (tool("t", Grant("", (share(0, 10),)), Grant("", (share(0, 10),))), {0: 2}),  # two containers, one card
        (tool("t", Grant("i", (share(0, 10),), init=True), Grant("a", (share(0, 10),))), {0: 1}),  # init reuses
        (tool("t", Grant("i", (share(0, 10),), init=True)), {0: 1}),
        (tool("t", Grant("i", (share(0, 10),), init=True), Grant("j", (share(0, 10),), init=True)), {0: 2}),
        (
            Allocation(
                AllocationId("p"),
                Owner(OwnerKind.POD, "p"),
                NODE,
                (
                    Grant("i", (share(0, 10),), init=True, device_ids=ids((0, 0))),
                    Grant("a", (share(0, 10),), device_ids=ids((0, 0))),
                    Grant("b", (share(0, 10),), device_ids=ids((0, 1))),
                ),
            ),
            {0: 2},  # device IDs say it: the init container's is the app's
        ),
    ],
)
def test_what_one_allocation_takes(allocation: Allocation, taken: dict[int, int]) -> None:
    assert slots_taken(allocation) == {uuid_of(card): n for card, n in taken.items()}


def test_released_allocations_hold_no_slot_and_the_state_counts_free_slots() -> None:
    state = ledger(8000, 8000)
    for n in range(3):
        state = NodeLedger(state.node, (*state.allocations, holding(f"a{n}", share(0, 10))))
    state = release(state, AllocationId("a0"), now=1.0)
    assert slots_held(state.allocations) == {uuid_of(0): 2}
    assert [c.slots_free for c in from_ledger(state, slots_per_card=3).cards] == [1, 3]
    assert [c.slots_free for c in from_ledger(state, slots_per_card=2).cards] == [0, 2]
    assert [c.slots_free for c in from_ledger(state).cards] == [UNTRACKED, UNTRACKED]


def test_a_tools_holder_takes_a_slot_kubelet_cannot_give_a_pod() -> None:
    state = NodeLedger(ledger(8000).node, (tool("t", Grant("", (share(0, 10),))),))
    pod = holding("p", share(0, 10))
    assert slot_problem(state, pod, 2) == ""
    assert "card 0 (GPU-0000) on node-a has all 1 slots taken (slots used up)" in slot_problem(state, pod, 1)
    with pytest.raises(Exhausted, match="slots used up"):
        assign_device_ids(state, pod, 1)


@pytest.mark.parametrize(
    ("holders", "asks", "slots", "chosen"),
    [
        (2, [Request(1, mem_mib=10)], 2, [[1]]),  # card 0 has the tighter fit but no slot
        (1, [Request(1, mem_mib=10)], 2, [[0]]),
        (2, [Request(1, mem_mib=10)], None, [[0]]),  # slots not counted
        (1, [Request(1, mem_mib=10), Request(1, mem_mib=10)], 2, [[0], [1]]),  # the second app has no slot on 0
    ],
)
def test_fit_node_passes_over_cards_whose_slots_are_held(
    holders: int, asks: list[Request], slots: int | None, chosen: list[list[int]]
) -> None:
    state = ledger(8000, 8000)
    held = tuple(holding(f"a{n}", share(0, 10)) for n in range(holders))
    state = NodeLedger(state.node, held)
    grants = fit_node(state, [ContainerAsk(f"c{n}", r) for n, r in enumerate(asks)], slots)
    assert [[s.index for s in g.cards] for g in grants] == chosen


def test_fit_node_says_the_slots_are_used_up() -> None:
    state = NodeLedger(ledger(8000).node, (holding("a", share(0, 10)),))
    with pytest.raises(Exhausted, match="slots used up: 1 card\\(s\\) have every kubelet slot held"):
        fit_node(state, [ContainerAsk("c", Request(1, mem_mib=10))], 1)
