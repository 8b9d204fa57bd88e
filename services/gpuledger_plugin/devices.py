"""The gpu resource's device list: every card not in MIG mode as ``slots_per_card`` devices (pure).
Cards in MIG mode are listed under the MIG resources instead (``mig_resources``)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger_core.model import Card, Node
from gpuledger_core.slots import device_id

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True, slots=True)
class Advertised:
    id: str
    health: str
    numa: int | None


def advertised(node: Node | None, slots_per_card: int) -> tuple[Advertised, ...]:
    """Every slot of every card not in MIG mode, unhealthy with its card; none while the node is unknown."""
    if node is None:
        return ()
    return tuple(
        Advertised(device_id(card.uuid, slot), HEALTHY if card.healthy else UNHEALTHY, card.numa)
        for card in sorted(node.cards, key=lambda c: c.index)
        if not card.mig
        for slot in range(slots_per_card)
    )


def card_devices(card: Card, slots_per_card: int, health: str) -> tuple[Advertised, ...]:
    """The ``slots_per_card`` devices of one card."""
    return tuple(Advertised(device_id(card.uuid, slot), health, card.numa) for slot in range(slots_per_card))
