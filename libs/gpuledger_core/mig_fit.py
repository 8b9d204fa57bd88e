"""The one MIG fit: which cards and placements of a node a MIG request takes (docs/mig.md,
"How placement places MIG").

A MIG request (``Request.mig``) asks for ``count`` instances, one per card, each of a named profile
or of the smallest profile of the card's model that holds its memory and compute. ``fit_mig`` takes
them one after another, each on a card not yet taken by the request, where the chooser
(``mig_place.MigChooser``) says it costs least of the recent MIG workload: an existing free
instance of the profile, or a free placement (a new instance, made on demand by the node). What
the node's live allocations hold, and what the same owner has already planned on the node
(``taken``: its other containers), are held. With ``slots_per_card``, a card whose kubelet slots
are all held takes no new holder, and each instance takes a slot, as a card's share does.

``mig_score`` is a node's score for a planned set of instances (higher is better): minus what they
take of the node's worth for the workload, then, far smaller, one for each new instance
(reconfigurations) and the free memory slices of the cards taken (packing), as the chooser ranks
one instance's options. The extender ranks nodes by it; the allocator's fit, placement's filter,
prioritize and bind, and DRA's claim allocator all place MIG through ``fit_mig``.

Pure: no I/O. Every share ``fit_mig`` returns is one ``ledger.reserve`` takes (``mig.mig_problem``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from gpuledger_core.errors import Exhausted
from gpuledger_core.ids import CardUuid
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.mig import held_slots, model_of, profile_for, share_of, unheld
from gpuledger_core.mig_place import CardView, MigChooser
from gpuledger_core.mig_profiles import mig_model
from gpuledger_core.model import CORE_WHOLE, MIG_SMALLEST, Card, CardShare, MigSlot, Request
from gpuledger_core.room import CardState as RoomCard
from gpuledger_core.slots import slots_held

MADE_COST = 1e-3  # a new instance (a reconfiguration), beside the worth it takes
FREE_COST = 1e-5  # a free memory slice of a card taken (fuller cards first)


def fit_mig(
    ledger: NodeLedger,
    request: Request,
    chooser: MigChooser,
    slots_per_card: int | None = None,
    taken: Sequence[CardShare] = (),
) -> tuple[CardShare, ...]:
    """``request.count`` instances on distinct cards of the node in MIG mode, each a
    ``mig.share_of`` share, beside the live allocations and ``taken`` (shares the same owner has
    planned on the node). ``Exhausted`` naming node, profile and what is short."""
    if not request.mig:
        raise ValueError("fit_mig places MIG requests only (Request.mig is empty)")
    node = ledger.node
    held = _held(ledger, taken)
    slots = _slots(ledger, taken) if slots_per_card is not None else None
    found: list[CardShare] = []
    used: set[CardUuid] = set()
    for _ in range(request.count):
        cards = [
            card
            for card in node.cards
            if card.uuid not in used and (slots is None or slots_per_card is None or slots[card.uuid] < slots_per_card)
        ]
        views = [CardView(card, tuple(held.get(card.uuid, ()))) for card in cards]
        chosen = chooser.choose(views, request)
        if chosen is None:
            raise Exhausted(f"{node.name}: {_why_not(ledger, request, held, slots, slots_per_card, len(found))}")
        at, option = chosen
        card = cards[at]
        share = _share(card, option.slot)
        found.append(share)
        used.add(card.uuid)
        held.setdefault(card.uuid, []).append(option.slot)
    return tuple(found)


def mig_score(
    ledger: NodeLedger, shares: Sequence[CardShare], chooser: MigChooser, taken: Sequence[CardShare] = ()
) -> float:
    """How good taking the MIG ``shares`` (a plan of ``fit_mig``) on this node is, higher better:
    minus the worth they take from their cards for the chooser's workload, ``MADE_COST`` per new
    instance and ``FREE_COST`` per free memory slice of the cards taken before them. ``taken``:
    held already by the same owner (its containers planned before)."""
    held = _held(ledger, taken)
    cost = 0.0
    by_card: dict[CardUuid, list[MigSlot]] = {}
    for share in shares:
        if share.mig is not None:
            by_card.setdefault(share.uuid, []).append(share.mig)
    for uuid, slots in by_card.items():
        card = ledger.node.card(uuid)
        model = model_of(card) if card is not None else None
        if card is None or model is None:
            continue
        kept = tuple(held.get(uuid, ()))
        busy, free = CardView(card, kept).state()  # instances made on demand that nobody holds left out
        after = busy | frozenset(slots), free - frozenset(slots)
        cost += chooser.worth(model, busy, free) - chooser.worth(model, *after)
        existing = frozenset(unheld(card, kept))
        made = sum(1 for s in slots if s not in existing)
        cost += MADE_COST * made + FREE_COST * (model.memory_slices - sum(s.size for s in busy))
    return -cost


def mig_impossible(cards: Sequence[RoomCard], request: Request) -> str:
    """Why ``request`` can never fit a node of ``cards`` (those of the models it allows), however
    long it waits: fewer than ``count`` cards whose model offers its profile. A card's mode and
    what is held change; its model does not. Empty when it might fit."""
    offering = sum(1 for c in cards if (m := mig_model(c.model, c.mem_total)) is not None and profile_for(m, request))
    if offering >= request.count:
        return ""
    models = ", ".join(sorted({c.model for c in cards}))
    return f"has {offering} card(s) whose model offers MIG {asked(request)} ({models}), the pod needs {request.count}"


def asked(request: Request) -> str:
    """The profile a request asks for, in words: its name, or what sizes the smallest."""
    if request.mig != MIG_SMALLEST:
        return request.mig
    parts = []
    if request.mem_mib is not None:
        parts.append(f"{request.mem_mib} MiB")
    if request.core_milli is not None:
        parts.append(f"{request.core_milli * 100 / CORE_WHOLE:g}% compute")
    return f"the smallest profile holding {' and '.join(parts)}"


def _held(ledger: NodeLedger, taken: Sequence[CardShare]) -> dict[CardUuid, list[MigSlot]]:
    """Per card in MIG mode, the placements its live holders and ``taken`` hold."""
    held = {card.uuid: held_slots(ledger.allocations, card) for card in ledger.node.cards if card.mig}
    for share in taken:
        if share.mig is not None:
            held.setdefault(share.uuid, []).append(share.mig)
    return held


def _slots(ledger: NodeLedger, taken: Sequence[CardShare]) -> Counter[CardUuid]:
    slots = slots_held(ledger.allocations)
    slots.update(share.uuid for share in taken)
    return slots


def _share(card: Card, slot: MigSlot) -> CardShare:
    model = model_of(card)
    profile = model.by_name(slot.profile) if model is not None else None
    assert profile is not None  # the chooser offers the model's profiles only
    return share_of(card, profile, slot.start)


def _why_not(
    ledger: NodeLedger,
    request: Request,
    held: dict[CardUuid, list[MigSlot]],
    slots: Counter[CardUuid] | None,
    slots_per_card: int | None,
    found: int,
) -> str:
    """Why no (further) card takes an instance: the first thing short, cards named by index."""
    what = f"MIG {asked(request)}"
    cards = [c for c in ledger.node.cards if request.allows(c.model)]
    if not cards:
        return f"no card of model {'|'.join(sorted(request.models))} for {what}"
    mig = [c for c in cards if c.mig]
    if not mig:
        return f"no card in MIG mode for {what} ({_indexes(cards)} in {cards[0].mode} mode)"
    offering = [c for c in mig if (m := model_of(c)) is not None and profile_for(m, request) is not None]
    if not offering:
        models = ", ".join(sorted({c.model for c in mig}))
        return f"no card in MIG mode offers {what} ({models})"
    healthy = [c for c in offering if c.healthy]
    if not healthy:
        return f"{what}: {_indexes(offering)} unhealthy"
    if slots is not None and slots_per_card is not None:
        open_ = [c for c in healthy if slots[c.uuid] < slots_per_card]
        if not open_:
            return f"{what}: {_indexes(healthy)} with all {slots_per_card} kubelet slots taken (slots used up)"
    if found:
        short = f"{found} of the {request.count} instances found room, one per card"
        whole = [c for c in cards if not c.mig]
        beside = f" ({_indexes(whole)} in {whole[0].mode} mode)" if whole else ""
        return f"{what}: {short}; no other card has a free placement{beside}"
    return f"no free placement of {what}: {_indexes(healthy)} full"


def _indexes(cards: Sequence[Card]) -> str:
    numbers = [str(c.index) for c in cards]
    if len(numbers) == 1:
        return f"card {numbers[0]}"
    return f"cards {', '.join(numbers[:-1])} and {numbers[-1]}"
