"""Tools on a draining card: which of a node's tool allocations are told, released or let be.

A card whose remedy is set (docs/remediation.md) must lose its holders, and so must a MIG instance
whose fault needs its holder moved (``MigInstance.remedy``, docs/mig.md): only that instance's
holder, the card's other instances serve on. Pods and claims are moved by placement; an outside
tool's allocation is marked with a ``Drain`` (its owner is told: the
mark is a ``drain`` event and is shown by GetAllocation) and released once the mark's
``release_at`` has passed. The mark is in the node's ledger value, so the grace counts across
restarts and replicas, and ``drain_tools`` applied twice is applied once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, release
from gpuledger_core.model import Allocation, Card, Drain, MigInstance, MigSlot, OwnerKind, Remedy


def draining_cards(ledger: NodeLedger) -> dict[CardUuid, Card]:
    """The node's cards whose holders must move off: any remedy (``reset`` and ``retired`` are
    reached only once a card is empty, so a holder found on one must leave too)."""
    return {card.uuid: card for card in ledger.node.cards if card.remedy is not Remedy.NONE}


def draining_instances(ledger: NodeLedger) -> dict[tuple[CardUuid, MigSlot], tuple[Card, MigInstance]]:
    """The node's MIG instances whose holder must move off (a remedy set on the instance), by card
    and placement."""
    return {
        (card.uuid, i.slot): (card, i)
        for card in ledger.node.cards
        for i in card.instances
        if i.remedy is not Remedy.NONE
    }


def instance_drain_reason(node: NodeName, card: Card, instance: MigInstance) -> str:
    where = f"MIG instance {instance.slot.profile} at {instance.slot.start} of card {card.index} ({card.uuid})"
    return f"{where} of node {node} is faulted ({instance.remedy.value}): {instance.fault or 'unhealthy'}"


def drain_reason(node: NodeName, card: Card) -> str:
    fault = card.health_reason or "unhealthy"
    return f"card {card.index} ({card.uuid}) of node {node} is being repaired ({card.remedy.value}): {fault}"


def release_reason(drain: Drain) -> str:
    return f"drained: {drain.reason}"


def drain_tools(ledger: NodeLedger, now: float, grace_s: float) -> NodeLedger:
    """Each live tool allocation holding a share of a draining card marked (``since`` = ``now``,
    ``release_at`` = ``now + grace_s``), released once ``release_at`` has passed (with a grace
    of 0, in the same step), and unmarked if none of its cards drains any more. The ledger
    itself when nothing changes."""
    cards, instances = draining_cards(ledger), draining_instances(ledger)
    if not cards and not instances and not any(a.drain is not None and _tool(a) for a in ledger.allocations):
        return ledger
    marked = tuple(_marked(a, cards, instances, ledger.node.name, now, grace_s) for a in ledger.allocations)
    if any(new is not old for new, old in zip(marked, ledger.allocations, strict=True)):
        ledger = NodeLedger(ledger.node, marked)
    for a in marked:
        if _tool(a) and a.drain is not None and a.drain.release_at <= now:
            ledger = release(ledger, a.id, now, release_reason(a.drain))
    return ledger


def _marked(
    a: Allocation,
    cards: dict[CardUuid, Card],
    instances: dict[tuple[CardUuid, MigSlot], tuple[Card, MigInstance]],
    node: NodeName,
    now: float,
    grace_s: float,
) -> Allocation:
    """A live tool allocation marked for the first of its cards that drains (else the first MIG
    instance it holds that drains), or unmarked."""
    if not _tool(a):
        return a
    card = next((cards[s.uuid] for s in a.shares() if s.uuid in cards), None)
    reason = drain_reason(node, card) if card is not None else ""
    if card is None:
        held = [(s.uuid, s.mig) for s in a.shares() if s.mig is not None]
        hit = next((instances[key] for key in held if key in instances), None)
        if hit is not None:
            card, reason = hit[0], instance_drain_reason(node, *hit)
    if card is None:
        return a if a.drain is None else replace(a, drain=None, updated_at=now)
    if a.drain is not None:
        return a
    return replace(a, drain=Drain(card.uuid, card.index, now, now + grace_s, reason), updated_at=now)


def _tool(a: Allocation) -> bool:
    return a.live and a.owner.kind is OwnerKind.TOOL


def next_release(ledger: NodeLedger) -> float | None:
    """When the next marked allocation of the node is due for release; None if none is marked."""
    due = [a.drain.release_at for a in ledger.allocations if _tool(a) and a.drain is not None]
    return min(due, default=None)


@dataclass(frozen=True, slots=True)
class Changes:
    """What one write did to tool drains."""

    told: tuple[Allocation, ...] = ()  # marked: their owners are told
    released: tuple[Allocation, ...] = ()  # released at their drain's release_at
    cancelled: tuple[Allocation, ...] = ()  # unmarked: their card serves again


def changes(old: NodeLedger | None, new: NodeLedger | None) -> Changes:
    """The allocations a write marked for a drain, released for one, or unmarked."""
    before = {a.id: a for a in old.allocations} if old is not None else {}
    told, released, cancelled = [], [], []
    for a in new.allocations if new is not None else ():
        previous = before.get(a.id)
        if previous is None or not previous.live:
            continue
        if a.drain is None:
            if previous.drain is not None and a.live:
                cancelled.append(a)
            continue
        if previous.drain is None:
            told.append(a)
        if not a.live and a.reason == release_reason(a.drain):
            released.append(a)
    return Changes(tuple(told), tuple(released), tuple(cancelled))
