"""A 3-server JetStream cluster with the ledger and owner buckets at 3 replicas, two allocator
replicas on its server list, and a fleet of two 8-card nodes announced to them."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.store import LEDGER_BUCKET, OWNER_BUCKET, LedgerStore
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_dev.fleet import Fleet, parse_fleet
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.ledger_check import ledger_through_leader
from tests.support.nats_cluster import Member, NatsCluster, nats_cluster, stream_leader, wait_current
from tests.support.replicas import RunningAllocator, running_allocator, wait_for, where_it_waits

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


TASKS_SHOWN_BEFORE_S = 10.0  # before a test's timeout: where each of its tasks waits


@pytest.fixture(autouse=True)
async def tasks_shown_before_timeout(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """A test that runs into its timeout is stopped in the event loop's poll, which says nothing
    of what it waited for: shortly before, print where each task waits (shown with the failure)."""
    marker = request.node.get_closest_marker("timeout")
    if marker is None or not marker.args:
        yield
        return
    handle = asyncio.get_running_loop().call_later(float(marker.args[0]) - TASKS_SHOWN_BEFORE_S, _show_tasks)
    yield
    handle.cancel()


def _show_tasks() -> None:
    print(f"--- {TASKS_SHOWN_BEFORE_S:g}s before the timeout, the tasks wait here:", file=sys.stderr)
    for task in asyncio.all_tasks():
        print(where_it_waits(task), file=sys.stderr)


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
    """Every node's ledger, read through the stream's leader (``ledger_through_leader``): right
    after a server's restart, a watch placed on it may show what it has not applied yet."""
    return await ledger_through_leader(nc)


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


async def allocation_history(nc: Client, allocation_id: str) -> list[str]:
    """For a failure message: the allocation's state in each revision of its node's key the
    stream still keeps (``history``), read message by message through the stream's leader, and
    its state as a watch shows it now (a watch may be served by any replica)."""
    stream, subjects = STREAMS[0], f"$KV.{LEDGER_BUCKET}.node."
    store, js = await LedgerStore.open(nc), nc.jetstream(timeout=2.0)
    watched: dict[NodeName, tuple[NodeLedger, int]] | None = None  # read once, if needed
    lines = []
    for node in await store.node_names():
        seq, seen = 1, []
        while True:
            try:
                msg = await js.get_msg(stream, seq=seq, subject=f"{subjects}{node}", next=True)
            except NotFoundError:
                break
            ledger = store.watched_value(node, msg.data, (msg.headers or {}).get("KV-Operation"))
            found = ledger.get(AllocationId(allocation_id)) if ledger is not None else None
            seen.append(f"{msg.seq}: {found.state.value if found else 'absent'}")
            seq = (msg.seq or seq) + 1
        if any(not line.endswith("absent") for line in seen):
            watched = watched if watched is not None else await store.nodes()
            ledger_now, revision = watched.get(node, (None, 0))
            now = ledger_now.get(AllocationId(allocation_id)) if ledger_now is not None else None
            lines.append(
                f"{allocation_id} on {node}, by revision through the leader: {', '.join(seen)}; "
                f"through a watch: {now.state.value if now else 'absent'} (revision {revision})"
            )
    return lines or [f"{allocation_id}: in no revision the stream keeps"]
