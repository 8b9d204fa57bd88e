"""Does a request fit a node, and on which cards: the simple built-in fit.

The placement service has the topology- and fragmentation-aware choice; this is what the allocator
uses on its own, and what placement builds on: per-card room, model selectors, health.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuledger_core.errors import Exhausted
from gpuledger_core.ids import CardUuid
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import CORE_WHOLE, Card, CardShare, Grant, Request
from gpuledger_core.usage import CardFree, CardUse, free_of


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    container: str
    request: Request
    init: bool = False


def share_for(card: Card, request: Request) -> CardShare:
    if request.exclusive:
        return CardShare(card.uuid, card.index, card.memory_mib, CORE_WHOLE, exclusive=True)
    return CardShare(card.uuid, card.index, request.mem_mib or 0, request.core_milli or 0)


def card_fits(card: Card, free: CardFree, request: Request) -> bool:
    if not card.healthy or not request.allows(card.model):
        return False
    if request.exclusive:
        return free.idle
    return free.fits(request.mem_mib or 0, request.core_milli or 0)


def frees(ledger: NodeLedger, use: Mapping[CardUuid, CardUse] | None = None) -> dict[CardUuid, CardFree]:
    use = ledger.use() if use is None else use
    return {card.uuid: free_of(card, use.get(card.uuid)) for card in ledger.node.cards}


def why_not(ledger: NodeLedger, request: Request, free: dict[CardUuid, CardFree]) -> str:
    """A sentence a person understands about why ``request`` does not fit this node."""
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
    fitting = sum(1 for c in healthy if card_fits(c, free[c.uuid], request))
    return f"{fitting} card(s) with room of the {request.count} needed"


def choose_cards(ledger: NodeLedger, request: Request, free: dict[CardUuid, CardFree]) -> list[Card]:
    """The simple choice: exclusive takes the lowest free indexes, shared the tightest fit."""
    fitting = [c for c in ledger.node.cards if card_fits(c, free[c.uuid], request)]
    if len(fitting) < request.count:
        raise Exhausted(f"{ledger.node.name}: {why_not(ledger, request, free)}")
    if not request.exclusive:
        fitting.sort(key=lambda c: (free[c.uuid].mem_mib, free[c.uuid].core_milli, c.index))
    return fitting[: request.count]


def fit_node(ledger: NodeLedger, asks: Sequence[ContainerAsk]) -> tuple[Grant, ...]:
    """Cards for every container of one owner on this node, or ``Exhausted`` with the reason."""
    use = dict(ledger.use())
    grants: list[Grant] = []
    for ask in asks:
        free = frees(ledger, use if not ask.init else ledger.use())
        cards = choose_cards(ledger, ask.request, free)
        shares = tuple(share_for(card, ask.request) for card in cards)
        grants.append(Grant(ask.container, shares, ask.init))
        if not ask.init:
            for share in shares:
                use[share.uuid] = use.get(share.uuid, CardUse()).plus(share)
    return tuple(grants)
