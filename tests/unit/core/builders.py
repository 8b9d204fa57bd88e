"""Small constructors for domain values, so each test states only what matters to it."""

from __future__ import annotations

from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import (
    CORE_WHOLE,
    Allocation,
    AllocState,
    Card,
    CardShare,
    Grant,
    Health,
    Node,
    Owner,
    OwnerKind,
)

NODE = NodeName("node-a")
MODEL = "NVIDIA H100 80GB HBM3"


def uuid_of(index: int) -> CardUuid:
    return CardUuid(f"GPU-{index:04d}")


def card(index: int, memory_mib: int = 8000, *, model: str = MODEL, healthy: bool = True) -> Card:
    health = Health.HEALTHY if healthy else Health.UNHEALTHY
    return Card(uuid_of(index), index, model, memory_mib, numa=0, health=health, minor=index)


def node(*memories: int, name: NodeName = NODE) -> Node:
    return Node(name, tuple(card(i, m) for i, m in enumerate(memories)))


def ledger(*memories: int) -> NodeLedger:
    return NodeLedger(node(*memories))


def share(index: int, mem_mib: int = 0, core_milli: int = 0) -> CardShare:
    return CardShare(uuid_of(index), index, mem_mib, core_milli)


def whole(c: Card) -> CardShare:
    return CardShare(c.uuid, c.index, c.memory_mib, CORE_WHOLE, exclusive=True)


def allocation(
    allocation_id: str,
    *grants: Grant,
    state: AllocState = AllocState.RESERVED,
    lease: float | None = None,
    created_at: float = 0.0,
    name: NodeName = NODE,
) -> Allocation:
    return Allocation(
        AllocationId(allocation_id),
        Owner(OwnerKind.POD, f"uid-{allocation_id}", "default", f"pod-{allocation_id}"),
        name,
        grants,
        state=state,
        created_at=created_at,
        updated_at=created_at,
        lease_expires_at=lease,
    )


def holding(allocation_id: str, *shares: CardShare, lease: float | None = None) -> Allocation:
    """An allocation whose one app container holds ``shares``."""
    return allocation(allocation_id, Grant("main", shares), lease=lease)
