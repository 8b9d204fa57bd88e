"""Isolation tiers in fit: an ``mps`` tenant and a ``none`` tenant never share a card unless
``mix_isolation`` allows it, in every fit (the allocator's, placement's, the replay's) and in the
ledger's ``reserve`` itself."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk, Tier, fit_node
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, Grant, Isolation, Owner, OwnerKind, Request
from gpuledger_core.packing import filter_nodes, from_ledger, gpu_ask, make_policy, place
from gpuledger_core.packing.api import Decision
from gpuledger_core.packing.state import take
from gpuledger_core.pods import PodAsk, reserve_pod
from gpuledger_core.usage import node_use, tier_problem

from .builders import NODE, allocation, ledger, share

MPS, NONE = Isolation.MPS, Isolation.NONE


def _holding(ledger_: NodeLedger, name: str, tier: Isolation, *cards: int, mem: int = 1000) -> NodeLedger:
    held = replace(allocation(name, Grant("main", tuple(share(c, mem, 100) for c in cards))), isolation=tier)
    return reserve(ledger_, held, mix_isolation=True)


@pytest.mark.parametrize(
    ("held", "tier", "mix", "refused"),
    [
        (frozenset(), MPS, False, False),  # an idle card takes anyone
        (frozenset({MPS}), MPS, False, False),
        (frozenset({NONE}), NONE, False, False),
        (frozenset({NONE}), MPS, False, True),
        (frozenset({MPS}), NONE, False, True),
        (frozenset({MPS, NONE}), MPS, False, True),  # already mixed (mix was on once): still no
        (frozenset({MPS}), NONE, True, False),
        (frozenset({NONE}), MPS, True, False),
    ],
)
def test_the_rule(held: frozenset[Isolation], tier: Isolation, mix: bool, refused: bool) -> None:
    problem = tier_problem(held, tier, mix)
    assert bool(problem) is refused
    if refused:
        assert problem.startswith(f"isolation {tier.value} does not share a card with ")
        assert "mix_isolation is off" in problem


SHARED = Request(1, mem_mib=1000, core_milli=100)


@pytest.mark.parametrize(
    ("tier", "mix", "card"),
    [
        (NONE, False, 0),  # joins the none tenant on card 0
        (MPS, False, 1),  # joins the mps tenant on card 1
        (MPS, True, 0),  # mixing allowed: the tightest fit, card 0 (fuller than card 1)
    ],
)
def test_the_allocators_fit_keeps_tiers_apart(tier: Isolation, mix: bool, card: int) -> None:
    node = _holding(_holding(ledger(8000, 8000, 8000), "n", NONE, 0, mem=3000), "m", MPS, 1)
    (grant,) = fit_node(node, [ContainerAsk("c", SHARED)], tier=Tier(tier, mix))
    assert [s.index for s in grant.cards] == [card]


def test_the_allocators_fit_says_why_when_only_the_other_tier_has_room() -> None:
    node = _holding(ledger(8000), "n", NONE, 0)
    with pytest.raises(Exhausted, match=r"1 card\(s\) held by another isolation tier \(isolation mps does not"):
        fit_node(node, [ContainerAsk("c", SHARED)], tier=Tier(MPS))
    assert fit_node(node, [ContainerAsk("c", SHARED)], tier=Tier(MPS, mix=True))


def test_an_exclusive_ask_is_untouched_by_tiers() -> None:
    node = _holding(ledger(8000, 8000), "n", NONE, 0)
    (grant,) = fit_node(node, [ContainerAsk("c", Request(1))], tier=Tier(MPS))
    assert [s.index for s in grant.cards] == [1]


def test_reserve_refuses_a_mixed_card_whoever_chose_it() -> None:
    node = _holding(ledger(8000), "n", NONE, 0)
    mps = replace(allocation("m", Grant("main", (share(0, 1000, 100),))), isolation=MPS)
    with pytest.raises(Exhausted, match=r"card 0 \(GPU-0000\) on node-a: isolation mps does not share"):
        reserve(node, mps)
    assert reserve(node, mps, mix_isolation=True).get(AllocationId("m")) is not None


@pytest.mark.parametrize(("mix", "expected"), [(False, 1), (True, 0)])
def test_placement_chooses_a_card_of_its_tier(mix: bool, expected: int) -> None:
    node = _holding(_holding(ledger(8000, 8000), "n", NONE, 0, mem=3000), "m", MPS, 1)
    state = from_ledger(node, mix_isolation=mix)
    found = place([state], gpu_ask(1, mem_mib=1000, core_milli=100, isolation=MPS), make_policy("bestfit"))
    assert isinstance(found, Decision) and found.cards == (expected,)


def test_placement_filter_names_the_tier() -> None:
    state = from_ledger(_holding(ledger(8000), "n", NONE, 0))
    fits, failed = filter_nodes([state], gpu_ask(1, mem_mib=1000, core_milli=100, isolation=MPS))
    assert fits == ()
    assert failed[NODE] == (
        "1 card(s) held by another isolation tier (isolation mps does not share a card with none tenants "
        "(mix_isolation is off)), 0 card(s) of the 1 needed"
    )
    ok, _ = filter_nodes([state], gpu_ask(1, mem_mib=1000, core_milli=100, isolation=NONE))
    assert ok == (NODE,)


def test_the_binders_transition_keeps_tiers_apart_even_with_a_stale_hint() -> None:
    node = _holding(ledger(8000, 8000), "n", NONE, 0)
    pod = PodAsk(Owner(OwnerKind.POD, "uid-m"), (ContainerAsk("main", SHARED),), MPS)
    after = reserve_pod(
        node, pod, make_policy("bestfit"), AllocationId("m"), now=0, lease_s=30, slots_per_card=4, hint=((0,),)
    )
    placed = after.get(AllocationId("m"))
    assert placed is not None and [s.index for g in placed.grants for s in g.cards] == [1]


def test_the_replay_records_the_tier_it_places() -> None:
    state = take(from_ledger(ledger(8000)), (0,), 100, 1000, False, MPS)
    assert state.cards[0].tiers == {MPS}
    fits, _ = filter_nodes([state], gpu_ask(1, mem_mib=1000, core_milli=100))
    assert fits == ()


# ---- the property: whatever arrives, in whatever order, no card holds both tiers -------------

ARRIVAL = st.tuples(
    st.sampled_from([MPS, NONE]),
    st.integers(1, 2),  # cards
    st.integers(1, 4000),  # MiB per card
    st.booleans(),  # exclusive
    st.sampled_from(["allocator", "placement"]),  # which writer
)


def _arrive(state: NodeLedger, i: int, arrival: tuple[Isolation, int, int, bool, str]) -> NodeLedger:
    tier, count, mem, exclusive, writer = arrival
    request = Request(count) if exclusive else Request(count, mem_mib=mem, core_milli=100)
    asks = (ContainerAsk("main", request),)
    allocation_id = AllocationId(f"a{i}")
    if writer == "allocator":
        grants = fit_node(state, asks, 4, Tier(tier))
        owner = Owner(OwnerKind.TOOL, f"t{i}")
        try:  # what the fit chose, the ledger takes: the fit never picks a card of the other tier
            return reserve(state, Allocation(allocation_id, owner, NODE, grants, isolation=tier))
        except Exhausted as err:
            raise AssertionError(f"the fit chose what reserve refuses: {err}") from err
    pod = PodAsk(Owner(OwnerKind.POD, f"uid-{i}"), asks, tier)
    return reserve_pod(state, pod, make_policy("bestfit"), allocation_id, now=0, lease_s=30, slots_per_card=4)


@settings(max_examples=150, deadline=None)
@given(st.lists(ARRIVAL, min_size=1, max_size=24))
def test_no_card_ever_holds_both_tiers(arrivals: list[tuple[Isolation, int, int, bool, str]]) -> None:
    state = ledger(8000, 8000, 16000)
    placed = 0
    for i, arrival in enumerate(arrivals):
        try:
            state = _arrive(state, i, arrival)
            placed += 1
        except Exhausted:
            continue
        for use in node_use(state.allocations).values():
            assert len(use.tiers) <= 1, use
    assert placed >= 1  # the first arrival always fits an empty node
