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
"""

from __future__ import annotations

from typing import Any, TypedDict

from nats.aio.client import Client

from gpuledger_common import bus

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
