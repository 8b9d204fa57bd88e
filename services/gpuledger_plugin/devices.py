"""The device list kubelet sees for this node: every card as ``slots_per_card`` devices (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger_core.model import Node
from gpuledger_core.slots import device_id

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True, slots=True)
class Advertised:
    id: str
    health: str
    numa: int | None


def advertised(node: Node | None, slots_per_card: int) -> tuple[Advertised, ...]:
    """Every slot of every card, unhealthy with its card; none while the node is unknown."""
    if node is None:
        return ()
    return tuple(
        Advertised(device_id(card.uuid, slot), HEALTHY if card.healthy else UNHEALTHY, card.numa)
        for card in sorted(node.cards, key=lambda c: c.index)
        for slot in range(slots_per_card)
    )
