from __future__ import annotations

from dataclasses import replace

from gpuledger_core.events import EventKind, LedgerEvent, diff
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, commit, prune, release, reserve, with_node
from gpuledger_core.model import Health

from .builders import NODE, card, holding, ledger, node, share

A, B = AllocationId("a"), AllocationId("b")


def _kinds(events: tuple[LedgerEvent, ...]) -> list[tuple[EventKind, str | None]]:
    return [(e.kind, e.allocation.id if e.allocation else None) for e in events]


def _two() -> NodeLedger:
    state = reserve(ledger(8000), holding("a", share(0, 1), lease=30.0))
    return reserve(state, holding("b", share(0, 1), lease=30.0))


def test_nothing_to_nothing_is_no_event() -> None:
    assert diff(None, None, 1) == ()


def test_a_new_node_announces_its_inventory_then_its_allocations() -> None:
    new = _two()
    events = diff(None, new, 7)
    assert _kinds(events) == [(EventKind.NODE, None), (EventKind.RESERVED, A), (EventKind.RESERVED, B)]
    assert events[0].inventory == new.node
    assert {e.revision for e in events} == {7}
    assert {e.node for e in events} == {NODE}


def test_a_removed_node_is_one_event() -> None:
    assert diff(_two(), None, 9) == (LedgerEvent(EventKind.NODE_REMOVED, NODE, 9),)


def test_an_unchanged_ledger_has_no_events() -> None:
    state = _two()
    assert diff(state, state, 3) == ()


def test_state_changes_become_events_carrying_the_new_allocation() -> None:
    old = _two()
    new = release(commit(old, A, now=1.0), B, now=2.0)
    events = diff(old, new, 4)
    assert _kinds(events) == [(EventKind.BOUND, A), (EventKind.RELEASED, B)]
    assert [e.allocation for e in events] == [new.get(A), new.get(B)]


def test_a_new_reservation_is_one_event() -> None:
    old = _two()
    new = reserve(old, holding("c", share(0, 1)))
    assert _kinds(diff(old, new, 5)) == [(EventKind.RESERVED, "c")]


def test_changed_inventory_is_a_node_event() -> None:
    old = _two()
    sick = replace(node(8000), cards=(replace(card(0, 8000), health=Health.UNHEALTHY),))
    events = diff(old, with_node(old, sick), 6)
    assert _kinds(events) == [(EventKind.NODE, None)]
    assert events[0].inventory == sick


def test_forgetting_a_released_allocation_is_no_event() -> None:
    gone = release(_two(), A, now=1.0)
    assert diff(gone, prune(gone, now=1e9), 8) == ()
