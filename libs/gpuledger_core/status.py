"""The read side of the ledger: per node and card, what is free and who holds what."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuledger_core.card_usage import Usage
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, AllocState, Card, MigInstance, MigSlot, Owner, OwnerKind
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
    used_mib: int | None = None  # the memory its pod's processes use on the card; None: not measured
    over: bool = False  # a share using more memory than granted (docs/audit.md)
    used_core_milli: int | None = None  # its pod's processes' share of the card's SM time, per mille; None: not sampled
    mig: MigSlot | None = None  # the MIG placement it holds whole (its instance, once the node made it)


@dataclass(frozen=True, slots=True)
class CardStatus:
    card: Card
    free_mem_mib: int
    free_core_milli: int
    holders: tuple[Holder, ...]
    processes: int = 0
    foreign_processes: int = 0
    foreign_mib: int = 0

    def holder_of(self, instance: MigInstance) -> Holder | None:
        """Who holds ``instance`` of the card (in MIG mode), as its holders say; None: nobody."""
        return next((h for h in self.holders if h.mig == instance.slot), None)


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
                    a.id,
                    a.owner,
                    grant.container,
                    share.mem_mib,
                    share.core_milli,
                    share.exclusive,
                    a.state,
                    a.created_at,
                    mig=share.mig,
                )
                found.setdefault(share.uuid, []).append(holder)
    return found


def foreign(holders: Sequence[Holder], usage: Usage) -> tuple[int, int]:
    """(processes, MiB) on a card that the ledger does not account for, when nobody can tell whose
    a process is (an inventory that does not attribute, or use no pod holder accounts for).

    On a card nobody holds, every process is foreign. On a shared card, memory used beyond what
    the holders were granted is foreign (one process: NVML cannot say which). A card held whole is
    its holder's to use as it likes.
    """
    if not holders:
        return usage.processes, usage.used_mib
    if any(h.exclusive for h in holders):
        return 0, 0
    over = usage.used_mib - sum(h.mem_mib for h in holders)
    return (1 if over > 0 else 0), max(0, over)


def audit(holders: Sequence[Holder], usage: Usage) -> tuple[tuple[Holder, ...], int, int]:
    """The card's holders with their use and over-grant mark, and its foreign (processes, MiB)
    (docs/audit.md). A pod holder uses what its pod's processes on the card use; two containers
    of one pod on the card are measured together, against the sum of their grants. What no pod
    holder accounts for is judged by ``foreign`` against the holders cgroups cannot name (tools,
    DRA claims). Without attribution the whole card is judged so, and nobody is measured."""
    if usage.attributed is None:
        return tuple(holders), *foreign(holders, usage)
    pods = {h.owner.id for h in holders if h.owner.kind is OwnerKind.POD}
    used: dict[str, int] = dict.fromkeys(pods, 0)
    granted: dict[str, int] = dict.fromkeys(pods, 0)
    sampled = any(p.sm_percent is not None for p in usage.attributed)
    core: dict[str, int] | None = dict.fromkeys(pods, 0) if sampled else None
    rest = Usage()
    for p in usage.attributed:
        if p.pod_uid is not None and p.pod_uid in pods:
            used[p.pod_uid] += p.used_mib
            if core is not None:
                core[p.pod_uid] += 10 * (p.sm_percent or 0)
        else:
            rest = Usage(rest.processes + 1, rest.used_mib + p.used_mib)
    for h in holders:
        if h.owner.kind is OwnerKind.POD:
            granted[h.owner.id] += h.mem_mib
    measured = tuple(_measured(h, used, granted, core) for h in holders)
    return measured, *foreign([h for h in holders if h.owner.kind is not OwnerKind.POD], rest)


def _measured(h: Holder, used: Mapping[str, int], granted: Mapping[str, int], core: Mapping[str, int] | None) -> Holder:
    """A pod holder with its use; compute is shown, never judged (docs/audit.md: SM time is how
    busy the pod kept the card, not a limit a share can pass without MPS)."""
    if h.owner.kind is not OwnerKind.POD:
        return h
    mine = used[h.owner.id]
    cores = None if core is None else min(core[h.owner.id], 1000)
    return replace(h, used_mib=mine, over=not h.exclusive and mine > granted[h.owner.id], used_core_milli=cores)


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
        seen = (usage or {}).get(card.uuid, Usage())
        held, extra_processes, extra_mib = audit(holders.get(card.uuid, ()), seen)
        free = free_of(card, use.get(card.uuid))
        cards.append(CardStatus(card, free.mem_mib, free.core_milli, held, seen.processes, extra_processes, extra_mib))
    return NodeStatus(ledger.node.name, tuple(cards), stale, revision)
