"""The health of every device of this node's pool, from the node's cards in its ledger (pure).

kubelet asks each DRA plugin for its devices' health (``DRAResourceHealth``, ``server.DraHealth``)
and shows it in the status of the containers that use them. The devices are named as the node's
ResourceSlices name them: a card ``gpu-<index>``; a card in MIG mode every placement of every
profile of its model, ``gpu-<index>-mig-<profile>-<start>`` (``dra_mig.device_name``). That is
more than the slices publish (they leave out placements that cannot be made beside the instances
that exist), so a device kubelet prepared is reported whatever the slices publish now.

A card is unhealthy while the inventory says so (its health, and the repair under way: its
remedy); every MIG placement of an unhealthy card is too. A MIG instance that faulted (an XID
inside it, ``MigInstance.fault``) makes its own placement unhealthy and no other.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpuledger_core.dra_mig import device_name as mig_device_name
from gpuledger_core.mig import model_of
from gpuledger_core.model import Card, MigInstance, MigSlot, Node

MESSAGE_MAX = 1024  # kubelet keeps at most this many characters of a message


class Health(StrEnum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One device of the pool: its name in the slices, its health and, when unhealthy, why."""

    device: str
    health: Health
    message: str = ""


def devices_of(node: Node | None) -> tuple[DeviceHealth, ...]:
    """Every device of ``node``'s pool with its health, cards in index order (none: no node)."""
    if node is None:
        return ()
    found: list[DeviceHealth] = []
    for card in sorted(node.cards, key=lambda c: c.index):
        found.extend(_of_mig_card(card) if card.mig else (_of_card(card),))
    return tuple(found)


def card_device(card: Card) -> str:
    return f"gpu-{card.index}"


def _of_card(card: Card) -> DeviceHealth:
    if card.healthy:
        return DeviceHealth(card_device(card), Health.HEALTHY)
    return DeviceHealth(card_device(card), Health.UNHEALTHY, _card_problem(card))


def _of_mig_card(card: Card) -> list[DeviceHealth]:
    model = model_of(card)
    if model is None:
        return []  # a model without a MIG table: the slices publish nothing of it
    instances = {i.slot: i for i in card.instances}
    found: list[DeviceHealth] = []
    for profile in model.profiles:
        for start in profile.starts:
            slot = MigSlot(profile.name, start, profile.memory_slices)
            found.append(_of_placement(card, slot, instances.get(slot)))
    return found


def _of_placement(card: Card, slot: MigSlot, instance: MigInstance | None) -> DeviceHealth:
    name = mig_device_name(card.index, slot.profile, slot.start)
    if not card.healthy:
        return DeviceHealth(name, Health.UNHEALTHY, _card_problem(card))
    if instance is not None and instance.fault:
        remedy = f" (remedy: {instance.remedy.value})" if instance.remedy.value else ""
        problem = f"MIG instance {slot.profile} at {slot.start} of card {card.index} ({card.uuid}): "
        return DeviceHealth(name, Health.UNHEALTHY, _bounded(f"{problem}{instance.fault}{remedy}"))
    return DeviceHealth(name, Health.HEALTHY)


def _card_problem(card: Card) -> str:
    reason = card.health_reason or "reported unhealthy by the node's inventory"
    remedy = f" (remedy: {card.remedy.value})" if card.remedy.value else ""
    return _bounded(f"card {card.index} ({card.uuid}): {reason}{remedy}")


def _bounded(message: str) -> str:
    """At most ``MESSAGE_MAX`` characters, as kubelet would cut it (``...`` at the end)."""
    return message if len(message) <= MESSAGE_MAX else message[: MESSAGE_MAX - 3] + "..."
