"""A 3-server JetStream cluster with the ledger and owner buckets at 3 replicas, two allocator
replicas on its server list, and a fleet of two 8-card nodes announced to them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.fleet import Fleet, parse_fleet
from gpuledger_common.store import LEDGER_BUCKET, OWNER_BUCKET, LedgerStore
from gpuledger_core.ledger import NodeLedger
from gpuledger_proto.gpuledger.allocator import v1 as pb
from gpuledger_testing.nats_cluster import Member, NatsCluster, nats_cluster, stream_leader, wait_current
from gpuledger_testing.stack import RunningAllocator, running_allocator, wait_for

REPLICAS = 3
# nats-py drops the stream of a reconnect attempt that a restarting server cut off before its INFO
# ("empty response from server when expecting INFO message") without closing it; when the garbage
# collector finds it during a test, the ResourceWarning would fail that test. Only that one is let by.
NATS_RECONNECT_LEAK = pytest.mark.filterwarnings(
    r"ignore:Exception ignored in. <function StreamWriter.__del__:pytest.PytestUnraisableExceptionWarning"
)
STREAMS = (f"KV_{LEDGER_BUCKET}", f"KV_{OWNER_BUCKET}")
FLEET = """
nodes:
  - name: h100-0
    profile: h100-sxm-8
  - name: h100-1
    profile: h100-sxm-8
"""


@pytest.fixture
async def cluster() -> AsyncIterator[NatsCluster]:
    async with nats_cluster(REPLICAS) as running:
        yield running


@pytest.fixture
async def cluster_nc(cluster: NatsCluster) -> AsyncIterator[Client]:
    client = await bus.connect(cluster.url, "ha-test")
    yield client
    await client.close()


@pytest.fixture
def fleet() -> Fleet:
    return parse_fleet(FLEET, "ha-fleet.yaml")


@pytest.fixture
async def replicas(cluster: NatsCluster, cluster_nc: Client, fleet: Fleet) -> AsyncIterator[list[RunningAllocator]]:
    """Two allocators on the whole server list, the buckets made with 3 replicas, the fleet in
    the ledger, every stream replica current."""
    async with contextlib.AsyncExitStack() as stack:
        running = []
        for _ in range(2):
            replica = running_allocator(cluster.url, bucket_replicas=REPLICAS, slots_per_card=8)
            running.append(await stack.enter_async_context(replica))
        await announce(cluster_nc, [n.node for n in fleet.nodes])
        stub = running[0].stub()

        async def all_nodes() -> bool:
            return len((await stub.get_cluster(pb.GetClusterRequest())).nodes) == len(fleet.nodes)

        await wait_for(all_nodes, 30, "the fleet in the ledger")  # 10 s was short on a loaded machine
        await all_current(cluster, cluster_nc, 10)
        yield running


async def all_current(cluster: NatsCluster, nc: Client, timeout: float) -> None:
    """Both buckets' streams led, with every follower current; if not within ``timeout``, the
    error says what the leaders reported and ends with each server's log."""
    await wait_current(cluster, nc, STREAMS, REPLICAS, timeout)


async def read_ledger(nc: Client) -> dict[str, NodeLedger]:
    """Every node's ledger, read straight from the bucket (through the stream's leader)."""
    store = await LedgerStore.open(nc)
    return {str(node): ledger for node, (ledger, _) in (await store.nodes()).items()}


async def first_server_down(cluster: NatsCluster, nc: Client) -> Member:
    """Kill the first server of the list and wait until the meta group and both streams are led
    by servers that run (if it led them, those elections are the fault tests' business)."""
    down = cluster.members[0]
    await cluster.kill(down.name)
    await cluster.wait_meta_leader()

    async def led_by_others() -> bool:
        leaders = [await stream_leader(nc, stream) for stream in STREAMS]
        return all(leader not in ("", down.name) for leader in leaders)

    await wait_for(led_by_others, 30, "both streams led by a running server")
    return down
