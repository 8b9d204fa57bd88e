"""A ledger write whose outcome the writer cannot know (its answer lost, or the write held up on
its way) is applied once, never over a change it did not see: tried again with the same bytes on
the same revision, it conflicts; the key's first message after that revision says whether it was
this write (the answer was lost: done) or another (the transition runs again on a fresh read).
Real nats-server; the link between the store and the server holds bytes back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.store import LedgerStore, Transition
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, Card, Node, Owner, OwnerKind, Request
from gpuledger_dev.natsserver import NatsServer
from tests.support.held_link import HeldLink
from tests.support.replicas import wait_for

pytestmark = pytest.mark.timeout(60)
NODE = NodeName("n1")
CARD = Card(CardUuid("GPU-1"), 0, "Tesla P4", 7611)


def take(allocation_id: str, mem: int) -> Transition:
    def transition(current: NodeLedger | None) -> NodeLedger:
        assert current is not None
        grants = fit_node(current, [ContainerAsk("", Request(mem_mib=mem))])
        owner = Owner(OwnerKind.TOOL, allocation_id)
        return reserve(current, Allocation(AllocationId(allocation_id), owner, NODE, grants))

    return transition


@pytest.fixture
async def link(nats_server: NatsServer) -> AsyncIterator[HeldLink]:
    held = await HeldLink(nats_server.port).start()
    yield held
    held.release()
    await held.close()


@pytest.fixture
async def through(link: HeldLink) -> AsyncIterator[Client]:
    client = await bus.connect(link.url, "through-the-link")
    yield client
    await client.close()


async def retried(store: LedgerStore) -> bool:
    return store.outage.retries >= 1


async def test_a_write_whose_answer_is_lost_is_applied_once(nc: Client, link: HeldLink, through: Client) -> None:
    store, direct = await LedgerStore.open(through), await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: NodeLedger(Node(NODE, (CARD,))))
    _, before = await store.read(NODE)

    link.hold_answers()
    writing = asyncio.ensure_future(store.mutate(NODE, take("a", 1000)))
    await wait_for(lambda: retried(store), what="the first try timing out")  # its answer is held
    applied, revision = await direct.read(NODE)
    assert revision == before + 1 and applied is not None and applied.get(AllocationId("a")) is not None
    link.release()  # the second try conflicts with the first: the store finds the first was its own

    written = await asyncio.wait_for(writing, 15)
    assert written.revision == before + 1
    final, revision = await direct.read(NODE)
    assert revision == before + 1  # nothing written twice
    assert final is not None and [a.id for a in final.allocations] == ["a"]


async def test_a_write_held_up_until_another_took_its_revision_is_applied_on_a_fresh_read(
    nc: Client, link: HeldLink, through: Client
) -> None:
    store, direct = await LedgerStore.open(through), await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: NodeLedger(Node(NODE, (CARD,))))
    _, before = await store.read(NODE)

    link.hold_requests()
    writing = asyncio.ensure_future(store.mutate(NODE, take("a", 1000)))
    await wait_for(lambda: retried(store), what="the first try timing out")  # it never arrived
    await direct.mutate(NODE, take("b", 6000))  # meanwhile another writer takes the revision
    link.release()  # the held write arrives late and is refused; the retry conflicts; not ours

    written = await asyncio.wait_for(writing, 15)
    final, revision = await direct.read(NODE)
    assert written.revision == revision == before + 2
    assert final is not None and sorted(a.id for a in final.allocations) == ["a", "b"]
    assert store.stats.conflicts >= 1


async def test_an_owner_record_whose_answer_is_lost_is_still_ours(nc: Client, link: HeldLink, through: Client) -> None:
    store, direct = await LedgerStore.open(through), await LedgerStore.open(nc)
    owner = Owner(OwnerKind.TOOL, "lost-answer")

    link.hold_answers()
    claiming = asyncio.ensure_future(store.claim_owner(owner, AllocationId("a"), NODE))
    await wait_for(lambda: retried(store), what="the first try timing out")
    link.release()

    revision = await asyncio.wait_for(claiming, 15)
    record = await direct.owner_record(owner)
    assert revision is not None and record is not None
    assert (record.allocation, record.revision) == ("a", revision)


def take_once(allocation_id: str, mem: int) -> Transition:
    """``take``, as the allocator's reservation is written: a no-op where the allocation already is."""
    first = take(allocation_id, mem)

    def transition(current: NodeLedger | None) -> NodeLedger | None:
        assert current is not None
        return current if current.get(AllocationId(allocation_id)) is not None else first(current)

    return transition


async def test_a_write_whose_answer_is_lost_and_whose_message_is_gone_is_found_on_a_fresh_read(
    nc: Client, link: HeldLink, through: Client
) -> None:
    """The key keeps a few revisions only: once others wrote it more often than that, the message
    that says whether the lost write was ours is gone. Even a caller that asked for one attempt
    (the allocator's first pass over the nodes, which moves on to the next node on a lost race)
    must hear that its write is there, not that it lost: else it writes the allocation twice."""
    store, direct = await LedgerStore.open(through), await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: NodeLedger(Node(NODE, (CARD,))))

    link.hold_answers()
    writing = asyncio.ensure_future(store.mutate(NODE, take_once("a", 1000), attempts=1))
    await wait_for(lambda: retried(store), what="the first try timing out")  # its answer is held
    for i in range(8):  # more writes than the bucket keeps of one key (history 5)
        await direct.mutate(NODE, take_once(f"b{i}", 100))
    link.release()

    written = await asyncio.wait_for(writing, 15)
    assert written.new is not None and written.new.get(AllocationId("a")) is not None
    final, _ = await direct.read(NODE)
    assert final is not None and sorted(a.id for a in final.allocations) == ["a", *(f"b{i}" for i in range(8))]
