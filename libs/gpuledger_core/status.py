"""The read side of the ledger: per node and card, what is free and who holds what."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, AllocState, Card, Owner
from gpuledger_core.usage import free_of


@dataclass(frozen=True, slots=True)
class Holder:
    allocation_id: AllocationId
    owner: Owner
    container: str
    mem_mib: int
    core_milli: int
    exclusive: bool
    state: AllocState
    since: float


@dataclass(frozen=True, slots=True)
class CardStatus:
    card: Card
    free_mem_mib: int
    free_core_milli: int
    holders: tuple[Holder, ...]


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: NodeName
    cards: tuple[CardStatus, ...]
    stale: bool = False
    revision: int = 0


def holders_of(allocations: Iterable[Allocation]) -> dict[str, list[Holder]]:
    found: dict[str, list[Holder]] = {}
    for a in allocations:
        if not a.live:
            continue
        for grant in a.grants:
            for share in grant.cards:
                holder = Holder(
                    a.id, a.owner, grant.container, share.mem_mib, share.core_milli,
                    share.exclusive, a.state, a.created_at,
                )
                found.setdefault(share.uuid, []).append(holder)
    return found


def node_status(ledger: NodeLedger, *, stale: bool = False, revision: int = 0, model: str = "") -> NodeStatus:
    use = ledger.use()
    holders = holders_of(ledger.allocations)
    cards = tuple(
        CardStatus(
            card,
            (free := free_of(card, use.get(card.uuid))).mem_mib,
            free.core_milli,
            tuple(holders.get(card.uuid, ())),
        )
        for card in ledger.node.cards
        if not model or card.model == model
    )
    return NodeStatus(ledger.node.name, cards, stale, revision)
