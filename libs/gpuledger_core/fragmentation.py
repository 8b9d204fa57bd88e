"""How fragmented a node is, as the ``default`` placement policy measures it, for people to see.

The measure is the policy's own (``packing.frag.FragMeter`` over ``Workload.of`` the typical pods,
as ``make_policy("default")`` builds it): the expected GPU, in per-mille of a card, that the
workload's typical pods could not use on the node. The typical pods are those of the ledger's live
allocations, shaped as placement seeds its own workload after a restart (cards and shares; the
ledger keeps no pod CPU or memory). With no live allocation there is no workload and nothing is
fragment. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation
from gpuledger_core.packing import Ask, NodeState, from_ledger, typical
from gpuledger_core.packing.frag import FragMeter, Workload
from gpuledger_core.pods import PodAsk


@dataclass(frozen=True, slots=True)
class Fragmentation:
    """A node's (or a cluster's) fragment and the room it is part of, both in per-mille of a card."""

    milli: float = 0.0
    free_milli: int = 0

    @property
    def share(self) -> float:
        """The fragment's share of the free room, 0..1 (0 with no room free)."""
        return self.milli / self.free_milli if self.free_milli else 0.0

    def __add__(self, other: Fragmentation) -> Fragmentation:
        return Fragmentation(self.milli + other.milli, self.free_milli + other.free_milli)


def allocation_ask(allocation: Allocation) -> Ask | None:
    """The ask that scores a node for this live allocation's pod (``PodAsk.main``), or None when
    it was written without its requests (its shape is unknown)."""
    if not allocation.live or len(allocation.requests) != len(allocation.grants):
        return None
    containers = tuple(
        ContainerAsk(grant.container, request, grant.init)
        for grant, request in zip(allocation.grants, allocation.requests, strict=True)
    )
    return PodAsk(allocation.owner, containers).main()


def card_memory(ledgers: Iterable[NodeLedger]) -> int:
    """The most common card memory size (sizes memory shares, as placement's view does)."""
    sizes = Counter(card.memory_mib for ledger in ledgers for card in ledger.node.cards)
    return sizes.most_common(1)[0][0] if sizes else 0


def ledger_meter(ledgers: Iterable[NodeLedger]) -> FragMeter:
    """The ``default`` policy's meter against the typical pods of the ledgers' live allocations."""
    held = tuple(ledgers)
    memory = card_memory(held)
    asks = (allocation_ask(a) for ledger in held for a in ledger.allocations)
    return FragMeter(Workload.of(typical(ask, memory) for ask in asks if ask is not None))


def node_fragmentation(meter: FragMeter, node: NodeLedger | NodeState) -> Fragmentation:
    """The node's fragment against ``meter``'s workload, and its free room."""
    state = from_ledger(node) if isinstance(node, NodeLedger) else node
    return Fragmentation(meter.node(state), state.gpu_room)
