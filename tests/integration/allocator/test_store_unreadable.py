"""A value in one node's key that cannot be read is that node's problem alone, against a real
nats-server: a store's follower hears of it once and follows every other node, and an allocator
and placement in this process start and become ready, follow the other nodes, place nothing on
that node and say why (GetCluster, a pinned Allocate, the extender's filter); a readable value put
back heals it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from grpclib import GRPCError, Status
from nats.aio.client import Client
from prometheus_client import REGISTRY

from gpuledger_common.store import LedgerStore, node_key
from gpuledger_core import codec
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Node
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.natsserver import NatsServer
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import RunningAllocator, RunningPlacement, running_allocator, running_placement, wait_for
from tests.support.waiting import polled

from ..placement.helpers import args, gpu_pod, post

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
FLEET = """
nodes:
  - name: good-0
    profile: h100-sxm-8
  - name: bad-0
    profile: h100-sxm-8
"""
GARBAGE = b"\x00 any bytes a node's plugin may write to its own key"


def unreadable_values() -> float:
    return REGISTRY.get_sample_value("gpuledger_ledger_unreadable_values_total") or 0.0


@pytest.fixture
def nodes() -> dict[str, Node]:
    return {entry.node.name: entry.node for entry in parse_fleet(FLEET, "fleet.yaml").nodes}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def cluster(allocator: RunningAllocator) -> dict[str, pb.NodeStatus]:
    reply = await allocator.stub().get_cluster(pb.GetClusterRequest())
    return {node.name: node for node in reply.nodes}


async def allocate_on(allocator: RunningAllocator, node: str, tool: str) -> pb.AllocateResponse:
    ask = pb.ContainerRequest(request=pb.ResourceRequest(gpu=1))
    request = pb.AllocateRequest(owner=pb.Owner(kind="tool", id=tool), containers=[ask], commit=True, node=node)
    return await allocator.stub().allocate(request)


async def filtered(
    http: aiohttp.ClientSession, placement: RunningPlacement, pod: str, names: list[str]
) -> dict[str, object]:
    _, body = await post(http, f"{placement.url}/filter", args(gpu_pod(pod), names))
    assert isinstance(body, dict), body
    return body


def readable(node: Node) -> bytes:
    return orjson.dumps(codec.ledger_to(NodeLedger(node)))


async def test_a_follower_hears_of_an_unreadable_value_once_and_follows_every_other_node(
    nc: Client, nodes: dict[str, Node], caplog: pytest.LogCaptureFixture
) -> None:
    store = await LedgerStore.open(nc)
    for name, node in nodes.items():
        await store.mutate(name, lambda _, node=node: NodeLedger(node))  # type: ignore[misc]
    await store.kv.put(node_key("bad-0"), GARBAGE)
    applied: dict[NodeName, int] = {}  # the revision of each node's last value applied
    unreadable: dict[NodeName, str] = {}
    caught_up = asyncio.Event()

    def apply(node: NodeName, ledger: NodeLedger | None, revision: int) -> None:
        applied[node] = revision
        store.remember(node, ledger, revision)

    following = await store.follow_values(apply, caught_up.set, lambda node, _, why: unreadable.update({node: why}))
    try:
        await asyncio.wait_for(caught_up.wait(), 10)  # the bad value counts as arrived
        assert set(applied) == {"good-0"} and "not valid JSON" in unreadable[NodeName("bad-0")]
        assert set(await store.nodes()) == {"good-0"}  # a snapshot leaves it out too
        with pytest.raises(InvalidArgument, match="not valid JSON"):  # a write reads the key: refused
            await store.mutate("bad-0", lambda ledger: ledger)
        later = await store.kv.put(node_key("good-0"), readable(nodes["good-0"]))  # the others go on
        await wait_for(polled(lambda: applied[NodeName("good-0")] == later), 5, "good-0's next value applied")

        await store.kv.put(node_key("bad-0"), readable(nodes["bad-0"]))
        await wait_for(polled(lambda: "bad-0" in applied), 5, "bad-0 applied once readable")
        assert following.failed is None
        logged = [r for r in caplog.records if r.levelno == logging.ERROR and "bad-0" in r.getMessage()]
        assert len(logged) == 1  # once for the bad value, though the follower and the snapshot both met it
    finally:
        await following.stop()


async def test_one_nodes_unreadable_value_stops_neither_a_fresh_replica_nor_the_other_nodes(
    nats_server: NatsServer, nc: Client, nodes: dict[str, Node], http: aiohttp.ClientSession
) -> None:
    store = await LedgerStore.open(nc)
    for name, node in nodes.items():
        await store.mutate(name, lambda _, node=node: NodeLedger(node))  # type: ignore[misc]
    await store.kv.put(node_key("bad-0"), GARBAGE)
    counted = unreadable_values()

    async with running_allocator(nats_server.url) as allocator, running_placement(nats_server.url) as placement:
        # Both became ready; the listing says what is wrong with the one node, and only with it.
        listed = await cluster(allocator)
        assert listed["good-0"].cards and not listed["good-0"].unreadable
        assert not listed["bad-0"].cards and "not valid JSON" in listed["bad-0"].unreadable
        assert unreadable_values() >= counted + 1

        # The other node is followed on: a change another writer makes there reaches the replica.
        held = await allocate_on(allocator, "good-0", "on-good")
        assert held.allocation.node == "good-0"

        async def seen_on_good() -> bool:
            return any(card.holders for card in (await cluster(allocator))["good-0"].cards)

        await wait_for(seen_on_good, what="the allocation on good-0 in the listing")

        # Nothing is placed on the unreadable node, and the refusal names it and says why.
        with pytest.raises(GRPCError) as refused:
            await allocate_on(allocator, "bad-0", "on-bad")
        assert refused.value.status is Status.RESOURCE_EXHAUSTED
        assert "bad-0: its ledger value cannot be read" in str(refused.value.message)
        verdict = await filtered(http, placement, "first", ["good-0", "bad-0"])
        assert verdict["NodeNames"] == ["good-0"]
        assert "cannot be read" in verdict["FailedNodes"]["bad-0"]  # type: ignore[index]

        # A readable value heals it, in both.
        await store.kv.put(node_key("bad-0"), orjson.dumps(codec.ledger_to(NodeLedger(nodes["bad-0"]))))

        async def healed() -> bool:
            node = (await cluster(allocator))["bad-0"]
            return bool(node.cards) and not node.unreadable

        async def placeable() -> bool:
            return (await filtered(http, placement, "second", ["bad-0"]))["NodeNames"] == ["bad-0"]

        await wait_for(healed, what="bad-0 listed with its cards again")
        await wait_for(placeable, what="bad-0 passing placement's filter again")
        placed = await allocate_on(allocator, "bad-0", "on-bad")
        assert placed.allocation.node == "bad-0"
