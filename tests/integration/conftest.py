from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_dev.fake_apiserver import FakeApiServer
from gpuledger_dev.fleet import Fleet, parse_fleet
from gpuledger_dev.natsserver import NatsServer, embedded_nats
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import RunningAllocator, running_allocator, wait_for


@pytest.fixture
async def nats_server() -> AsyncIterator[NatsServer]:
    async with embedded_nats() as server:
        yield server


@pytest.fixture
async def apiserver() -> AsyncIterator[FakeApiServer]:
    """The fake Kubernetes API server, on a free port."""
    server = await FakeApiServer().start()
    yield server
    await server.close()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[Client]:
    client = await bus.connect(nats_server.url, "test")
    yield client
    await client.close()


FLEET = """
nodes:
  - name: rtx-0
    profile: rtx3090-1
  - name: p4-0
    profile: tesla-p4-2
  - name: h100-0
    profile: h100-sxm-8
"""


@pytest.fixture
def fleet() -> Fleet:
    return parse_fleet(FLEET, "test-fleet.yaml")


@pytest.fixture
async def allocator(nats_server: NatsServer, nc: Client, fleet: Fleet) -> AsyncIterator[RunningAllocator]:
    async with running_allocator(nats_server.url) as running:
        await announce(nc, [n.node for n in fleet.nodes])
        stub = running.stub()

        async def all_nodes() -> bool:
            reply = await stub.get_cluster(pb.GetClusterRequest())
            return len(reply.nodes) == len(fleet.nodes)

        await wait_for(all_nodes, what="fleet in the ledger")
        yield running
