"""Tools on a draining card, against a real nats-server: a tool on a card whose remedy is drain is
told (a ``drain`` event on Watch and on NATS, the mark on GetAllocation) and released after the
grace; a tool on another card of the node is untouched; two replicas release it once; a replica
started after the mark releases it at the mark's time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from prometheus_client import REGISTRY

from gpuledger_common.announce import announce
from gpuledger_common.store import EVENTS_SUBJECT
from gpuledger_core.model import Health, Node, Remedy
from gpuledger_dev.fleet import Fleet
from gpuledger_dev.natsserver import NatsServer
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import RunningAllocator, running_allocator, wait_for

GRACE_S = 1.5
NODE = "h100-0"


def tool(owner: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        owner=pb.Owner(kind="tool", id=owner),
        containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=1))],
        node=NODE,
        commit=True,
    )


def draining(node: Node, uuid: str) -> Node:
    """The node as its inventory publishes it once the card has failed and must be drained."""
    failed = Health.UNHEALTHY
    cards = tuple(
        replace(c, health=failed, health_reason="XID 79", remedy=Remedy.DRAIN) if c.uuid == uuid else c
        for c in node.cards
    )
    return replace(node, cards=cards)


async def fleet_in(allocator: RunningAllocator, nc: Client, fleet: Fleet) -> None:
    await announce(nc, [n.node for n in fleet.nodes])
    stub = allocator.stub()

    async def all_nodes() -> bool:
        return len((await stub.get_cluster(pb.GetClusterRequest())).nodes) == len(fleet.nodes)

    await wait_for(all_nodes, what="fleet in the ledger")


@pytest.fixture
async def draining_allocator(nats_server: NatsServer, nc: Client, fleet: Fleet) -> AsyncIterator[RunningAllocator]:
    async with running_allocator(nats_server.url, tool_drain_grace_s=GRACE_S) as running:
        await fleet_in(running, nc, fleet)
        yield running


def counted(result: str) -> float:
    return REGISTRY.get_sample_value("gpuledger_allocator_tool_drains_total", {"result": result}) or 0.0


async def test_a_tool_on_a_drained_card_is_told_and_released_after_the_grace(
    draining_allocator: RunningAllocator, nc: Client, fleet: Fleet
) -> None:
    api = draining_allocator.stub()
    doomed = (await api.allocate(tool("doomed"))).allocation
    bystander = (await api.allocate(tool("bystander"))).allocation
    card = doomed.grants[0].cards[0].uuid
    assert bystander.grants[0].cards[0].uuid != card
    watched: list[pb.LedgerEvent] = []
    published: list[dict[str, object]] = []

    async def follow() -> None:
        async for event in api.watch(pb.WatchRequest(node=NODE)):
            watched.append(event)

    async def heard(msg: Msg) -> None:
        published.append(json.loads(msg.data))

    subscription = await nc.subscribe(f"{EVENTS_SUBJECT}.{NODE}", cb=heard)
    watcher = asyncio.create_task(follow())
    await wait_for(lambda: _async(any(e.allocation.id == bystander.id for e in watched)), what="watch following")
    told, released = counted("told"), counted("released")
    try:
        await announce(nc, [draining(fleet.node(NODE).node, card)])

        async def drained() -> bool:
            return any(e.kind == "drain" and e.allocation.id == doomed.id for e in watched)

        await wait_for(drained, what="the drain event on Watch")
        event = next(e for e in watched if e.kind == "drain")
        mark = event.allocation.drain
        assert (mark.card, mark.release_at - mark.since) == (card, pytest.approx(GRACE_S))
        assert card in mark.reason and "XID 79" in mark.reason and NODE in mark.reason
        polled = await api.get_allocation(pb.GetAllocationRequest(allocation_id=doomed.id))
        assert polled.state == "bound" and polled.drain == mark  # what a tool that polls sees

        async def gone() -> bool:
            got = await api.get_allocation(pb.GetAllocationRequest(allocation_id=doomed.id))
            return bool(got.state == "released")

        await wait_for(gone, what="the release after the grace")
        done = await api.get_allocation(pb.GetAllocationRequest(allocation_id=doomed.id))
        assert done.reason.startswith("drained: ") and card in done.reason and "XID 79" in done.reason
        assert done.updated_at >= mark.release_at
        await wait_for(lambda: _async(any(e.get("kind") == "drain" for e in published)), what="drain on NATS")
        kept = await api.get_allocation(pb.GetAllocationRequest(allocation_id=bystander.id))
        assert kept.state == "bound" and not kept.drain.card and kept.updated_at == bystander.updated_at
        assert (counted("told") - told, counted("released") - released) == (1, 1)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await subscription.unsubscribe()


async def test_two_replicas_release_once_and_a_replica_started_later_keeps_the_mark_s_time(
    nats_server: NatsServer, nc: Client, fleet: Fleet
) -> None:
    grace = 4.0
    async with running_allocator(nats_server.url, tool_drain_grace_s=grace) as first:
        await fleet_in(first, nc, fleet)
        api = first.stub()
        doomed = (await api.allocate(tool("doomed"))).allocation
        await announce(nc, [draining(fleet.node(NODE).node, doomed.grants[0].cards[0].uuid)])

        async def marked() -> bool:
            got = await api.get_allocation(pb.GetAllocationRequest(allocation_id=doomed.id))
            return bool(got.drain.card)

        await wait_for(marked, what="the drain mark")
        mark = (await api.get_allocation(pb.GetAllocationRequest(allocation_id=doomed.id))).drain
    released = counted("released")
    # The first replica is gone; two new ones (another grace each) follow the mark already written.
    async with (
        running_allocator(nats_server.url, tool_drain_grace_s=60.0) as second,
        running_allocator(nats_server.url, tool_drain_grace_s=60.0),
    ):
        api = second.stub()

        async def gone() -> bool:
            got = await api.get_allocation(pb.GetAllocationRequest(allocation_id=doomed.id))
            return bool(got.state == "released")

        await wait_for(gone, what="the release at the mark's time", timeout=grace + 10)
        done = await api.get_allocation(pb.GetAllocationRequest(allocation_id=doomed.id))
        assert done.drain == mark and mark.release_at <= done.updated_at < mark.release_at + 5
        await asyncio.sleep(0.5)  # both replicas had rounds since: still one release
        assert counted("released") - released == 1


async def _async(value: bool) -> bool:
    return value
