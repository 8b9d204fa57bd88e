"""The inventory's NATS contract: subjects, payload shapes, and the client calls (for the CLI).

Published (see docs/nats-api.md and services/gpuledger_inventory/README.md):
- ``gpuledger.v1.inventory.<node>``: ``InventoryMessage``
- ``gpuledger.v1.heartbeat.<node>``: ``HeartbeatMessage``
- ``gpuledger.v1.inventory.<node>.health``: ``HealthTransitionMessage``, one per health change

Answered by the node's inventory (request/reply with the ``bus`` envelope):
- ``gpuledger.v1.inventory.<node>.set_health``: ``{"uuid"|"index", "healthy", "by", "note", "retire"}``
- ``gpuledger.v1.inventory.<node>.get``: ``{}`` -> the current ``InventoryMessage`` (each card's
  health, action, remediation stage and history in ``extra``: what ``gpuledger health`` shows;
  a reader may ask it, and the allocator, for the dashboard's card history)
- ``gpuledger.v1.inventory.<node>.mig.make``: ``{"card", "profile", "start", "size", "holder"}`` ->
  ``MadeMig`` as a dict: the MIG instance at that placement, made if it is not there (docs/mig.md,
  "The node's part"); asked by the node's plugin only
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_core.codec import Reader
from gpuledger_core.model import MigSlot

INVENTORY = f"{bus.SUBJECT_PREFIX}.inventory"
HEARTBEAT = f"{bus.SUBJECT_PREFIX}.heartbeat"


def inventory_subject(node: str) -> str:
    return f"{INVENTORY}.{node}"


def heartbeat_subject(node: str) -> str:
    return f"{HEARTBEAT}.{node}"


def health_subject(node: str) -> str:
    return f"{INVENTORY}.{node}.health"


def set_health_subject(node: str) -> str:
    return f"{INVENTORY}.{node}.set_health"


def get_subject(node: str) -> str:
    return f"{INVENTORY}.{node}.get"


def mig_make_subject(node: str) -> str:
    return f"{INVENTORY}.{node}.mig.make"


@dataclass(frozen=True, slots=True)
class MadeMig:
    """A MIG instance that exists, as its node's inventory answers ``mig.make``: its MIG device's
    ``uuid`` (``MIG-...``), its GPU and compute instance IDs, and its card's index and device minor
    (``/dev/nvidia<minor>``; None where NVML does not say)."""

    uuid: str
    gpu_instance: int
    compute_instance: int
    card_index: int
    minor: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "gpu_instance": self.gpu_instance,
            "compute_instance": self.compute_instance,
            "card_index": self.card_index,
            "minor": self.minor,
        }

    @staticmethod
    def from_json(raw: object) -> MadeMig:
        r = Reader(raw, "mig.make's answer")
        made = (r.text("uuid"), r.integer("gpu_instance"), r.integer("compute_instance"), r.integer("card_index"))
        return MadeMig(*made, r.opt_int("minor"))


class HeartbeatMessage(TypedDict):
    node: str
    at: float
    seq: int


class InventoryMessage(TypedDict):
    node: dict[str, Any]  # gpuledger_core.codec.node_to(Node)
    at: float
    extra: dict[str, Any]  # InventoryExtra


class HealthTransitionMessage(TypedDict):
    node: str
    at: float
    uuid: str
    health: str  # healthy | unhealthy
    reason: str
    by: str  # xid | ecc | event | lost | registration | nvml | ledger | operator:<who> | rule:<name>


async def set_card_health(
    nc: Client,
    node: str,
    card: str | int,
    healthy: bool,
    by: str,
    note: str = "",
    timeout: float = 5.0,
    retire: bool = False,
) -> dict[str, Any]:
    """Ask a node's inventory to mark a card (UUID or index) healthy or unhealthy, or (``retire``,
    with ``healthy`` false) to retire it: its holders move off, then it stays out of service.

    Returns ``{"card": {uuid, index, health, reason, since, by, remediation}, "changed": bool}``;
    raises the ``gpuledger_core.errors`` error the inventory reported (``NotFound`` for an unknown
    card, ``InvalidArgument`` for a retire where remediation is off, ``Unavailable`` when nobody
    serves that node).
    """
    key = "index" if isinstance(card, int) else "uuid"
    payload = {key: card, "healthy": healthy, "by": by, "note": note} | ({"retire": True} if retire else {})
    result: dict[str, Any] = await bus.request(nc, set_health_subject(node), payload, timeout)
    return result


async def get_inventory(nc: Client, node: str, timeout: float = 5.0) -> InventoryMessage:
    result: InventoryMessage = await bus.request(nc, get_subject(node), {}, timeout)
    return result


MAKE_TIMEOUT_S = 20.0  # how long ``make_mig`` waits: NVML makes a GPU and a compute instance in under a second to a few


async def make_mig(nc: Client, node: str, card: str, slot: MigSlot, holder: str, timeout: float) -> MadeMig:
    """Ask ``node``'s inventory for the MIG instance at ``slot`` on ``card`` (its UUID), made for
    ``holder`` (the allocation's id) if it is not there; answered once it exists with a compute
    instance. Raises the ``gpuledger_core.errors`` error the inventory reported, naming card and
    profile (``NotFound``: no such card; ``FailedPrecondition``: not in MIG mode, or the placement
    overlaps another instance; ``InvalidArgument``: a profile or placement the card's model does
    not offer; ``Unavailable``: NVML refused, or nobody serves that node)."""
    payload = {"card": card, "profile": slot.profile, "start": slot.start, "size": slot.size, "holder": holder}
    result = await bus.request(nc, mig_make_subject(node), payload, timeout)
    return MadeMig.from_json(result)
