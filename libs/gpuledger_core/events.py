"""Ledger events: what changed between two values of a node's ledger."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, AllocState, Node


class EventKind(StrEnum):
    RESERVED = "reserved"
    BOUND = "bound"
    RELEASED = "released"
    NODE = "node"  # the node's inventory (cards, health, links) changed
    NODE_REMOVED = "node_removed"
    DRAIN = "drain"  # a tool's allocation is on a card being repaired: released at its drain's release_at
    DRAIN_CANCELLED = "drain_cancelled"  # the card is serving again before that: the allocation stays


@dataclass(frozen=True, slots=True)
class LedgerEvent:
    kind: EventKind
    node: NodeName
    revision: int
    allocation: Allocation | None = None
    inventory: Node | None = None


_KIND_OF_STATE = {
    AllocState.RESERVED: EventKind.RESERVED,
    AllocState.BOUND: EventKind.BOUND,
    AllocState.RELEASED: EventKind.RELEASED,
}


def diff(old: NodeLedger | None, new: NodeLedger | None, revision: int) -> tuple[LedgerEvent, ...]:
    """The events that turn ``old`` into ``new``, allocations in the order they appear."""
    if new is None:
        return () if old is None else (LedgerEvent(EventKind.NODE_REMOVED, old.node.name, revision),)
    events: list[LedgerEvent] = []
    name = new.node.name
    if old is None or old.node != new.node:
        events.append(LedgerEvent(EventKind.NODE, name, revision, inventory=new.node))
    before = {a.id: a for a in old.allocations} if old else {}
    for allocation in new.allocations:
        previous = before.get(allocation.id)
        drained = _drain_change(previous, allocation)
        if drained is not None:
            events.append(LedgerEvent(drained, name, revision, allocation=allocation))
        if previous is None or previous.state is not allocation.state:
            kind = _KIND_OF_STATE[allocation.state]
            events.append(LedgerEvent(kind, name, revision, allocation=allocation))
    after = {a.id for a in new.allocations}
    for allocation in before.values():
        if allocation.live and allocation.id not in after:  # dropped without a release: say so
            gone = replace(allocation, state=AllocState.RELEASED, lease_expires_at=None, reason="forgotten")
            events.append(LedgerEvent(EventKind.RELEASED, name, revision, allocation=gone))
    return tuple(events)


def _drain_change(previous: Allocation | None, allocation: Allocation) -> EventKind | None:
    """``DRAIN`` when the allocation is marked for a drain (or first seen live and marked, as in a
    watch's snapshot), ``DRAIN_CANCELLED`` when its mark goes while it is live; else None."""
    before = previous.drain if previous is not None else None
    if allocation.drain is not None and before is None:
        was_live = previous.live if previous is not None else allocation.live
        return EventKind.DRAIN if was_live else None
    if before is not None and allocation.drain is None and allocation.live:
        return EventKind.DRAIN_CANCELLED
    return None
