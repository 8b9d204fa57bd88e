"""Does a request fit a node, and on which cards: the simple built-in fit.

The placement service has the topology- and fragmentation-aware choice; this is what the allocator
uses on its own, and what placement builds on: per-card room, model selectors, health, isolation
tiers (``usage.tier_problem``: a card held by another tier takes no new sharer unless
``mix_isolation``) and (with ``slots_per_card``) kubelet slots: a card whose slots are all held is
full for new holders.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from gpuledger_core.errors import Exhausted
from gpuledger_core.ids import AllocationId, CardUuid
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import CORE_WHOLE, Allocation, Card, CardShare, Grant, Isolation, Owner, OwnerKind, Request
from gpuledger_core.slots import slot_problem, slots_held
from gpuledger_core.usage import CardFree, CardUse, free_of, tier_problem


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    container: str
    request: Request
    init: bool = False


@dataclass(frozen=True, slots=True)
class Tier:
    """The isolation a new holder runs under, and whether it may share a card with another tier."""

    isolation: Isolation = Isolation.NONE
    mix: bool = False

    def problem(self, free: CardFree) -> str:
        return tier_problem(free.tiers, self.isolation, self.mix)


def share_for(card: Card, request: Request) -> CardShare:
    if request.exclusive:
        return CardShare(card.uuid, card.index, card.memory_mib, CORE_WHOLE, exclusive=True)
    return CardShare(card.uuid, card.index, request.mem_mib or 0, request.core_milli or 0)


def card_fits(card: Card, free: CardFree, request: Request, tier: Tier = Tier()) -> bool:
    if not card.healthy or not request.allows(card.model):
        return False
    if request.exclusive:
        return free.idle
    return free.fits(request.mem_mib or 0, request.core_milli or 0) and not tier.problem(free)


def frees(ledger: NodeLedger, use: Mapping[CardUuid, CardUse] | None = None) -> dict[CardUuid, CardFree]:
    use = ledger.use() if use is None else use
    return {card.uuid: free_of(card, use.get(card.uuid)) for card in ledger.node.cards}


def why_not(
    ledger: NodeLedger,
    request: Request,
    free: dict[CardUuid, CardFree],
    full: Collection[CardUuid] = (),
    tier: Tier = Tier(),
) -> str:
    """A sentence a person understands about why ``request`` does not fit this node (``full``: the
    cards whose slots are all held)."""
    cards = ledger.node.cards
    wanted = [c for c in cards if request.allows(c.model)]
    if not wanted:
        models = sorted({c.model for c in cards}) or ["no cards"]
        return f"no card of model {'|'.join(sorted(request.models))} (has {', '.join(models)})"
    healthy = [c for c in wanted if c.healthy]
    if len(healthy) < request.count:
        return f"{len(healthy)} healthy card(s) of the {request.count} needed"
    if request.exclusive:
        idle = sum(1 for c in healthy if free[c.uuid].idle)
        return f"{idle} free whole card(s) of the {request.count} needed"
    slotted = [c for c in healthy if c.uuid not in full]
    if len(slotted) < request.count:
        return (
            f"slots used up: {len(healthy) - len(slotted)} card(s) have every kubelet slot held, "
            f"{len(slotted)} card(s) with a free slot of the {request.count} needed"
        )
    tiered = [c for c in slotted if not tier.problem(free[c.uuid])]
    if len(tiered) < request.count:
        clash = next(tier.problem(free[c.uuid]) for c in slotted if tier.problem(free[c.uuid]))
        return (
            f"{len(slotted) - len(tiered)} card(s) held by another isolation tier ({clash}), "
            f"{len(tiered)} card(s) of the {request.count} needed"
        )
    healthy = tiered
    best = max(healthy, key=lambda c: (free[c.uuid].mem_mib, free[c.uuid].core_milli))
    room = free[best.uuid]
    need_mem, need_core = request.mem_mib or 0, request.core_milli or 0
    if room.mem_mib < need_mem:
        return (
            f"card {best.index} has the most free memory, {room.mem_mib} MiB, "
            f"{need_mem - room.mem_mib} MiB short of {need_mem} MiB"
        )
    if room.core_milli < need_core:
        return f"card {best.index} has {room.core_milli / 10:g}% compute free, needs {need_core / 10:g}%"
    fitting = sum(1 for c in healthy if card_fits(c, free[c.uuid], request, tier))
    return f"{fitting} card(s) with room of the {request.count} needed"


def choose_cards(
    ledger: NodeLedger,
    request: Request,
    free: dict[CardUuid, CardFree],
    full: Collection[CardUuid] = (),
    tier: Tier = Tier(),
) -> list[Card]:
    """The simple choice: exclusive takes the lowest free indexes, shared the tightest fit; never
    a card in ``full`` (all its slots held), nor one held by another isolation tier."""
    fitting = [c for c in ledger.node.cards if c.uuid not in full and card_fits(c, free[c.uuid], request, tier)]
    if len(fitting) < request.count:
        raise Exhausted(f"{ledger.node.name}: {why_not(ledger, request, free, full, tier)}")
    if not request.exclusive:
        fitting.sort(key=lambda c: (free[c.uuid].mem_mib, free[c.uuid].core_milli, c.index))
    return fitting[: request.count]


def fit_node(
    ledger: NodeLedger, asks: Sequence[ContainerAsk], slots_per_card: int | None = None, tier: Tier = Tier()
) -> tuple[Grant, ...]:
    """Cards for every container of one owner on this node, or ``Exhausted`` with the reason.
    With ``slots_per_card``, each app container takes a slot of each of its cards; ``tier`` is the
    owner's isolation (its containers share cards with one another whatever it is)."""
    use = dict(ledger.use())
    base = slots_held(ledger.allocations)
    held = Counter(base)
    grants: list[Grant] = []
    inits = any(ask.init for ask in asks)
    for ask in asks:
        free = frees(ledger, use if not ask.init else ledger.use())
        full = _full(ledger, base if ask.init else held, slots_per_card)
        cards = choose_cards(ledger, ask.request, free, full, tier)
        shares = tuple(share_for(card, ask.request) for card in cards)
        grants.append(Grant(ask.container, shares, ask.init))
        if not ask.init:
            for share in shares:
                use[share.uuid] = use.get(share.uuid, CardUse()).plus(share, tier.isolation)
                held[share.uuid] += 1
    # App containers took their slots one by one above (``full``); init containers alone on a
    # card take a slot each, which only the whole request can tell.
    whole = slot_problem(ledger, _planned(ledger, grants), slots_per_card) if slots_per_card and inits else ""
    if whole:
        raise Exhausted(f"{ledger.node.name}: {whole}")
    return tuple(grants)


def _planned(ledger: NodeLedger, grants: Sequence[Grant]) -> Allocation:
    return Allocation(AllocationId("-planned-"), Owner(OwnerKind.TOOL, "-planned-"), ledger.node.name, tuple(grants))


def _full(ledger: NodeLedger, held: Mapping[CardUuid, int], slots_per_card: int | None) -> frozenset[CardUuid]:
    if slots_per_card is None:
        return frozenset()
    return frozenset(c.uuid for c in ledger.node.cards if held.get(c.uuid, 0) >= slots_per_card)
