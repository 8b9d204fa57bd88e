"""Slots: how a node's cards appear to kubelet, and which slots a container holds.

The plugin advertises every card as ``slots_per_card`` kubelet devices with IDs
``<card uuid>::<slot>``. A container that asks for ``gpuledger.io/gpu: n`` is given n device IDs by
kubelet, one per card, and the ledger reserves exactly those IDs for it (``Grant.device_ids``), so
the IDs kubelet passes to Allocate say which container is being admitted.

Counting rules (the ledger and kubelet agree):
- a grant holds one device ID per card: ``len(device_ids) == len(cards)`` == the container's
  ``gpuledger.io/gpu``, which is what kubelet counts for it;
- a card never has more holders than slots; an exclusive holder blocks the card's other slots.
  A holder is a device ID (a pod's container) or, for an allocation without device IDs (a tool,
  which kubelet never sees, or a pod's plan not yet reserved), what ``assign_device_ids`` would
  give it: each app container on the card, or where none is, each init container
  (``slots_taken``). A card whose slots are all held is full for new holders, however much
  memory and compute it has left (``CardState.slots_free``);
- an init container reuses the IDs of its pod's app containers on the same cards, as kubelet
  reuses init containers' devices for app containers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace

from gpuledger_core.errors import Exhausted, InvalidArgument
from gpuledger_core.ids import AllocationId, CardUuid
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.memo import Memo
from gpuledger_core.model import Allocation, Grant, Node

SEPARATOR = "::"
MAX_DEVICE_ID_LEN = 63  # kubelet's limit on a device ID
MAX_SLOTS_PER_CARD = 100
DEFAULT_SLOTS_PER_CARD = 8  # the plugin's, placement's and the allocator's default: they must agree


def device_id(uuid: str, slot: int) -> str:
    if not 0 <= slot < MAX_SLOTS_PER_CARD:
        raise InvalidArgument("slot", f"must be 0..{MAX_SLOTS_PER_CARD - 1}, got {slot}")
    found = f"{uuid}{SEPARATOR}{slot}"
    if len(found) > MAX_DEVICE_ID_LEN:
        raise InvalidArgument(
            "device_id", f"{found!r} is longer than {MAX_DEVICE_ID_LEN} characters"
        )
    return found


def parse_device_id(raw: str) -> tuple[CardUuid, int]:
    uuid, sep, slot = raw.rpartition(SEPARATOR)
    if not sep or not uuid or not slot.isdigit():
        raise InvalidArgument("device_id", f"{raw!r} is not <card uuid>{SEPARATOR}<slot>")
    return CardUuid(uuid), int(slot)


def card_of(raw: str) -> CardUuid:
    return parse_device_id(raw)[0]


def cards_of(ids: Iterable[str]) -> frozenset[CardUuid]:
    return frozenset(card_of(i) for i in ids)


def node_slots(node: Node, slots_per_card: int) -> tuple[str, ...]:
    """Every device ID the node advertises, card by card."""
    return tuple(device_id(c.uuid, s) for c in node.cards for s in range(slots_per_card))


def holders_of_ids(ledger: NodeLedger) -> dict[str, AllocationId]:
    """Each reserved device ID and the live allocation that holds it."""
    held: dict[str, AllocationId] = {}
    for allocation in ledger.live():
        for grant in allocation.grants:
            for raw in grant.device_ids:
                held[raw] = allocation.id
    return held


def slots_taken(allocation: Allocation) -> Counter[CardUuid]:
    """How many of each card's slots one allocation takes (see the counting rules above)."""
    return Counter(dict(_taken(allocation)))


def _taken(allocation: Allocation) -> tuple[tuple[CardUuid, int], ...]:
    """``slots_taken`` of an allocation, remembered (``Memo``): every node state placement
    makes counts each allocation of the node again, and a node's allocations change one at a time."""
    return _TAKEN.get(allocation, _count_taken)


def _count_taken(allocation: Allocation) -> tuple[tuple[CardUuid, int], ...]:
    ids = [raw for grant in allocation.grants for raw in grant.device_ids]
    if ids:
        return tuple(Counter(card_of(raw) for raw in set(ids)).items())
    apps = Counter(share.uuid for grant in allocation.grants if not grant.init for share in grant.cards)
    inits = Counter(share.uuid for grant in allocation.grants if grant.init for share in grant.cards)
    return tuple((uuid, apps[uuid] or n) for uuid, n in (inits | apps).items())


