"""An allocator killed with SIGKILL mid-work loses no committed allocation and leaks no reservation."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.exceptions import StreamTerminatedError
from nats.aio.client import Client

from gpuledger_common.announce import announce
from gpuledger_common.store import LedgerStore
from gpuledger_core.model import AllocState
from gpuledger_dev.fleet import Fleet
from gpuledger_dev.natsserver import NatsServer, free_port
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import answers, running_allocator, wait_for

LEASE_S = 1


async def test_sigkill_mid_work(nats_server: NatsServer, nc: Client, fleet: Fleet) -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuledger_allocator",
        "--nats-url",
        nats_server.url,
        "--grpc-host",
        "127.0.0.1",
        "--grpc-port",
        str(port),
        "--http-port",
        "0",
        "--sweep-interval-s",
        "3600",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    channel = Channel("127.0.0.1", port)
    api = pb.AllocatorStub(channel, timeout=5)
    committed: list[str] = []
    try:
        await wait_for(lambda: answers(api), what="allocator subprocess")
        await announce(nc, [n.node for n in fleet.nodes])
        await wait_for(lambda: _nodes(api, len(fleet.nodes)), what="fleet in the ledger")

        async def worker(w: int) -> None:
            for i in range(1000):
                commit = i % 2 == 0
                request = pb.AllocateRequest(
                    owner=pb.Owner(kind="tool", id=f"w{w}-{i}"),
                    containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=1, gpu_mem_mib=64))],
                    commit=commit,
                    lease_seconds=LEASE_S,
                )
                try:
                    reply = await api.allocate(request)
                except (TimeoutError, GRPCError, StreamTerminatedError, OSError):
                    return  # the allocator died under us
                if commit:
                    committed.append(reply.allocation.id)

        workers = [asyncio.create_task(worker(w)) for w in range(4)]
        await wait_for(lambda: _at_least(committed, 10), what="some committed work")
        process.send_signal(signal.SIGKILL)
        await process.wait()
        await asyncio.wait_for(asyncio.gather(*workers), 30)
    finally:
        channel.close()
        if process.returncode is None:
            process.kill()
            await process.wait()

    store = await LedgerStore.open(nc)
    ledgers = await store.nodes()
    bound = {a.id for ledger, _ in ledgers.values() for a in ledger.allocations if a.state is AllocState.BOUND}
    assert set(committed) <= bound, "a committed allocation was lost"

    # A fresh replica expires whatever the dead one left reserved, once the leases run out.
    async with running_allocator(nats_server.url, sweep_interval_s=0.2):

        async def no_reservations() -> bool:
            current = await store.nodes()
            return not any(a.state is AllocState.RESERVED for ledger, _ in current.values() for a in ledger.allocations)

        await wait_for(no_reservations, timeout=15, what="leaked reservations expired")
    final = await store.nodes()
    assert set(committed) <= {a.id for ledger, _ in final.values() for a in ledger.live()}


async def _nodes(api: pb.AllocatorStub, count: int) -> bool:
    return len((await api.get_cluster(pb.GetClusterRequest())).nodes) == count


async def _at_least(items: list[str], n: int) -> bool:
    with contextlib.suppress(Exception):
        await asyncio.sleep(0)
    return len(items) >= n
