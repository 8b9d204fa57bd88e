"""The allocator survives the loss of NATS and recovers by itself: the ledger is intact, and its
view follows the ledger again once the server is back."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator

import pytest
from grpclib import GRPCError
from grpclib.const import Status
from prometheus_client import REGISTRY

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.natsserver import NatsServer, free_port
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import running_allocator, wait_for

from ..conftest import FLEET

pytestmark = pytest.mark.timeout(60)
RETRY_S = 1.5  # the allocator's ledger_retry_s here


@pytest.fixture
async def server() -> AsyncIterator[NatsServer]:
    with tempfile.TemporaryDirectory(prefix="gpuledger-nats-") as store:
        nats = NatsServer(free_port(), store)
        await nats.start()
        try:
            yield nats
        finally:
            await nats.stop()


def request(owner: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        owner=pb.Owner(kind="tool", id=owner),
        containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=1, gpu_mem_mib=1000))],
        node="p4-0",
        commit=True,
    )


async def test_the_allocator_recovers_after_nats_comes_back(server: NatsServer) -> None:
    nc = await bus.connect(server.url, "test")
    try:
        async with running_allocator(server.url, ledger_retry_s=RETRY_S) as allocator:
            api = allocator.stub()
            await announce(nc, [n.node for n in parse_fleet(FLEET).nodes])

            async def fleet_known() -> bool:
                return len((await api.get_cluster(pb.GetClusterRequest())).nodes) == 3

            await wait_for(fleet_known, what="fleet in the ledger")
            before = (await api.allocate(request("before"))).allocation

            await server.kill()  # NATS is gone: the allocator waits it out, then refuses; it does not hang or die
            started = time.monotonic()
            with pytest.raises(GRPCError) as caught:
                await asyncio.wait_for(api.allocate(request("during")), RETRY_S + 2)
            assert caught.value.status is Status.UNAVAILABLE
            assert "NATS is disconnected" in (caught.value.message or "")
            assert "Allocate asked again for the same owner answers with it if so" in (caught.value.message or "")
            assert RETRY_S - 0.5 <= time.monotonic() - started < RETRY_S + 2
            await server.start()  # the same port and store: the ledger survives

            async def allocates() -> pb.Allocation:
                return (await api.allocate(request("after"))).allocation

            after = await wait_for(allocates, timeout=10, what="allocate after NATS is back")

            async def both_held() -> bool:
                cluster = await api.get_cluster(pb.GetClusterRequest(node="p4-0"))
                held = {h.allocation_id for c in cluster.nodes[0].cards for h in c.holders}
                return {before.id, after.id} <= held

            await wait_for(both_held, timeout=10, what="the view following the ledger again")
    finally:
        await nc.close()


async def test_an_allocate_during_a_short_outage_waits_it_out(server: NatsServer) -> None:
    nc = await bus.connect(server.url, "test")
    try:
        async with running_allocator(server.url, ledger_retry_s=8.0) as allocator:
            api = allocator.stub()
            await announce(nc, [n.node for n in parse_fleet(FLEET).nodes])

            async def fleet_known() -> bool:
                return len((await api.get_cluster(pb.GetClusterRequest())).nodes) == 3

            await wait_for(fleet_known, what="fleet in the ledger")
            retries = _retries()
            await server.kill()
            allocating = asyncio.ensure_future(api.allocate(request("during")))
            await wait_for(lambda: _more(retries), what="the allocate waiting for NATS")
            assert not allocating.done()
            await server.start()
            during = (await asyncio.wait_for(allocating, 10)).allocation
            assert during.state == "bound"
    finally:
        await nc.close()


def _retries() -> float:
    return REGISTRY.get_sample_value("gpuledger_ledger_outage_retries_total") or 0.0


async def _more(than: float) -> bool:
    return _retries() > than