_TAKEN: Memo[Allocation, tuple[tuple[CardUuid, int], ...]] = Memo()


def slots_held(allocations: Iterable[Allocation]) -> Counter[CardUuid]:
    """The slots every live allocation takes, per card."""
    held: Counter[CardUuid] = Counter()
    for allocation in allocations:
        if allocation.live:
            for uuid, taken in _taken(allocation):
                held[uuid] += taken
    return held


def slot_problem(ledger: NodeLedger, allocation: Allocation, slots_per_card: int) -> str:
    """Why ``allocation`` would take more slots of a card than it has free; empty when it fits."""
    held = slots_held(ledger.allocations)
    for uuid, wanted in sorted(slots_taken(allocation).items()):
        if held[uuid] + wanted > slots_per_card:
            return _all_taken(ledger, uuid, slots_per_card)
    return ""


def slots_free(held: Mapping[CardUuid, int], uuid: CardUuid, slots_per_card: int) -> int:
    return max(0, slots_per_card - held.get(uuid, 0))


def free_slots(ledger: NodeLedger, uuid: CardUuid, slots_per_card: int) -> tuple[str, ...]:
    held = holders_of_ids(ledger)
    return tuple(i for s in range(slots_per_card) if (i := device_id(uuid, s)) not in held)


def assign_device_ids(
    ledger: NodeLedger, allocation: Allocation, slots_per_card: int
) -> Allocation:
    """Give every grant of ``allocation`` that has none its device IDs, from the free slots.

    Call it on the ledger the allocation is about to be reserved in (inside the same CAS).
    Raises ``Exhausted`` when a card has no free slot: kubelet could not admit the container.
    """
    problem = slot_problem(ledger, allocation, slots_per_card)
    if problem:
        raise Exhausted(problem)
    taken = set(holders_of_ids(ledger))
    taken.update(i for g in allocation.grants for i in g.device_ids)
    grants = list(allocation.grants)
    for pos, grant in enumerate(grants):
        if not grant.init and not grant.device_ids and grant.cards:
            grants[pos] = replace(grant, device_ids=_fresh(ledger, grant, taken, slots_per_card))
    apps = [i for g in grants if not g.init for i in g.device_ids]
    for pos, grant in enumerate(grants):
        if grant.init and not grant.device_ids and grant.cards:
            grants[pos] = replace(
                grant, device_ids=_reused(ledger, grant, apps, taken, slots_per_card)
            )
    for grant in grants:
        _check(grant)
    return replace(allocation, grants=tuple(grants))


def _fresh(
    ledger: NodeLedger, grant: Grant, taken: set[str], slots_per_card: int
) -> tuple[str, ...]:
    ids = []
    for share in grant.cards:
        ids.append(_next_free(ledger, share.uuid, taken, slots_per_card))
        taken.add(ids[-1])
    return tuple(ids)


def _reused(
    ledger: NodeLedger, grant: Grant, apps: list[str], taken: set[str], slots_per_card: int
) -> tuple[str, ...]:
    ids: list[str] = []
    for share in grant.cards:
        same_card = [i for i in apps if card_of(i) == share.uuid and i not in ids]
        ids.append(
            same_card[0] if same_card else _next_free(ledger, share.uuid, taken, slots_per_card)
        )
        taken.add(ids[-1])
    return tuple(ids)


def _next_free(ledger: NodeLedger, uuid: CardUuid, taken: set[str], slots_per_card: int) -> str:
    for slot in range(slots_per_card):
        candidate = device_id(uuid, slot)
        if candidate not in taken:
            return candidate
    raise Exhausted(_all_taken(ledger, uuid, slots_per_card))


def _all_taken(ledger: NodeLedger, uuid: CardUuid, slots_per_card: int) -> str:
    card = ledger.node.card(uuid)
    label = f"card {card.index} ({uuid})" if card is not None else f"card {uuid}"
    return f"{label} on {ledger.node.name} has all {slots_per_card} slots taken (slots used up)"


def _check(grant: Grant) -> None:
    if not grant.device_ids:
        return
    if len(grant.device_ids) != len(grant.cards) or len(set(grant.device_ids)) != len(
        grant.device_ids
    ):
        raise InvalidArgument(
            f"grants[{grant.container}].device_ids", "must hold one distinct device ID per card"
        )
    if cards_of(grant.device_ids) != {s.uuid for s in grant.cards}:
        raise InvalidArgument(
            f"grants[{grant.container}].device_ids", "must name the same cards as the grant"
        )
