"""How much of each card the live allocations of a node hold, and which isolation tiers hold it.

``tier_problem`` is the one rule for tiers, used by every fit (the allocator's ``fit``, placement's
``placement.fit``, so the extender and the replay too) and by the ledger's ``reserve``: an ``mps``
tenant and a ``none`` tenant never share a card unless ``mix`` (the services' ``mix_isolation``
setting) allows it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuledger_core.ids import CardUuid
from gpuledger_core.memo import Memo
from gpuledger_core.model import CORE_WHOLE, Allocation, Card, CardShare, Isolation


@dataclass(frozen=True, slots=True)
class CardUse:
    mem_mib: int = 0
    core_milli: int = 0
    exclusive: bool = False
    holders: int = 0
    tiers: frozenset[Isolation] = frozenset()  # the isolation tiers of its holders

    def plus(self, share: CardShare, tier: Isolation) -> CardUse:
        return CardUse(
            self.mem_mib + share.mem_mib,
            self.core_milli + share.core_milli,
            self.exclusive or share.exclusive,
            self.holders + 1,
            self.tiers | {tier},
        )

    def most(self, other: CardUse) -> CardUse:
        return CardUse(
            max(self.mem_mib, other.mem_mib),
            max(self.core_milli, other.core_milli),
            self.exclusive or other.exclusive,
            max(self.holders, other.holders),
            self.tiers | other.tiers,
        )


@dataclass(frozen=True, slots=True)
class CardFree:
    """What is left of a card for a new holder."""

    mem_mib: int
    core_milli: int
    idle: bool  # nobody holds any of it: it can be taken exclusively
    tiers: frozenset[Isolation] = frozenset()  # the isolation tiers of its holders

    def fits(self, mem_mib: int, core_milli: int) -> bool:
        return self.mem_mib >= mem_mib and self.core_milli >= core_milli


def tier_problem(held: frozenset[Isolation], tier: Isolation, mix: bool) -> str:
    """Why a new holder of isolation ``tier`` may not join a card whose holders are of the tiers
    ``held``; empty when it may.

    A process outside MPS on a card served by an MPS server either gets no context at all (NVIDIA's
    MPS daemon puts the card in EXCLUSIVE_PROCESS mode) or, in the default compute mode, runs beside
    the server bound by none of the MPS limits, so the MPS tenants' shares no longer hold. Mixing is
    allowed only where ``mix`` says so.
    """
    if mix or not held:
        return ""  # the common case, first: nobody holds the card, or tiers may mix
    others = held - {tier}
    if not others:
        return ""
    names = "|".join(sorted(t.value for t in others))
    return f"isolation {tier.value} does not share a card with {names} tenants (mix_isolation is off)"


def allocation_use(allocation: Allocation) -> dict[CardUuid, CardUse]:
    """One allocation's hold on each card.

    Init containers run one at a time before the app containers, so a card carries the larger of
    the biggest init share and the sum of the app shares (kubelet reuses init devices likewise).
    """
    return dict(_use_of(allocation))


def _use_of(allocation: Allocation) -> tuple[tuple[CardUuid, CardUse], ...]:
    """``allocation_use``, remembered (``Memo``): every node state made (placement makes one per
    change of the node and per pod it assumes there) counts each of the node's allocations again."""
    return _USES.get(allocation, _count_use)


def _count_use(allocation: Allocation) -> tuple[tuple[CardUuid, CardUse], ...]:
    apps: dict[CardUuid, CardUse] = {}
    inits: dict[CardUuid, CardUse] = {}
    tier = allocation.isolation
    for grant in allocation.grants:
        for share in grant.cards:
            if grant.init:
                inits[share.uuid] = inits.get(share.uuid, CardUse()).most(CardUse().plus(share, tier))
            else:
                apps[share.uuid] = apps.get(share.uuid, CardUse()).plus(share, tier)
    for uuid, use in inits.items():
        apps[uuid] = apps.get(uuid, CardUse()).most(use)
    return tuple(apps.items())


_USES: Memo[Allocation, tuple[tuple[CardUuid, CardUse], ...]] = Memo()


def node_use(allocations: Iterable[Allocation]) -> dict[CardUuid, CardUse]:
    """The sum of every live allocation's hold on each card."""
    total: dict[CardUuid, CardUse] = {}
    for allocation in allocations:
        if not allocation.live:
            continue
        for uuid, use in _use_of(allocation):
            seen = total.get(uuid, CardUse())
            total[uuid] = CardUse(
                seen.mem_mib + use.mem_mib,
                seen.core_milli + use.core_milli,
                seen.exclusive or use.exclusive,
                seen.holders + 1,
                seen.tiers | use.tiers,
            )
    return total


def free_of(card: Card, use: CardUse | None) -> CardFree:
    return CardFree(*free_parts(card, use))


def free_parts(card: Card, use: CardUse | None) -> tuple[int, int, bool, frozenset[Isolation]]:
    """``free_of``'s fields (free MiB, free per-mille of compute, idle, the holders' tiers), without
    making a ``CardFree``: ``room.card_state`` makes one card state of them, for every card a fit sees."""
    if use is None or use.holders == 0:
        return card.memory_mib, CORE_WHOLE, True, frozenset()
    if use.exclusive:
        return 0, 0, False, use.tiers
    return max(0, card.memory_mib - use.mem_mib), max(0, CORE_WHOLE - use.core_milli), False, use.tiers


def free_mem(card: Card, use: CardUse | None) -> int:
    """``free_of(card, use).mem_mib``, without making the rest."""
    if use is None or use.holders == 0:
        return card.memory_mib
    return 0 if use.exclusive else max(0, card.memory_mib - use.mem_mib)
