"""The read side of the ledger: per node and card, what is free and who holds what."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
class Usage:
    """What NVML sees running on a card: compute processes and the memory they use."""

    processes: int = 0
    used_mib: int = 0


@dataclass(frozen=True, slots=True)
class CardStatus:
    card: Card
    free_mem_mib: int
    free_core_milli: int
    holders: tuple[Holder, ...]
    processes: int = 0
    foreign_processes: int = 0
    foreign_mib: int = 0


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: NodeName
    cards: tuple[CardStatus, ...]
    stale: bool = False
    revision: int = 0
    unreadable: str = ""  # why the node's ledger value cannot be read ("" when it can): nothing is placed there


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


def foreign(holders: Sequence[Holder], usage: Usage) -> tuple[int, int]:
    """(processes, MiB) on a card that the ledger does not account for.

    On a card nobody holds, every process is foreign. On a shared card, memory used beyond what
    the holders were granted is foreign (NVML cannot say whose process is whose). A card held
    whole is its holder's to use as it likes.
    """
    if not holders:
        return usage.processes, usage.used_mib
    if any(h.exclusive for h in holders):
        return 0, 0
    over = usage.used_mib - sum(h.mem_mib for h in holders)
    return (1 if over > 0 else 0), max(0, over)


def node_status(
    ledger: NodeLedger,
    *,
    stale: bool = False,
    revision: int = 0,
    model: str = "",
    usage: Mapping[str, Usage] | None = None,
) -> NodeStatus:
    use = ledger.use()
    holders = holders_of(ledger.allocations)
    cards: list[CardStatus] = []
    for card in ledger.node.cards:
        if model and card.model != model:
            continue
        held = tuple(holders.get(card.uuid, ()))
        seen = (usage or {}).get(card.uuid, Usage())
        extra_processes, extra_mib = foreign(held, seen)
        free = free_of(card, use.get(card.uuid))
        cards.append(
            CardStatus(card, free.mem_mib, free.core_milli, held, seen.processes, extra_processes, extra_mib)
        )
    return NodeStatus(ledger.node.name, tuple(cards), stale, revision)
