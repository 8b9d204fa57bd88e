"""The inventory and the allocator together on a real nats-server: the ledger sees the node, its
health, foreign usage, and stops placing on it when its heartbeat stops."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator

import pytest
from grpclib import GRPCError
from grpclib.const import Status

from gpuledger_dev.fake_nvml import FakeNvml, ManualClock
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.fleet_script import node_script
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.app import serve
from gpuledger_inventory.nvml import NvmlGpus
from gpuledger_inventory.state import Host
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import RunningAllocator, running_allocator, wait_for

from .test_inventory_service import FLEET, settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
STALE_S = 1.5


@contextlib.asynccontextmanager
async def inventory(url: str, fake: FakeNvml) -> AsyncIterator[None]:
    stop = asyncio.Event()
    gpus = NvmlGpus(fake, fake.numa_node, "fake")
    task = asyncio.create_task(serve(settings(url), gpus=gpus, host=Host(224000, 2097152), stop=stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def card(api: pb.AllocatorStub, index: int) -> pb.CardStatus | None:
    reply = await api.get_cluster(pb.GetClusterRequest(node="gpu-a"))
    return next((c for c in reply.nodes[0].cards if c.index == index), None)


@pytest.fixture
async def allocator(nats_server: NatsServer) -> AsyncIterator[RunningAllocator]:
    async with running_allocator(nats_server.url, stale_after_s=STALE_S) as running:
        yield running


async def test_the_allocator_sees_inventory_health_and_foreign_usage(
    nats_server: NatsServer, allocator: RunningAllocator
) -> None:
    fake = FakeNvml(node_script(parse_fleet(FLEET, "fleet.yaml"), "gpu-a"), clock=ManualClock())
    api = allocator.stub()
    async with inventory(nats_server.url, fake):
        two = await wait_for(lambda: card(api, 2), what="gpu-a in the ledger")
        assert (two.model, two.memory_mib, two.health) == ("NVIDIA H100 80GB HBM3", 81559, "healthy")

        async def foreign_on_two() -> bool:
            c = await card(api, 2)
            return c is not None and (c.processes, c.foreign_processes, c.foreign_mem_mib) == (1, 1, 1000)

        await wait_for(foreign_on_two, what="foreign usage on card 2")

        fake.inject_xid(3, 79)

        async def three_unhealthy() -> str:
            c = await card(api, 3)
            return c.health_reason if c is not None and c.health == "unhealthy" else ""

        reason = await wait_for(three_unhealthy, what="card 3 unhealthy in the ledger")
        assert "79" in reason
        with pytest.raises(GRPCError) as caught:  # eight cards, one of them unhealthy
            await api.allocate(
                pb.AllocateRequest(
                    owner=pb.Owner(kind="tool", id="eight"),
                    containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=8))],
                )
            )
        assert caught.value.status is Status.RESOURCE_EXHAUSTED
        assert "7 healthy card(s) of the 8 needed" in (caught.value.message or "")

        # Only an operator brings it back: the CLI, recorded with who and why.
        cli = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpuledger_cli",
            "health",
            "--nats",
            nats_server.url,
            "--node",
            "gpu-a",
            "--card",
            "3",
            "--healthy",
            "--by",
            "alice",
            "--note",
            "reseated",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await cli.communicate()
        assert cli.returncode == 0, err.decode()
        assert "gpu-a card 3" in out.decode() and "now healthy" in out.decode()

        async def three_healthy() -> bool:
            c = await card(api, 3)
            return c is not None and c.health == "healthy"

        await wait_for(three_healthy, what="card 3 healthy again in the ledger")


async def test_a_silent_node_goes_stale_and_comes_back(nats_server: NatsServer, allocator: RunningAllocator) -> None:
    fake = FakeNvml(node_script(parse_fleet(FLEET, "fleet.yaml"), "gpu-a"), clock=ManualClock())
    api = allocator.stub()
    request = pb.AllocateRequest(
        owner=pb.Owner(kind="tool", id="after-silence"),
        containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=1))],
    )
    async with inventory(nats_server.url, fake):
        await wait_for(lambda: card(api, 0), what="gpu-a in the ledger")
    # The inventory is gone: no heartbeat. After STALE_S the node gets nothing new.

    async def stale() -> bool:
        reply = await api.get_cluster(pb.GetClusterRequest(node="gpu-a"))
        return bool(reply.nodes[0].stale)

    await wait_for(stale, timeout=STALE_S + 5, what="gpu-a stale")
    with pytest.raises(GRPCError) as caught:
        await api.allocate(request)
    assert caught.value.status is Status.RESOURCE_EXHAUSTED
    assert "gpu-a: stale" in (caught.value.message or "")

    async with inventory(nats_server.url, fake):
        await wait_for(lambda: _not(stale), what="gpu-a back")
        reply = await api.allocate(request)
        assert reply.allocation.node == "gpu-a"


async def _not(check: object) -> bool:
    assert callable(check)
    return not await check()
