"""Several allocator replicas on one bucket, many clients: no card is ever over capacity, nothing is lost."""

from __future__ import annotations

import asyncio
import contextlib
import random

from grpclib import GRPCError
from grpclib.const import Status
from nats.aio.client import Client
from prometheus_client import REGISTRY

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.store import LedgerStore
from gpuledger_core.errors import Exhausted
from gpuledger_core.model import CORE_WHOLE
from gpuledger_dev.fleet import Fleet, parse_fleet
from gpuledger_dev.natsserver import NatsServer
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import RunningAllocator, running_allocator, wait_for

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


HOT_FLEET = "nodes:\n  - name: hot-0\n    profile: a100-sxm-8\n  - name: hot-1\n    profile: a100-sxm-8\n"
HOT_CLIENTS = 16
HOT_ROUNDS = 8


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_two_replicas_on_two_hot_nodes_lose_nothing_and_book_nothing_twice(
    nats_server: NatsServer, nc: Client
) -> None:
    """Sixteen clients allocate (with commit) and release over NATS on two nodes through two
    replicas: the queue group sends each request to either, so both write both keys all the time.
    Every request is answered (granted, or refused for want of room), no write gives up, every
    grant not released is in the ledger and nothing else is, and no card is over capacity."""
    fleet = parse_fleet(HOT_FLEET, "hot.yaml")
    conflicts, gave_up = counter("gpuledger_ledger_cas_conflicts_total"), counter("gpuledger_ledger_cas_gave_up_total")
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(2):
            await stack.enter_async_context(running_allocator(nats_server.url))
        await announce(nc, [n.node for n in fleet.nodes])
        store = await LedgerStore.open(nc)

        async def all_nodes() -> bool:
            return len(await store.nodes()) == len(fleet.nodes)

        await wait_for(all_nodes, what="both nodes in the ledger")
        granted: list[str] = []
        released: list[str] = []

        async def client(seed: int) -> None:
            rng = random.Random(seed)
            held: list[str] = []
            for i in range(HOT_ROUNDS):
                body = {
                    "owner": {"kind": "tool", "id": f"hot-{seed}-{i}"},
                    "containers": [{"container": "", "request": {"count": 1, "mem_mib": rng.choice([1024, 8192])}}],
                    "commit": True,
                }
                try:
                    reply = await bus.request(nc, "gpuledger.v1.allocator.allocate", body, timeout=30)
                except Exhausted:
                    continue
                assert reply["allocation"]["state"] == "bound", reply
                held.append(reply["allocation"]["id"])
                granted.append(reply["allocation"]["id"])
                if rng.random() < 0.75:
                    gone = held.pop(rng.randrange(len(held)))
                    await bus.request(nc, "gpuledger.v1.allocator.release", {"allocation_id": gone}, timeout=30)
                    released.append(gone)

        await asyncio.gather(*(client(seed) for seed in range(HOT_CLIENTS)))

        ledgers = await store.nodes()
        live = {a.id for ledger, _ in ledgers.values() for a in ledger.live()}
        assert len(granted) > HOT_CLIENTS, "too few grants: the test exercised little"
        assert set(granted) - set(released) == live
        for ledger, _ in ledgers.values():
            use = ledger.use()
            for card in ledger.node.cards:
                u = use.get(card.uuid)
                assert u is None or u.mem_mib <= card.memory_mib, (card, u)
        assert counter("gpuledger_ledger_cas_gave_up_total") == gave_up
        # Both replicas wrote both keys: some of their writes raced (else this tested nothing).
        assert counter("gpuledger_ledger_cas_conflicts_total") > conflicts
