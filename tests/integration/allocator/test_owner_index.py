"""The owner index against a real nats-server: records expire, a retry after that is answered from
the view, and a record whose allocation is still being written is waited for, not overwritten."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from nats.aio.client import Client

from gpuledger_allocator.finder import BuiltinFinder
from gpuledger_allocator.reserving import AllocateCall
from gpuledger_allocator.service import AllocatorService
from gpuledger_allocator.view import ClusterView
from gpuledger_common import bus
from gpuledger_common.store import LedgerStore
from gpuledger_core.errors import Unavailable
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import RELEASED_KEPT, NodeLedger
from gpuledger_core.model import Allocation, AllocState, Owner, OwnerKind, Request
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.natsserver import NatsServer
from tests.support.replicas import wait_for

FLEET = "nodes:\n  - name: n0\n    profile: a100-sxm-8\n  - name: n1\n    profile: a100-sxm-8\n"


def call(owner: Owner, cards: int = 1) -> AllocateCall:
    return AllocateCall(owner, (ContainerAsk("", Request(count=cards)),))


async def live_of(service: AllocatorService, owner: Owner) -> list[AllocationId]:
    """The owner's live allocations, read from the bucket now (not from the view)."""
    nodes = await service.store.nodes()
    return sorted(a.id for ledger, _ in nodes.values() for a in ledger.live() if a.owner == owner)


@pytest.fixture
async def service(nc: Client) -> AsyncIterator[AllocatorService]:
    store = await LedgerStore.open(nc, record_ttls=True)
    for entry in parse_fleet(FLEET).nodes:
        empty = NodeLedger(entry.node, ())
        await store.mutate(entry.node.name, lambda _, e=empty: e)  # type: ignore[misc]  # defaults bind the loop value
    view = ClusterView(store)
    watching = asyncio.create_task(view.run())
    await view.ready.wait()
    yield AllocatorService(store, view, BuiltinFinder())
    watching.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watching


async def test_an_owner_record_expires_by_itself(service: AllocatorService) -> None:
    owner = Owner(OwnerKind.TOOL, "short-lived")
    assert await service.store.claim_owner(owner, AllocationId("a-x"), "n0", ttl_s=1) is not None
    assert (await service.store.owner_record(owner)) is not None

    async def gone() -> bool:
        return await service.store.owner_record(owner) is None

    await wait_for(gone, timeout=10, what="the record to expire")
    assert await service.store.claim_owner(owner, AllocationId("a-y"), "n0", ttl_s=1) is not None


async def test_a_retry_after_the_record_expired_gets_the_same_allocation(service: AllocatorService) -> None:
    service.owner_ttl_s = 1
    owner = Owner(OwnerKind.TOOL, "patient")
    first, existing = await service.allocate(call(owner))
    assert not existing

    async def expired() -> bool:
        return await service.store.owner_record(owner) is None

    await wait_for(expired, timeout=10, what="the record to expire")
    again, existing = await service.allocate(call(owner))
    assert existing and again.id == first.id
    assert await live_of(service, owner) == [first.id]


async def test_a_released_allocation_is_not_handed_out_again(service: AllocatorService) -> None:
    owner = Owner(OwnerKind.TOOL, "again")
    first, _ = await service.allocate(call(owner))
    await service.release(first.id)
    second, existing = await service.allocate(call(owner))  # its record still names the released one
    assert not existing and second.id != first.id and second.state is AllocState.RESERVED
    record = await service.store.owner_record(owner)
    assert record is not None and record.allocation == second.id
    assert await live_of(service, owner) == [second.id]


