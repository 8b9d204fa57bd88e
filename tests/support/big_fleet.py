"""A large fleet's ledgers, made without NATS, for the dashboard's tests and its benchmark: nodes
of four profiles by turn, each with pods of a few namespaces holding shares or whole cards as a
first-fit would place them, and a card in repair now and then."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from gpuledger_allocator.view import ClusterView
from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, AllocState, Health, Node, Owner, OwnerKind, Remedy, Request
from gpuledger_dev.fleet import parse_fleet

PROFILES = ("h100-sxm-8", "a100-sxm-8", "rtx3090-1", "tesla-p4-2")
NAMESPACES = ("research", "serving", "batch")
# what a node's pods ask, by turn: a 12 GiB share, a 30 % compute share, a whole card
ASKS = (Request(count=1, mem_mib=12_288), Request(count=1, mem_mib=4096, core_milli=300), Request(count=1))


class NoStore:
    """What the view asks of the ledger store: to be told of newer values (nothing here)."""

    def remember(self, *_: Any) -> None:
        pass


def offline_view(clock: Any = None) -> ClusterView:
    view = ClusterView(NoStore(), stale_after_s=1e9)  # type: ignore[arg-type]
    if clock is not None:
        view.clock = clock
    return view


def profile_node(profile: str, name: str) -> Node:
    fleet = parse_fleet(f"nodes:\n  - name: {name}\n    profile: {profile}\n", "big-fleet.yaml")
    return fleet.nodes[0].node


def node_ledger(i: int, holders: int) -> NodeLedger:
    """Node ``i``: its profile by turn, ``holders`` pods (as many as fit), its last card retired
    on every 50th node and draining on every 50th but 25."""
    profile = PROFILES[i % len(PROFILES)]
    node = _with_repairs(profile_node(profile, f"{profile.split('-')[0]}-{i:05d}"), i)
    ledger = NodeLedger(node)
    for j in range(holders):
        namespace = NAMESPACES[(i + j) % len(NAMESPACES)]
        owner = Owner(OwnerKind.POD, f"uid-{i}-{j}", namespace, f"job-{i}-{j}")
        request = ASKS[(i + j) % len(ASKS)]
        try:
            grants = fit_node(ledger, (ContainerAsk("main", request),), 16)
        except Exhausted:  # the node is full: fewer holders
            break
        allocation = Allocation(
            AllocationId(f"a-{i}-{j}"), owner, node.name, grants, AllocState.BOUND, created_at=1.7e9 + j,
            requests=(request,),
        )  # fmt: skip
        ledger = reserve(ledger, allocation)
    return ledger


def _with_repairs(node: Node, i: int) -> Node:
    remedy = Remedy.RETIRED if i % 50 == 0 else Remedy.DRAIN if i % 50 == 25 else None
    if remedy is None:
        return node
    last = replace(node.cards[-1], health=Health.UNHEALTHY, health_reason="XID 79", remedy=remedy)
    return replace(node, cards=(*node.cards[:-1], last))


def ledgers(count: int, holders: int = 3) -> Iterator[NodeLedger]:
    for i in range(count):
        yield node_ledger(i, holders)


def fill(view: ClusterView, count: int, holders: int = 3) -> ClusterView:
    """``view`` with ``count`` nodes applied (revisions from 1)."""
    for revision, ledger in enumerate(ledgers(count, holders), start=1):
        view.apply(NodeName(ledger.node.name), ledger, revision)
    return view
