"""Two writers on one node's key, against a real nats-server: what a lost race costs and where the
next write goes (docs/ledger.md, "Several replicas").

A followed store (a watch feeds it) that lost a race takes the winning value from its watch
instead of reading the key; a reservation whose race was lost tries the next node first; the
built-in finder ranks a node another process has just written after the others.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client

from gpuledger_allocator.finder import BuiltinFinder
from gpuledger_allocator.reserving import AllocateCall
from gpuledger_allocator.service import AllocatorService
from gpuledger_allocator.view import ClusterView
from gpuledger_common.store import Following, LedgerStore, Transition
from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, Card, Node, Owner, OwnerKind, Request
from tests.support.replicas import wait_for

N1, N2 = NodeName("n1"), NodeName("n2")
MIB = 16_000


def empty(node: NodeName) -> NodeLedger:
    return NodeLedger(Node(node, (Card(CardUuid(f"GPU-{node}"), 0, "A100", MIB),)))


def take(node: NodeName, allocation_id: str, mem: int) -> Transition:
    def transition(current: NodeLedger | None) -> NodeLedger:
        assert current is not None
        grants = fit_node(current, [ContainerAsk("", Request(mem_mib=mem))])
        owner = Owner(OwnerKind.TOOL, allocation_id)
        return reserve(current, Allocation(AllocationId(allocation_id), owner, node, grants))

    return transition


class Gate:
    """A watch's values on their way into a store: let through, or held back until ``open``."""

    def __init__(self, store: LedgerStore) -> None:
        self.store, self.held = store, False
        self._waiting: list[tuple[NodeName, NodeLedger | None, int]] = []

    def apply(self, node: NodeName, ledger: NodeLedger | None, revision: int) -> None:
        if self.held:
            self._waiting.append((node, ledger, revision))
        else:
            self.store.remember(node, ledger, revision)

    def open(self) -> None:
        self.held = False
        for value in self._waiting:
            self.store.remember(*value)
        self._waiting.clear()


async def followed(store: LedgerStore) -> tuple[Gate, Following]:
    gate = Gate(store)
    ready = asyncio.Event()
    following = await store.follow_values(gate.apply, ready.set)
    await asyncio.wait_for(ready.wait(), 10)
    return gate, following


async def known_at(store: LedgerStore, node: NodeName, revision: int) -> None:
    async def there() -> bool:
        known = store._known.latest.get(node)
        return known is not None and known[1] >= revision

    await wait_for(there, what=f"{node} at revision {revision}")


async def lost_races(store: LedgerStore, count: int) -> bool:
    return store.stats.conflicts >= count


def allocations_of(ledger: NodeLedger | None) -> set[str]:
    return {a.id for a in ledger.live()} if ledger is not None else set()


async def test_a_followed_store_takes_the_winning_value_from_its_watch_not_from_a_read(nc: Client) -> None:
    a, b = await LedgerStore.open(nc), await LedgerStore.open(nc)
    a.catch_up_s = 10.0  # the test decides when the watch delivers
    first = await b.mutate(N1, lambda _: empty(N1))
    gate, following = await followed(a)
    try:
        await known_at(a, N1, first.revision)
        gate.held = True
        won = await b.mutate(N1, take(N1, "b", 1000))  # a has not seen this one
        writing = asyncio.create_task(a.mutate(N1, take(N1, "a", 1000)))
        await wait_for(lambda: lost_races(a, 1), what="a's lost race")
        assert not writing.done()  # waiting for the watch, not reading the key
        gate.open()
        written = await asyncio.wait_for(writing, 10)
        assert written.revision == won.revision + 1
        assert allocations_of(written.new) == {"a", "b"}
        assert (a.stats.reads, a.stats.conflicts, a.stats.writes) == (0, 1, 1)
        now, _ = await b.read(N1)
        assert allocations_of(now) == {"a", "b"}
    finally:
        await following.stop()


async def test_a_followed_store_whose_watch_lags_reads_the_key_after_its_wait(nc: Client) -> None:
    a, b = await LedgerStore.open(nc), await LedgerStore.open(nc)
    a.catch_up_s = 0.2
    first = await b.mutate(N1, lambda _: empty(N1))
    gate, following = await followed(a)
    try:
        await known_at(a, N1, first.revision)
        gate.held = True  # and never opened: the watch brings nothing
        await b.mutate(N1, take(N1, "b", 1000))
        written = await asyncio.wait_for(a.mutate(N1, take(N1, "a", 1000)), 10)
        assert allocations_of(written.new) == {"a", "b"}
        assert (a.stats.reads, a.stats.conflicts, a.stats.writes) == (1, 1, 1)
    finally:
        await following.stop()


