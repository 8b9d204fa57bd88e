"""The built-in finder judges a node again only when what its verdict reads changed: the node and
its live allocations' grants, not the revision alone (a commit, or a reservation and its release,
leave the verdict as it was)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from nats.aio.client import Client

from gpuledger_allocator.finder import BuiltinFinder
from gpuledger_allocator.view import ClusterView
from gpuledger_common.store import LedgerStore
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, commit, release, reserve
from gpuledger_core.model import Allocation, Card, Node, Owner, OwnerKind, Request

N1, N2 = NodeName("n1"), NodeName("n2")
MIB = 16_000
ASKS = [ContainerAsk("", Request(mem_mib=1000))]


def empty(node: NodeName, cards: int = 2) -> NodeLedger:
    return NodeLedger(Node(node, tuple(Card(CardUuid(f"GPU-{node}-{i}"), i, "A100", MIB) for i in range(cards))))


def take(allocation_id: str, mem: int) -> Callable[[NodeLedger | None], NodeLedger]:
    def transition(current: NodeLedger | None) -> NodeLedger:
        assert current is not None
        grants = fit_node(current, [ContainerAsk("", Request(mem_mib=mem))])
        owner = Owner(OwnerKind.TOOL, allocation_id)
        return reserve(current, Allocation(AllocationId(allocation_id), owner, current.node.name, grants))

    return transition


@pytest.fixture
async def fleet(nc: Client) -> tuple[LedgerStore, ClusterView]:
    store = await LedgerStore.open(nc)
    view = ClusterView(store)
    await store.mutate(N1, lambda _: empty(N1))
    await store.mutate(N2, lambda _: empty(N2))
    await store.mutate(N1, take("a0", 4000))
    return store, view


async def write(store: LedgerStore, view: ClusterView, node: NodeName, transition: Callable[..., NodeLedger]) -> None:
    """Write, then show the view the new value as its watch would."""
    written = await store.mutate(node, transition)
    view.apply(node, written.new, written.revision)


async def load(store: LedgerStore, view: ClusterView) -> None:
    for node in (N1, N2):
        ledger, revision = await store.read(node)
        view.apply(node, ledger, revision)


async def ranked(finder: BuiltinFinder, view: ClusterView) -> list[tuple[NodeName, object]]:
    return [(c.node, c.cards) for c in await finder.candidates(view, ASKS)]


async def test_a_commit_and_a_released_reservation_keep_the_verdict(
    fleet: tuple[LedgerStore, ClusterView],
) -> None:
    store, view = fleet
    await load(store, view)
    finder = BuiltinFinder(won_elsewhere_s=0.0)
    first = await ranked(finder, view)
    assert [node for node, _ in first] == [N1, N2]  # the fuller first
    assert finder.judgements == 2

    await write(store, view, N1, take("a1", 2000))
    await write(store, view, N1, lambda ledger: release(ledger, AllocationId("a1"), time.time()))
    assert await ranked(finder, view) == first  # n1 holds what it held: nothing judged
    assert finder.judgements == 2

    await write(store, view, N1, lambda ledger: commit(ledger, AllocationId("a0"), time.time()))
    assert await ranked(finder, view) == first
    assert finder.judgements == 2

    await write(store, view, N2, take("b1", 9000))  # n2 now the fuller: judged again
    again = await ranked(finder, view)
    assert [node for node, _ in again] == [N2, N1]
    assert finder.judgements == 3
    assert again == await ranked(BuiltinFinder(won_elsewhere_s=0.0), view)  # what a fresh finder finds


async def test_a_changed_inventory_is_judged_again(fleet: tuple[LedgerStore, ClusterView]) -> None:
    store, view = fleet
    await load(store, view)
    finder = BuiltinFinder(won_elsewhere_s=0.0)
    await ranked(finder, view)
    await write(store, view, N2, lambda ledger: NodeLedger(empty(N2, cards=1).node, ledger.allocations))
    assert await ranked(finder, view) == await ranked(BuiltinFinder(won_elsewhere_s=0.0), view)
    assert finder.judgements == 3


async def test_a_full_node_freed_by_a_release_fits_again(fleet: tuple[LedgerStore, ClusterView]) -> None:
    store, view = fleet
    await write(store, view, N2, take("b1", MIB))
    await write(store, view, N2, take("b2", MIB))
    await load(store, view)
    finder = BuiltinFinder(won_elsewhere_s=0.0)
    assert [node for node, _ in await ranked(finder, view)] == [N1]
    await write(store, view, N2, lambda ledger: release(ledger, AllocationId("b2"), time.time()))
    assert [node for node, _ in await ranked(finder, view)] == [N2, N1]
