"""The fragmentation the dashboard shows is the ``default`` policy's own measure."""

from __future__ import annotations

from gpuledger_core.fragmentation import allocation_ask, ledger_meter, node_fragmentation
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, AllocState, Grant, Owner, OwnerKind, Request
from gpuledger_core.packing import from_ledger, make_policy, typical
from gpuledger_core.packing.default import Default
from tests.unit.core.builders import NODE, ledger, share


def held(name: str, request: Request, *shares: int, state: AllocState = AllocState.BOUND) -> Allocation:
    grants = (Grant("main", tuple(share(i, mem) for i, mem in enumerate(shares) if mem)),)
    owner = Owner(OwnerKind.POD, f"uid-{name}", "ns", name)
    return Allocation(AllocationId(name), owner, NODE, grants, state, requests=(request,))


def test_no_live_allocation_means_no_workload_and_no_fragment() -> None:
    empty = ledger(8000, 8000)
    frag = node_fragmentation(ledger_meter([empty]), empty)
    assert (frag.milli, frag.free_milli, frag.share) == (0.0, 2000, 0.0)


def test_whole_card_pods_find_half_used_cards_all_fragment() -> None:
    base = ledger(8000, 8000, 8000)
    whole = held("w", Request(count=1), 8000)  # the workload: whole cards
    tool = Grant("", (share(1, 4000), share(2, 4000)))  # written without its requests: no shape
    half = Allocation(AllocationId("t"), Owner(OwnerKind.TOOL, "t"), NODE, (tool,), AllocState.BOUND)
    node = NodeLedger(base.node, (whole, half))
    frag = node_fragmentation(ledger_meter([node]), node)
    assert frag.free_milli == 1000  # cards 1 and 2 have half a card each
    assert frag.milli == 1000.0 and frag.share == 1.0  # no whole card free, and every typical pod is whole


def test_the_measure_is_the_default_policys() -> None:
    base = ledger(8000, 8000, 8000, 8000)
    allocations = (
        held("a", Request(count=1, mem_mib=2000), 2000),
        held("b", Request(count=1, mem_mib=6000), 0, 6000),
        held("c", Request(count=2), 0, 0, 8000, 8000),
    )
    node = NodeLedger(base.node, allocations)
    asks = [ask for a in allocations if (ask := allocation_ask(a)) is not None]
    policy = make_policy("default", [typical(ask, 8000) for ask in asks])
    assert isinstance(policy, Default)
    assert node_fragmentation(ledger_meter([node]), node).milli == policy.meter.node(from_ledger(node))


def test_an_allocation_without_its_requests_or_released_has_no_shape() -> None:
    unknown = Allocation(AllocationId("x"), Owner(OwnerKind.TOOL, "t"), NODE, (Grant("", (share(0, 10),)),))
    assert allocation_ask(unknown) is None
    assert allocation_ask(held("r", Request(count=1), 8000, state=AllocState.RELEASED)) is None
    assert allocation_ask(held("l", Request(count=1), 8000)) is not None


def test_a_mixed_workload_weighs_each_typical_pod_by_how_often_it_is_seen() -> None:
    base = ledger(8000, 8000, 8000)
    whole = held("w", Request(count=1), 8000)
    half = held("h", Request(count=1, mem_mib=4000), 0, 4000)
    node = NodeLedger(base.node, (whole, half))
    frag = node_fragmentation(ledger_meter([node]), node)
    # free: half of card 1 and all of card 2 (1500); whole-card pods (half the workload) cannot use
    # card 1's half; half-card pods can use everything
    assert (frag.free_milli, frag.milli) == (1500, 250.0)