async def test_a_store_that_lost_a_race_does_not_take_a_stale_verdict(nc: Client) -> None:
    """The winner filled the card: the loser, catching up from its watch, is refused on what is
    there now (a fresh read confirms it), and nothing is over capacity."""
    a, b = await LedgerStore.open(nc), await LedgerStore.open(nc)
    a.catch_up_s = 10.0
    first = await b.mutate(N1, lambda _: empty(N1))
    gate, following = await followed(a)
    try:
        await known_at(a, N1, first.revision)
        gate.held = True
        await b.mutate(N1, take(N1, "b", MIB - 100))
        writing = asyncio.create_task(a.mutate(N1, take(N1, "a", 1000)))
        await wait_for(lambda: lost_races(a, 1), what="a's lost race")
        gate.open()
        try:
            await asyncio.wait_for(writing, 10)
        except Exhausted:
            pass
        else:
            raise AssertionError("a reserved room the winner had taken")
        now, _ = await b.read(N1)
        assert allocations_of(now) == {"b"}
    finally:
        await following.stop()


async def test_the_store_names_the_nodes_another_process_wrote_lately_not_its_own(nc: Client) -> None:
    a, b = await LedgerStore.open(nc), await LedgerStore.open(nc)
    await b.mutate(N1, lambda _: empty(N1))
    await b.mutate(N2, lambda _: empty(N2))
    _, following = await followed(a)
    try:
        mine = await a.mutate(N2, take(N2, "a", 1000))
        await known_at(a, N2, mine.revision)
        assert a.won_elsewhere(60.0) == {N1}  # b wrote n1 last; a wrote n2 after b
        theirs = await b.mutate(N2, take(N2, "b", 1000))
        await known_at(a, N2, theirs.revision)
        assert a.won_elsewhere(60.0) == {N1, N2}
        assert a.won_elsewhere(0.0) == set()
    finally:
        await following.stop()


async def test_the_builtin_finder_ranks_a_node_another_replica_just_wrote_after_the_others(nc: Client) -> None:
    a, b = await LedgerStore.open(nc), await LedgerStore.open(nc)
    await a.mutate(N1, lambda _: empty(N1))
    await a.mutate(N2, lambda _: empty(N2))
    view = ClusterView(a)
    watching = asyncio.create_task(view.run())
    try:
        await asyncio.wait_for(view.ready.wait(), 10)
        mine = await a.mutate(N1, take(N1, "a1", 4000))  # n1 the fuller, written by a itself
        await known_at(a, N1, mine.revision)
        asks = [ContainerAsk("", Request(mem_mib=1000))]
        spreading, packing = BuiltinFinder(won_elsewhere_s=60.0), BuiltinFinder(won_elsewhere_s=0.0)
        assert [c.node for c in await spreading.candidates(view, asks)] == [N1, N2]
        theirs = await b.mutate(N1, take(N1, "b1", 1000))  # another replica wins n1
        await known_at(a, N1, theirs.revision)
        assert [c.node for c in await spreading.candidates(view, asks)] == [N2, N1]
        assert [c.node for c in await packing.candidates(view, asks)] == [N1, N2]  # fullest first alone
    finally:
        watching.cancel()


async def stale_service(nc: Client, fill_n2: bool) -> tuple[AllocatorService, LedgerStore]:
    """A replica whose view (and store) last saw n1 fuller than n2; then another writer wins n1,
    so the replica's first write there loses its race. Neither store follows a watch."""
    a, b = await LedgerStore.open(nc), await LedgerStore.open(nc)
    await b.mutate(N1, lambda _: empty(N1))
    await b.mutate(N1, take(N1, "b1", 4000))
    await b.mutate(N2, lambda _: empty(N2))
    if fill_n2:
        await b.mutate(N2, take(N2, "b2", MIB))
    view = ClusterView(a)
    for node in (N1, N2):
        ledger, revision = await a.read(node)
        view.apply(node, ledger, revision)
    await b.mutate(N1, take(N1, "b3", 1000))  # the replica has not seen this
    return AllocatorService(a, view, BuiltinFinder()), b


def one_card(owner: str, mem: int) -> AllocateCall:
    return AllocateCall(Owner(OwnerKind.TOOL, owner), (ContainerAsk("", Request(count=1, mem_mib=mem)),))


async def test_a_reservation_that_lost_its_race_tries_the_next_node_first(nc: Client) -> None:
    service, other = await stale_service(nc, fill_n2=False)
    allocation, existing = await service.allocate(one_card("t1", 1000))
    assert (allocation.node, existing) == (N2, False)
    assert (service.store.stats.conflicts, service.store.stats.gave_up) == (1, 0)
    n1, _ = await other.read(N1)
    n2, _ = await other.read(N2)
    assert allocations_of(n1) == {"b1", "b3"} and allocations_of(n2) == {allocation.id}


async def test_a_reservation_that_lost_its_race_goes_back_to_that_node_when_no_other_fits(nc: Client) -> None:
    service, other = await stale_service(nc, fill_n2=True)
    allocation, _ = await service.allocate(one_card("t2", 1000))
    assert allocation.node == N1  # tried again at the end, on a fresh read, with full retries
    assert service.store.stats.gave_up == 0
    n1, _ = await other.read(N1)
    assert allocations_of(n1) == {"b1", "b3", allocation.id}
