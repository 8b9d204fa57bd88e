"""Several allocator replicas on one bucket, many clients: no card is ever over capacity."""

from __future__ import annotations

import asyncio
import contextlib
import random

from grpclib import GRPCError
from grpclib.const import Status
from nats.aio.client import Client

from gpuledger_common.fleet import Fleet
from gpuledger_common.natsserver import NatsServer
from gpuledger_common.store import LedgerStore
from gpuledger_core.model import CORE_WHOLE
from gpuledger_proto.gpuledger.allocator import v1 as pb
from gpuledger_testing.stack import RunningAllocator, running_allocator

REPLICAS = 3
CLIENTS = 24
ROUNDS = 6


def random_request(rng: random.Random) -> pb.ResourceRequest:
    kind = rng.choice(["exclusive", "mem", "core", "both"])
    count = rng.choice([1, 1, 1, 2, 4])
    if kind == "exclusive":
        return pb.ResourceRequest(gpu=count)
    if kind == "mem":
        return pb.ResourceRequest(gpu=count, gpu_mem_mib=rng.choice([512, 2048, 6000, 20000]))
    if kind == "core":
        return pb.ResourceRequest(gpu=count, gpu_core_permille=rng.choice([100, 300, 500]))
    return pb.ResourceRequest(gpu=count, gpu_mem_mib=rng.choice([1024, 4096]), gpu_core_permille=rng.choice([200, 400]))


async def client(seed: int, replicas: list[RunningAllocator], granted: list[str], released: list[str]) -> None:
    rng = random.Random(seed)
    held: list[str] = []
    for i in range(ROUNDS):
        api = rng.choice(replicas).stub()
        owner = pb.Owner(kind="tool", id=f"c{seed}-{i}")
        request = pb.AllocateRequest(
            owner=owner, containers=[pb.ContainerRequest(request=random_request(rng))], commit=True
        )
        try:
            reply = await api.allocate(request)
            held.append(reply.allocation.id)
            granted.append(reply.allocation.id)
        except GRPCError as err:
            assert err.status is Status.RESOURCE_EXHAUSTED, err
        if held and rng.random() < 0.4:
            gone = held.pop(0)
            await rng.choice(replicas).stub().release(pb.ReleaseRequest(allocation_id=gone))
            released.append(gone)


async def test_replicas_never_overcommit_a_card(nats_server: NatsServer, nc: Client, fleet: Fleet) -> None:
    from gpuledger_common.announce import announce

    async with contextlib.AsyncExitStack() as stack:
        replicas = [await stack.enter_async_context(running_allocator(nats_server.url)) for _ in range(REPLICAS)]
        await announce(nc, [n.node for n in fleet.nodes])
        store = await LedgerStore.open(nc)

        async def all_nodes() -> None:
            while len(await store.nodes()) < len(fleet.nodes):
                await asyncio.sleep(0.05)

        await asyncio.wait_for(all_nodes(), 10)
        granted: list[str] = []
        released: list[str] = []
        await asyncio.gather(*(client(seed, replicas, granted, released) for seed in range(CLIENTS)))

        ledgers = await store.nodes()
        live = {a.id for ledger, _ in ledgers.values() for a in ledger.live()}
        assert granted, "no request was ever granted: the test exercised nothing"
        for ledger, _ in ledgers.values():
            use = ledger.use()
            for card in ledger.node.cards:
                u = use.get(card.uuid)
                if u is None:
                    continue
                assert u.mem_mib <= card.memory_mib, (card, u)
                assert u.core_milli <= CORE_WHOLE, (card, u)
                if u.exclusive:
                    assert u.holders == 1, (card, u)
        # every allocation a client was granted and did not release is live, and nothing else is
        assert set(granted) - set(released) == live
