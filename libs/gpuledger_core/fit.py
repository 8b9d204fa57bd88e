"""Does a request fit a node, and on which cards: the simple built-in fit.

The placement service has the topology- and fragmentation-aware choice; this is what the allocator
uses on its own, and what placement builds on. Whether a card takes a container's share is the one
per-card rule, ``room.refusal`` (health, model, a free kubelet slot where ``slots_per_card`` counts
them, idle for a whole card, memory, compute, the isolation tier: a card held by another tier takes
no new sharer unless ``mix_isolation``), worded by ``room.why_not`` when too few cards take it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuledger_core.errors import Exhausted
from gpuledger_core.ids import AllocationId, CardUuid
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.mig_fit import fit_mig
from gpuledger_core.mig_place import MigChooser
from gpuledger_core.model import CORE_WHOLE, Allocation, Card, CardShare, Grant, Isolation, Owner, OwnerKind, Request
from gpuledger_core.room import CardState, Want, card_state, fitting, why_not
from gpuledger_core.slots import slot_problem, slots_free, slots_held
from gpuledger_core.usage import CardUse


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


def share_for(card: Card, request: Request) -> CardShare:
    if request.exclusive:
        return CardShare(card.uuid, card.index, card.memory_mib, CORE_WHOLE, exclusive=True)
    return CardShare(card.uuid, card.index, request.mem_mib or 0, request.core_milli or 0)


def card_states(
    ledger: NodeLedger, use: Mapping[CardUuid, CardUse], held: Mapping[CardUuid, int], slots_per_card: int | None
) -> tuple[CardState, ...]:
    """The node's cards, in its order, as the holders' ``use`` leaves them, with the slots ``held``
    leaves free of ``slots_per_card`` (None: slots not counted): how ``fit_node`` and placement's
    ``from_ledger`` see a live node's cards."""
    if slots_per_card is None:
        return tuple(card_state(card, use.get(card.uuid)) for card in ledger.node.cards)
    return tuple(
        card_state(card, use.get(card.uuid), slots_free(held, card.uuid, slots_per_card)) for card in ledger.node.cards
    )


def choose_cards(ledger: NodeLedger, request: Request, cards: Sequence[CardState], tier: Tier = Tier()) -> list[Card]:
    """The simple choice among the node's ``cards`` (``card_states``): exclusive takes the lowest
    free indexes, shared the tightest fit; ``Exhausted`` with the reason when too few take it."""
    want = Want.of(request, tier.isolation)
    found = fitting(cards, want, tier.mix)
    if len(found) < request.count:
        raise Exhausted(f"{ledger.node.name}: {why_not(cards, want, request.count, tier.mix)}")
    if not request.exclusive:
        found = tuple(sorted(found, key=lambda p: (cards[p].mem_free, cards[p].core_free, cards[p].index)))
    return [ledger.node.cards[p] for p in found[: request.count]]


def fit_node(
    ledger: NodeLedger,
    asks: Sequence[ContainerAsk],
    slots_per_card: int | None = None,
    tier: Tier = Tier(),
    chooser: MigChooser | None = None,
) -> tuple[Grant, ...]:
    """Cards for every container of one owner on this node, or ``Exhausted`` with the reason.
    With ``slots_per_card``, each app container takes a slot of each of its cards; ``tier`` is the
    owner's isolation (its containers share cards with one another whatever it is). A MIG request
    takes instances (``mig_fit.fit_mig``, choosing with ``chooser``; None: every profile alike),
    beside the instances the owner's containers before it took."""
    use = dict(ledger.use())
    base = slots_held(ledger.allocations)
    held = Counter(base)
    grants: list[Grant] = []
    inits = any(ask.init for ask in asks)
    for ask in asks:
        if ask.request.mig:
            taken = [share for grant in grants for share in grant.cards]
            shares = fit_mig(ledger, ask.request, chooser or MigChooser(), slots_per_card, taken)
        elif ask.init:  # alone on the node as it is
            cards = card_states(ledger, ledger.use(), base, slots_per_card)
            shares = tuple(share_for(card, ask.request) for card in choose_cards(ledger, ask.request, cards, tier))
        else:
            cards = card_states(ledger, use, held, slots_per_card)
            shares = tuple(share_for(card, ask.request) for card in choose_cards(ledger, ask.request, cards, tier))
        grants.append(Grant(ask.container, shares, ask.init))
        if not ask.init:
            for share in shares:
                use[share.uuid] = use.get(share.uuid, CardUse()).plus(share, tier.isolation)
                held[share.uuid] += 1
    # App containers took their slots one by one above (``held``); init containers alone on a
    # card take a slot each, which only the whole request can tell.
    whole = slot_problem(ledger, _planned(ledger, grants), slots_per_card) if slots_per_card and inits else ""
    if whole:
        raise Exhausted(f"{ledger.node.name}: {whole}")
    return tuple(grants)


def _planned(ledger: NodeLedger, grants: Sequence[Grant]) -> Allocation:
    return Allocation(AllocationId("-planned-"), Owner(OwnerKind.TOOL, "-planned-"), ledger.node.name, tuple(grants))
