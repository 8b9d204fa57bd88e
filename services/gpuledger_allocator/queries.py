"""Read-only questions answered from the replica's view of the ledger."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

import orjson

from gpuledger_allocator.view import ClusterView
from gpuledger_core.errors import InvalidArgument
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


DEFAULT_ALLOCATIONS_PAGE = 1000  # allocations per ListAllocations answer unless the caller asks otherwise
MAX_ALLOCATIONS_PAGE = 10_000


def allocations_page(
    view: ClusterView,
    where: AllocationFilter,
    page_size: int = 0,
    page_token: str = "",
    shown: Callable[[Allocation], bool] = lambda _: True,
) -> tuple[list[Allocation], str]:
    """One page of the allocations ``where`` matches (and ``shown`` lets the caller see): up to
    ``page_size`` (0: ``DEFAULT_ALLOCATIONS_PAGE``; at most ``MAX_ALLOCATIONS_PAGE``) by node and
    allocation ID after the position ``page_token`` names, and the next page's token ("" on the
    last). A page reads only the nodes it reaches, whatever the fleet's size."""
    if page_size < 0:
        raise InvalidArgument("page_size", f"must not be negative, got {page_size}")
    size = min(page_size or DEFAULT_ALLOCATIONS_PAGE, MAX_ALLOCATIONS_PAGE)
    after = _position(page_token)
    if where.node:
        names = [NodeName(where.node)] if where.node in view.ledgers and where.node >= after[0] else []
    else:
        names = sorted(name for name in view.ledgers if name >= after[0])
    page: list[Allocation] = []
    for name in names:
        allocations = view.ledgers[name].allocations
        found = sorted((a for a in allocations if where.matches(a) and shown(a)), key=lambda a: a.id)
        for allocation in found:
            if (name, allocation.id) <= after:
                continue
            if len(page) == size:  # one more exists: the next page starts after the last one here
                return page, _token(page[-1])
            page.append(allocation)
    return page, ""


def _token(last: Allocation) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([last.node, last.id])).decode()


def _position(token: str) -> tuple[str, str]:
    """Where the page ``token`` names starts (after this node and allocation ID); ("", "") for none."""
    if not token:
        return "", ""
    try:
        node, allocation_id = orjson.loads(base64.urlsafe_b64decode(token.encode()))
    except (binascii.Error, orjson.JSONDecodeError, ValueError, TypeError, UnicodeEncodeError):
        raise InvalidArgument("page_token", "is not a token a previous page gave") from None
    if not isinstance(node, str) or not isinstance(allocation_id, str):
        raise InvalidArgument("page_token", "is not a token a previous page gave")
    return node, allocation_id


def cluster(view: ClusterView, node: str = "", model: str = "") -> list[NodeStatus]:
    names = sorted(_listed(view)) if not node else [NodeName(node)] if node in _listed(view) else []
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
    names = sorted(name for name in _listed(view) if name > after)
    page = [status for name in names[:size] if (status := node_in(view, name, model)) is not None]
    return page, names[size - 1] if len(names) > size else ""


def node_in(view: ClusterView, name: NodeName, model: str = "") -> NodeStatus | None:
    """The node's status as ``cluster`` lists it: stale or not, only cards of ``model`` if set; no
    cards and why for a node whose ledger value cannot be read."""
    if view.unreadable and name in view.unreadable:
        return NodeStatus(name, (), view.stale(name), view.revisions.get(name, 0), view.unreadable[name])
    status = view.status(name)
    if status is None:
        return None
    cards = status.cards if not model else tuple(c for c in status.cards if c.card.model == model)
    return replace(status, cards=cards, stale=view.stale(name))


def _listed(view: ClusterView) -> Collection[NodeName]:
    """The nodes ``cluster`` lists: those of the ledger, and those whose value cannot be read."""
    return view.ledgers.keys() | view.unreadable.keys() if view.unreadable else view.ledgers