@pytest.mark.parametrize("commit", [False, True])
async def test_an_owner_asking_again_after_its_reservations_lease_ran_out_gets_new_cards(
    service: AllocatorService, commit: bool
) -> None:
    """A reservation whose lease ran out is released by the next write to its node: a retry of
    the owner (after its first answer was lost, say, while the ledger was out of reach for longer
    than the lease) is answered with a new allocation, not the lapsed one, nor ``Released``."""
    now = [1_000_000.0]
    service.clock = service.store.clock = lambda: now[0]
    owner = Owner(OwnerKind.TOOL, "lapsed")
    first, _ = await service.allocate(replace(call(owner), lease_s=5))
    now[0] += 10
    second, existing = await service.allocate(replace(call(owner), lease_s=5, commit=commit))
    assert not existing and second.id != first.id
    assert second.state is (AllocState.BOUND if commit else AllocState.RESERVED)
    record = await service.store.owner_record(owner)
    assert record is not None and record.allocation == second.id
    assert await live_of(service, owner) == [second.id]


async def test_an_allocation_released_before_the_allocates_commit_gives_way_to_a_new_one(
    service: AllocatorService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner's reservation, seen held, is released before this Allocate commits it: the
    commit finds it released, and the Allocate reserves and commits new cards instead."""
    owner = Owner(OwnerKind.TOOL, "overtaken")
    first, _ = await service.allocate(call(owner))
    await service.release(first.id)

    async def stale(_: AllocatorService, __: Owner) -> Allocation:
        return first  # as a view a moment behind the release would have it

    monkeypatch.setattr(AllocatorService, "_held", stale)
    second, existing = await service.allocate(replace(call(owner), commit=True))
    assert not existing and second.id != first.id and second.state is AllocState.BOUND
    assert await live_of(service, owner) == [second.id]


async def test_an_owner_allocates_again_after_its_released_allocation_left_the_nodes_key(
    service: AllocatorService,
) -> None:
    """A node's key keeps only its newest released allocations (``RELEASED_KEPT``). Once the
    owner's released one is gone from it, its record names nothing the ledger holds; the view saw
    that allocation written, so it is not one still on its way: a new Allocate for the owner gets
    a new allocation at once, not a wait for the call's window and UNAVAILABLE."""
    service.store.retry_s = 3.0
    owner = Owner(OwnerKind.TOOL, "again-and-again")
    first, _ = await service.allocate(call(owner, cards=8))  # all of one node: the others go to the other
    await service.release(first.id)
    for i in range(RELEASED_KEPT + 1):  # push it out of the node's key
        asked = AllocateCall(Owner(OwnerKind.TOOL, f"other-{i}"), call(owner).asks, node=first.node)
        other, _ = await service.allocate(asked)
        await service.release(other.id)

    async def pruned() -> bool:
        ledger, _ = await service.store.read(first.node)
        return ledger is not None and ledger.get(first.id) is None and service.view.node_of(first.id) is None

    await wait_for(pruned, 10, "the released allocation gone from its node's key and the view")
    record = await service.store.owner_record(owner)
    assert record is not None and record.allocation == first.id  # the record is still there (its TTL runs)

    started = asyncio.get_running_loop().time()
    second, existing = await asyncio.wait_for(service.allocate(call(owner)), 10)
    assert not existing and second.id != first.id
    assert asyncio.get_running_loop().time() - started < 2.0
    assert await live_of(service, owner) == [second.id]


async def test_a_record_whose_allocation_is_on_its_way_is_waited_for(service: AllocatorService) -> None:
    """Another replica wrote the owner's record and is still writing its reservation: a second
    request for the owner must answer with that reservation, not make its own."""
    owner = Owner(OwnerKind.TOOL, "racing")
    theirs = AllocationId("a-theirs")
    assert await service.store.claim_owner(owner, theirs, "n1", ttl_s=60) is not None
    answer = asyncio.create_task(service.allocate(call(owner)))
    await asyncio.sleep(0.3)
    assert not answer.done()  # waiting for the reservation the record names

    def reserve_theirs(ledger: NodeLedger | None) -> NodeLedger | None:
        assert ledger is not None
        return service._fit_and_reserve(call(owner), ledger.node.name, theirs, 60.0)(ledger)

    await service.store.mutate("n1", reserve_theirs)
    allocation, existing = await asyncio.wait_for(answer, 10)
    assert existing and allocation.id == theirs
    assert await live_of(service, owner) == [theirs]  # the waiting request's own reservation was rolled back


async def test_waiting_for_an_earlier_request_ends_with_the_call_window(service: AllocatorService) -> None:
    """A record whose reservation is still on its way is waited for only while the call's window
    lasts (a gRPC caller's deadline): the caller is told UNAVAILABLE in time, not cut off."""
    service.store.retry_s = 1.0
    owner = Owner(OwnerKind.TOOL, "slow-first")
    assert await service.store.claim_owner(owner, AllocationId("a-on-its-way"), "n1", ttl_s=60) is not None
    started = asyncio.get_running_loop().time()
    with pytest.raises(Unavailable, match="an earlier request of this owner is still being written") as caught:
        await asyncio.wait_for(service.allocate(call(owner)), 10)
    assert asyncio.get_running_loop().time() - started < 2.0  # absent_grace_s is 30 s
    assert "Allocate asked again for the same owner answers with it if so" in str(caught.value)
    assert await live_of(service, owner) == []  # its own reservation rolled back


async def test_a_record_naming_nothing_for_too_long_is_replaced(service: AllocatorService) -> None:
    """A replica that died between writing the record and the reservation leaves a record that
    names nothing; after the grace period the owner gets a new allocation."""
    service.absent_grace_s = 0.5
    owner = Owner(OwnerKind.TOOL, "orphaned")
    assert await service.store.claim_owner(owner, AllocationId("a-never-written"), "n0", ttl_s=60) is not None
    allocation, existing = await asyncio.wait_for(service.allocate(call(owner)), 10)
    assert not existing and allocation.id != "a-never-written"
    record = await service.store.owner_record(owner)
    assert record is not None and record.allocation == allocation.id
    assert await live_of(service, owner) == [allocation.id]


async def test_the_store_sees_that_this_server_keeps_per_message_ttls(service: AllocatorService) -> None:
    assert service.store.records_expire  # nats-server 2.11+: the bucket now allows them


async def test_where_records_cannot_expire_a_release_drops_the_record(service: AllocatorService) -> None:
    """Against a server that keeps no per-message TTLs (before 2.11), Release deletes the record."""
    service.store.records_expire = False
    owner = Owner(OwnerKind.TOOL, "old-server")
    allocation, _ = await service.allocate(call(owner))
    assert await service.store.owner_record(owner) is not None
    await service.release(allocation.id)
    await service.settle()

    async def dropped() -> bool:
        return await service.store.owner_record(owner) is None

    await wait_for(dropped, timeout=5, what="the record dropped")


async def test_one_owner_asking_three_replicas_at_once_gets_one_allocation(nc: Client, nats_server: NatsServer) -> None:
    """The same owner's request reaches three replicas at the same moment, several times over:
    every answer names the same allocation, and the ledger holds exactly one for the owner."""
    replicas: list[AllocatorService] = []
    watchers: list[asyncio.Task[None]] = []
    connections = [await bus.connect(nats_server.url, f"replica-{n}") for n in range(3)]
    try:
        for n, conn in enumerate(connections):
            store = await LedgerStore.open(conn, record_ttls=True)
            if n == 0:
                for entry in parse_fleet(FLEET).nodes:
                    empty = NodeLedger(entry.node, ())
                    await store.mutate(entry.node.name, lambda _, e=empty: e)  # type: ignore[misc]  # defaults bind the loop value
            view = ClusterView(store)
            watchers.append(asyncio.create_task(view.run()))
            await view.ready.wait()
            replicas.append(AllocatorService(store, view, BuiltinFinder()))
        for round_ in range(5):
            owner = Owner(OwnerKind.TOOL, f"storm-{round_}")
            answers = await asyncio.gather(*(replicas[i % 3].allocate(call(owner, 2)) for i in range(9)))
            assert len({allocation.id for allocation, _ in answers}) == 1
            assert sum(not existing for _, existing in answers) == 1  # one made it, the rest found it
            assert await live_of(replicas[0], owner) == [answers[0][0].id]
    finally:
        for task in watchers:
            task.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        for conn in connections:
            await conn.close()
