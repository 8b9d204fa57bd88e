"""Read-only questions answered from the replica's view of the ledger."""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger_allocator.view import ClusterView
from gpuledger_core.model import Allocation
from gpuledger_core.status import NodeStatus, node_status


@dataclass(frozen=True, slots=True)
class AllocationFilter:
    node: str = ""
    owner_kind: str = ""
    owner_id: str = ""
    namespace: str = ""
    include_released: bool = False

    def matches(self, a: Allocation) -> bool:
        return (
            (self.include_released or a.live)
            and (not self.node or a.node == self.node)
            and (not self.owner_kind or a.owner.kind.value == self.owner_kind)
            and (not self.owner_id or a.owner.id == self.owner_id)
            and (not self.namespace or a.owner.namespace == self.namespace)
        )


def list_allocations(view: ClusterView, where: AllocationFilter) -> list[Allocation]:
    found = [a for ledger in view.ledgers.values() for a in ledger.allocations if where.matches(a)]
    return sorted(found, key=lambda a: (a.created_at, a.id))


def cluster(view: ClusterView, node: str = "", model: str = "") -> list[NodeStatus]:
    return [
        node_status(
            ledger,
            stale=view.stale(name),
            revision=view.revisions.get(name, 0),
            model=model,
            usage=view.usage.get(name),
        )
        for name, ledger in sorted(view.ledgers.items())
        if not node or name == node
    ]
