from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client

from gpuledger_common.announce import announce
from gpuledger_dev.fleet import Fleet
from gpuledger_dev.natsserver import NatsServer
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import RunningAllocator, running_allocator, wait_for


@pytest.fixture
async def sampling_allocator(nats_server: NatsServer, nc: Client, fleet: Fleet) -> AsyncIterator[RunningAllocator]:
    """The test fleet's allocator, its dashboard's trends sampled every 0.2 s."""
    async with running_allocator(
        nats_server.url, trends_step_s=0.2, trends_hours=1.0, node_trends_step_s=0.2, node_trends_hours=1.0
    ) as running:
        await announce(nc, [n.node for n in fleet.nodes])
        stub = running.stub()

        async def all_nodes() -> bool:
            reply = await stub.get_cluster(pb.GetClusterRequest())
            return len(reply.nodes) == len(fleet.nodes)

        await wait_for(all_nodes, what="fleet in the ledger")
        yield running
