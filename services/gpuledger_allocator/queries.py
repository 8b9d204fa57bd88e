"""Read-only questions answered from the replica's view of the ledger."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuledger_allocator.view import ClusterView
from gpuledger_core.ids import NodeName
from gpuledger_core.model import Allocation
from gpuledger_core.status import NodeStatus


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
    names = sorted(view.ledgers) if not node else [NodeName(node)] if node in view.ledgers else []
    return [status for name in names if (status := node_in(view, name, model)) is not None]


DEFAULT_PAGE = 100  # nodes per GetCluster answer unless the caller asks otherwise
MAX_PAGE = 1000


def cluster_page(
    view: ClusterView, node: str = "", model: str = "", page_size: int = 0, after: str = ""
) -> tuple[list[NodeStatus], str]:
    """One page of ``cluster``: up to ``page_size`` nodes (0: ``DEFAULT_PAGE``; at most
    ``MAX_PAGE``) by name after the node named ``after``, and the token of the next page ("" on
    the last). A page is a few milliseconds of the event loop, whatever the fleet's size."""
    size = min(page_size or DEFAULT_PAGE, MAX_PAGE)
    if node:
        return cluster(view, node, model), ""
    names = sorted(name for name in view.ledgers if name > after)
    page = [status for name in names[:size] if (status := node_in(view, name, model)) is not None]
    return page, names[size - 1] if len(names) > size else ""


def node_in(view: ClusterView, name: NodeName, model: str = "") -> NodeStatus | None:
    """The node's status as ``cluster`` lists it: stale or not, only cards of ``model`` if set."""
    status = view.status(name)
    if status is None:
        return None
    cards = status.cards if not model else tuple(c for c in status.cards if c.card.model == model)
    return replace(status, cards=cards, stale=view.stale(name))
