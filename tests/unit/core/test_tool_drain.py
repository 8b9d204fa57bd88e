"""Tools on a draining card: the decision (gpuledger_core.tool_drain) and its events."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger_core.events import EventKind, diff
from gpuledger_core.ledger import NodeLedger, release
from gpuledger_core.model import Allocation, AllocState, Grant, Health, MigInstance, Owner, OwnerKind, Remedy
from gpuledger_core.tool_drain import Changes, changes, drain_tools, next_release

from . import strategies as s
from .builders import allocation, node, share
from .test_mig_ledger import instance_share, mig_card, mig_ledger, slot

GRACE = 300.0


def tool(allocation_id: str, *cards: int, state: AllocState = AllocState.BOUND) -> Allocation:
    held = allocation(allocation_id, Grant("", tuple(share(i, 100) for i in cards)), state=state)
    return replace(held, owner=Owner(OwnerKind.TOOL, f"tool-{allocation_id}"))


def pod(allocation_id: str, *cards: int) -> Allocation:
    return allocation(allocation_id, Grant("main", tuple(share(i, 100) for i in cards)), state=AllocState.BOUND)


def repairing(ledger: NodeLedger, index: int, remedy: Remedy = Remedy.DRAIN, why: str = "XID 79") -> NodeLedger:
    cards = tuple(
        replace(c, health=Health.UNHEALTHY, health_reason=why, remedy=remedy) if c.index == index else c
        for c in ledger.node.cards
    )
    return NodeLedger(replace(ledger.node, cards=cards), ledger.allocations)


def serving(ledger: NodeLedger) -> NodeLedger:
    cards = tuple(replace(c, health=Health.HEALTHY, health_reason="", remedy=Remedy.NONE) for c in ledger.node.cards)
    return NodeLedger(replace(ledger.node, cards=cards), ledger.allocations)


def four(*allocations: Allocation) -> NodeLedger:
    return NodeLedger(node(8000, 8000, 8000, 8000), allocations)


def test_a_node_with_no_card_under_repair_is_left_as_it_is() -> None:
    ledger = four(tool("t", 1), pod("p", 2))
    assert drain_tools(ledger, 100.0, GRACE) is ledger


def test_a_tool_on_a_draining_card_is_marked_with_the_card_its_fault_and_its_release_time() -> None:
    ledger = repairing(four(tool("t", 1), tool("other", 2)), 1)
    marked = drain_tools(ledger, 100.0, GRACE)
    t = marked.allocations[0]
    assert t.live and t.drain is not None
    assert (t.drain.card, t.drain.card_index, t.drain.since, t.drain.release_at) == ("GPU-0001", 1, 100.0, 400.0)
    assert "card 1 (GPU-0001) of node node-a" in t.drain.reason and "XID 79" in t.drain.reason
    assert marked.allocations[1] is ledger.allocations[1]  # another card's tool: untouched
    assert next_release(marked) == 400.0
    assert [e.kind for e in diff(ledger, marked, 2)] == [EventKind.DRAIN]


@pytest.mark.parametrize("remedy", [Remedy.DRAIN, Remedy.RESET, Remedy.RETIRED])
def test_any_remedy_drains_its_tools(remedy: Remedy) -> None:
    marked = drain_tools(repairing(four(tool("t", 0, 3)), 3, remedy), 0.0, GRACE)
    assert marked.allocations[0].drain is not None


def test_pods_and_claims_are_placement_s_to_move() -> None:
    claim = replace(pod("c", 1), owner=Owner(OwnerKind.CLAIM, "claim-uid"))
    ledger = repairing(four(pod("p", 1), claim), 1)
    assert drain_tools(ledger, 0.0, GRACE) is ledger


def test_marking_again_changes_nothing_and_the_grace_counts_from_the_first_mark() -> None:
    once = drain_tools(repairing(four(tool("t", 1)), 1), 100.0, GRACE)
    assert drain_tools(once, 200.0, GRACE) is once
    assert drain_tools(once, 399.9, 10.0) is once  # a grace changed since: the mark keeps its own


def test_it_is_released_at_release_at_naming_the_card_and_the_fault() -> None:
    before = repairing(four(tool("t", 1, state=AllocState.RESERVED), tool("u", 2)), 1)
    marked = drain_tools(before, 100.0, GRACE)
    released = drain_tools(marked, 400.0, GRACE)
    t = released.allocations[0]
    assert t.state is AllocState.RELEASED and t.reason.startswith("drained: card 1 (GPU-0001)") and "XID 79" in t.reason
    assert released.allocations[1] is before.allocations[1]
    assert drain_tools(released, 500.0, GRACE) is released  # released twice: once
    assert next_release(released) is None
    assert [e.kind for e in diff(marked, released, 3)] == [EventKind.RELEASED]
    assert changes(marked, released) == Changes(released=(t,))


def test_a_grace_of_zero_tells_and_releases_at_once() -> None:
    before = repairing(four(tool("t", 1)), 1)
    after = drain_tools(before, 100.0, 0.0)
    assert after.allocations[0].state is AllocState.RELEASED
    assert [e.kind for e in diff(before, after, 2)] == [EventKind.DRAIN, EventKind.RELEASED]
    assert changes(before, after) == Changes(told=after.allocations, released=after.allocations)


def test_a_tool_that_releases_first_is_not_released_again() -> None:
    marked = drain_tools(repairing(four(tool("t", 1)), 1), 100.0, GRACE)
    own = release(marked, marked.allocations[0].id, 150.0, "done")
    assert drain_tools(own, 1000.0, GRACE) is own
    assert changes(marked, own) == Changes()


def test_a_card_serving_again_before_the_release_cancels_the_drain() -> None:
    marked = drain_tools(repairing(four(tool("t", 1)), 1), 100.0, GRACE)
    healed = serving(marked)
    kept = drain_tools(healed, 200.0, GRACE)
    assert kept.allocations[0].drain is None and kept.allocations[0].live
    assert [e.kind for e in diff(healed, kept, 4)] == [EventKind.DRAIN_CANCELLED]
    assert changes(healed, kept) == Changes(cancelled=kept.allocations)


def test_a_watch_s_snapshot_repeats_the_drain_of_a_live_allocation_only() -> None:
    marked = drain_tools(repairing(four(tool("t", 1), tool("u", 1)), 1), 100.0, GRACE)
    done = release(marked, marked.allocations[1].id, 150.0, "done")
    kinds = [(e.kind, e.allocation.id if e.allocation else "") for e in diff(None, done, 5)]
    assert kinds == [(EventKind.NODE, ""), (EventKind.DRAIN, "t"), (EventKind.BOUND, "t"), (EventKind.RELEASED, "u")]


@settings(max_examples=200, deadline=None)
@given(ledger=s.ledgers, now=s.times, grace=st.floats(0, 3600))
def test_draining_is_idempotent_and_touches_only_tools_on_cards_under_repair(
    ledger: NodeLedger, now: float, grace: float
) -> None:
    once = drain_tools(ledger, now, grace)
    assert drain_tools(once, now, grace) == once
    repairing_cards = {c.uuid for c in ledger.node.cards if c.remedy is not Remedy.NONE}
    for old, new in zip(ledger.allocations, once.allocations, strict=True):
        on_one = any(share.uuid in repairing_cards for share in old.shares())
        if new != old:
            assert old.live and old.owner.kind is OwnerKind.TOOL
            assert on_one or old.drain is not None


def test_a_tool_on_a_mig_instance_whose_fault_needs_it_moved_is_drained_and_its_neighbour_is_not() -> None:
    """A drain-level XID inside one instance (its ``remedy``) drains that instance's tool only; the
    card serves on, and the mark goes when the instance is healthy again."""
    c = mig_card(0, MigInstance(slot("3g.20gb", 4), static=True, uuid="MIG-bad"))
    hit, beside = instance_share(c, "3g.20gb", 4), instance_share(c, "2g.10gb", 0)
    tools = tuple(
        replace(allocation(n, Grant("", (s,)), state=AllocState.BOUND), owner=Owner(OwnerKind.TOOL, f"tool-{n}"))
        for n, s in (("hit", hit), ("beside", beside))
    )
    faulted = replace(c, instances=(replace(c.instances[0], fault="XID 94 in the instance", remedy=Remedy.DRAIN),))
    ledger = NodeLedger(replace(mig_ledger(c).node, cards=(faulted,)), tools)
    marked = drain_tools(ledger, 100.0, GRACE)
    t = marked.allocations[0]
    assert t.drain is not None and (t.drain.card, t.drain.card_index, t.drain.release_at) == (c.uuid, 0, 400.0)
    assert "MIG instance 3g.20gb at 4 of card 0" in t.drain.reason and "XID 94 in the instance" in t.drain.reason
    assert marked.allocations[1] is ledger.allocations[1]  # another instance of the same card: untouched
    assert faulted.healthy  # the card itself serves on
    released = drain_tools(marked, 400.0, GRACE)
    assert not released.allocations[0].live and released.allocations[1].live
    healed = NodeLedger(replace(marked.node, cards=(c,)), marked.allocations)
    assert drain_tools(healed, 200.0, GRACE).allocations[0].drain is None  # healthy again first: unmarked
