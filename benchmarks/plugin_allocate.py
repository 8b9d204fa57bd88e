"""The plugin shim's Allocate and GetPreferredAllocation, next to a bare grpclib unary echo.

One run, one machine: an embedded nats-server with the ledger bucket, the shim serving its unix
socket (registered with the fake kubelet), an 8-card node with 8 slots per card. It measures, as
kubelet would call them over the unix socket:
- a bare grpclib unary call over a unix socket (an echo: the floor for any answer),
- Allocate for a container whose reservation is in the ledger (a ledger read and a CAS to
  ``bound`` through NATS, every call),
- GetPreferredAllocation steered to a reservation, and with none (topology ranking),
and prints p50/p99 and ratios against the echo. Targets: Allocate p99 <= 50 ms,
GetPreferredAllocation p99 <= 10 ms.

    python -m benchmarks.plugin_allocate [--rounds 300]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from grpclib.client import Channel
from grpclib.server import Server

from gpuledger_common import bus
from gpuledger_common.store import LedgerStore
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, prune, release, reserve
from gpuledger_core.model import (
    Allocation,
    Card,
    CardShare,
    Grant,
    Link,
    Node,
    Owner,
    OwnerKind,
    PcieLevel,
)
from gpuledger_core.slots import assign_device_ids, node_slots
from gpuledger_dev.fake_kubelet import FakeKubelet
from gpuledger_dev.natsserver import embedded_nats
from gpuledger_plugin.app import running
from gpuledger_plugin.settings import PluginSettings
from gpuledger_proto import v1beta1 as dp

NODE = "bench"
CARDS = 8
SLOTS = 8


class Echo(dp.RegistrationBase):  # type: ignore[misc]
    async def register(self, request: dp.RegisterRequest) -> dp.Empty:
        return dp.Empty()


def eight_cards() -> Node:
    links = tuple(
        Link(
            a,
            b,
            12 if a // 4 == b // 4 else 4,
            PcieLevel.NUMA_NODE if a // 4 == b // 4 else PcieLevel.SYSTEM,
        )
        for a in range(CARDS)
        for b in range(a + 1, CARDS)
    )
    cards = tuple(
        Card(CardUuid(f"GPU-00000000-0000-0000-0000-00000000000{i}"), i, "H100", 81559, numa=i // 4)
        for i in range(CARDS)
    )
    return Node(NodeName(NODE), cards, links)


async def timed(rounds: int, call: Callable[[int], Awaitable[None]]) -> list[float]:
    samples = []
    for i in range(rounds):
        started = time.perf_counter()
        await call(i)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def summary(name: str, samples: list[float], floor: float) -> str:
    q = statistics.quantiles(samples, n=100)
    p50, p99 = statistics.median(samples), q[98]
    return f"{name:<48} p50 {p50:7.3f} ms  p99 {p99:7.3f} ms  ({p50 / floor:5.1f}x echo p50)"


async def main(rounds: int) -> None:
    logging.basicConfig(level=logging.ERROR)
    tmp = Path(tempfile.mkdtemp(prefix="glb-", dir="/tmp"))
    (tmp / "dp").mkdir()
    try:
        async with embedded_nats() as nats_server:
            await run(tmp, nats_server.url, rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def run(tmp: Path, nats_url: str, rounds: int) -> None:
    nc = await bus.connect(nats_url, "bench")
    store = await LedgerStore.open(nc)
    node = eight_cards()
    await store.mutate(NODE, lambda _: NodeLedger(node))
    echo_server = Server([Echo()])
    await echo_server.start(path=str(tmp / "echo.sock"))
    kubelet = FakeKubelet(str(tmp / "dp"), str(tmp / "pr.sock"))
    await kubelet.start()
    settings = PluginSettings(
        node=NODE,
        nats_url=nats_url,
        device_plugin_dir=str(tmp / "dp"),
        pod_resources_socket=str(tmp / "pr.sock"),
        slots_per_card=SLOTS,
        http_host="127.0.0.1",
        http_port=0,
        reconcile_interval_s=3600.0,
        log_level="warning",
    )
    async with running(settings):
        await kubelet.wait_for(lambda k: len(k.healthy()) == CARDS * SLOTS)
        echo = Channel(path=str(tmp / "echo.sock"))
        plugin = Channel(path=str(tmp / "dp" / "gpuledger.sock"))
        stub = dp.DevicePluginStub(plugin)
        try:
            await measure(rounds, store, node, dp.RegistrationStub(echo), stub)
        finally:
            echo.close()
            plugin.close()
    await kubelet.stop()
    echo_server.close()
    await echo_server.wait_closed()
    await nc.close()


async def measure(
    rounds: int,
    store: LedgerStore,
    node: Node,
    echo: dp.RegistrationStub,
    stub: dp.DevicePluginStub,
) -> None:
    async def echo_once(_: int) -> None:
        await echo.register(dp.RegisterRequest(version="v1beta1"))

    await timed(50, echo_once)  # warm up
    floor_samples = await timed(rounds * 3, echo_once)
    floor = statistics.median(floor_samples)

    reserved: dict[int, tuple[str, ...]] = {}

    async def reserve_one(i: int) -> tuple[str, ...]:
        owner = Owner(OwnerKind.POD, f"uid-{i}", "bench", f"pod-{i}")
        card = node.cards[i % CARDS]
        share = CardShare(card.uuid, card.index, 4096, 100)
        allocation = Allocation(
            AllocationId(f"a-{i}"),
            owner,
            NodeName(NODE),
            (Grant("main", (share,)),),
            created_at=time.time(),
        )

        def add(ledger: NodeLedger | None) -> NodeLedger:
            assert ledger is not None
            return reserve(ledger, assign_device_ids(ledger, allocation, SLOTS))

        written = await store.mutate(NODE, add)
        assert written.new is not None
        found = written.new.get(allocation.id)
        assert found is not None
        return found.grants[0].device_ids

    async def forget(i: int) -> None:
        now = time.time()

        def drop(ledger: NodeLedger | None) -> NodeLedger:
            assert ledger is not None
            return prune(release(ledger, AllocationId(f"a-{i}"), now), now, 0.0)

        await store.mutate(NODE, drop)

    allocate_samples: list[float] = []
    for i in range(rounds):
        reserved[i] = await reserve_one(i)
        started = time.perf_counter()
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=list(reserved[i]))]
        )
        response = await stub.allocate(request)
        allocate_samples.append((time.perf_counter() - started) * 1000)
        assert response.container_responses[0].envs["GPULEDGER_ALLOCATION_ID"] == f"a-{i}"
        await forget(i)

    everything = list(node_slots(node, SLOTS))
    ask_topology = dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(
                available_device_i_ds=everything, allocation_size=2
            )
        ]
    )

    async def preferred_topology(_: int) -> None:
        await stub.get_preferred_allocation(ask_topology)

    topology_samples = await timed(rounds, preferred_topology)

    await reserve_one(rounds)  # one pending reservation to steer to

    ask_steered = dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(
                available_device_i_ds=everything, allocation_size=1
            )
        ]
    )

    async def preferred_steered(_: int) -> None:
        await stub.get_preferred_allocation(ask_steered)

    steered_samples = await timed(rounds, preferred_steered)

    print(
        f"plugin benchmark: {CARDS} cards x {SLOTS} slots, {rounds} rounds, "
        "unix sockets, ledger on NATS"
    )
    print(summary("bare grpclib unary echo (unix socket)", floor_samples, floor))
    print(summary("Allocate (ledger read + CAS bound over NATS)", allocate_samples, floor))
    print(summary("GetPreferredAllocation, steered to reservation", steered_samples, floor))
    print(summary("GetPreferredAllocation, topology (8 cards)", topology_samples, floor))
    p99_allocate = statistics.quantiles(allocate_samples, n=100)[98]
    p99_preferred = max(
        statistics.quantiles(s, n=100)[98] for s in (steered_samples, topology_samples)
    )
    print(
        f"targets: Allocate p99 <= 50 ms: {'met' if p99_allocate <= 50 else 'MISSED'}; "
        f"GetPreferredAllocation p99 <= 10 ms: {'met' if p99_preferred <= 10 else 'MISSED'}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=300)
    asyncio.run(main(parser.parse_args().rounds))
