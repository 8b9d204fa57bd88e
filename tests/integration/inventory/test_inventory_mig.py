"""The node's part of MIG on a real nats-server, with the allocator writing the inventory into the
ledger: a card in MIG mode and its instances reach the ledger; ``mig.make`` makes an instance that
the ledger then shows on demand; it is destroyed once no allocation has held it for
``mig_keep_s``; an XID inside one instance faults that instance only; a restart knows which
instances it made; a scan never interleaves with a MIG change."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from gpuledger_common import bus, inventory_api
from gpuledger_common.store import LedgerStore
from gpuledger_core.errors import FailedPrecondition
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, release, reserve
from gpuledger_core.mig_profiles import A100_40GB
from gpuledger_core.model import Allocation, Card, CardShare, Grant, MigSlot, Owner, OwnerKind, Remedy
from gpuledger_dev.fake_nvml import FakeNvml, ManualClock
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.fleet_script import node_script
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.app import serve
from gpuledger_inventory.inventory import Scan
from gpuledger_inventory.mig_config import MigConfig
from gpuledger_inventory.nvml import NvmlGpus
from gpuledger_inventory.state import Host
from tests.support.replicas import RunningAllocator, running_allocator
from tests.support.waiting import wait_for

from .test_inventory_service import settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

A100 = "NVIDIA A100-SXM4-40GB"
FLEET = f"""
nodes:
  - name: gpu-a
    cards:
      - {{model: {A100}, memory_mib: 40960}}
      - {{model: {A100}, memory_mib: 40960}}
      - {{model: {A100}, memory_mib: 40960}}
    mig:
      - {{card: 0, instances: [3g.20gb, 2g.10gb, 1g.5gb]}}
      - {{card: 1, instances: []}}
"""


def slot(profile: str, start: int) -> MigSlot:
    p = A100_40GB.by_name(profile)
    assert p is not None
    return MigSlot(profile, start, p.memory_slices)


@contextlib.asynccontextmanager
async def inventory(
    url: str, fake: FakeNvml, state_file: Path, gpus: NvmlGpus | None = None, **kw: Any
) -> AsyncIterator[None]:
    stop = asyncio.Event()
    gpus = gpus or NvmlGpus(fake, fake.numa_node, "fake")
    config = settings(url, state_file=str(state_file), **({"mig_keep_s": 1.0} | kw))
    task = asyncio.create_task(serve(config, gpus=gpus, host=Host(224000, 2097152), stop=stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@pytest.fixture
async def allocator(nats_server: NatsServer) -> AsyncIterator[RunningAllocator]:
    async with running_allocator(nats_server.url) as running:
        yield running


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[Client]:
    client = await bus.connect(nats_server.url, "test")
    yield client
    await client.close()


def fleet() -> FakeNvml:
    return FakeNvml(node_script(parse_fleet(FLEET, "fleet.yaml"), "gpu-a"), clock=ManualClock())


async def card(store: LedgerStore, index: int) -> Card:
    ledger, _ = await store.read("gpu-a")
    assert ledger is not None and len(ledger.node.cards) == 3
    return ledger.node.cards[index]


def holding(c: Card, s: MigSlot) -> Allocation:
    share = CardShare(c.uuid, c.index, 5120, 142, False, s)
    owner = Owner(OwnerKind.POD, "pod-1", "default", "pod-1")
    return Allocation(AllocationId("alloc-1"), owner, NodeName("gpu-a"), (Grant("main", (share,)),))


async def test_an_instance_is_made_on_request_shown_on_demand_and_destroyed_once_unheld(
    nats_server: NatsServer, allocator: RunningAllocator, nc: Client, tmp_path: Path
) -> None:
    fake = fleet()
    store = await LedgerStore.open(nc)
    async with inventory(nats_server.url, fake, tmp_path / "state.json"):
        static = await wait_for(lambda: card(store, 0), what="gpu-a in the ledger")
        empty, plain = await card(store, 1), await card(store, 2)
        assert static.mig and len(static.instances) == 3 and all(i.static for i in static.instances)
        assert empty.mig and empty.instances == () and not plain.mig

        made = await inventory_api.make_mig(nc, "gpu-a", empty.uuid, slot("1g.5gb", 6), "alloc-1", 5.0)
        assert made.uuid.startswith("MIG-") and (made.gpu_instance, made.card_index) == (13, 1)
        assert made.minor == empty.minor
        assert "alloc-1" in (tmp_path / "state.json").read_text()  # the intent, on disk

        async def shown() -> Card | None:
            found = await card(store, 1)
            return found if found.instances else None

        one = await wait_for(shown, what="the instance in the ledger")
        assert [(i.slot, i.static, i.uuid) for i in one.instances] == [(slot("1g.5gb", 6), False, made.uuid)]
        again = await inventory_api.make_mig(nc, "gpu-a", empty.uuid, slot("1g.5gb", 6), "alloc-1", 5.0)
        assert again == made
        with pytest.raises(FailedPrecondition, match=r"card 2 .* MIG 1g.5gb at 6: the card is not in MIG mode"):
            await inventory_api.make_mig(nc, "gpu-a", plain.uuid, slot("1g.5gb", 6), "alloc-2", 5.0)

        await store.mutate("gpu-a", lambda ledger: reserve(_known(ledger), holding(one, slot("1g.5gb", 6))))
        await asyncio.sleep(2.0)  # twice mig_keep_s: held, so kept
        assert len((await card(store, 1)).instances) == 1

        await store.mutate("gpu-a", lambda ledger: release(_known(ledger), AllocationId("alloc-1"), time.time()))

        async def gone() -> bool:
            return (await card(store, 1)).instances == ()

        await wait_for(gone, what="the unheld instance destroyed")
        assert MigConfig(fake).read(empty.uuid) == ()
        assert len((await card(store, 0)).instances) == 3  # static: never destroyed


async def test_an_xid_inside_one_instance_faults_it_and_not_its_card(
    nats_server: NatsServer, allocator: RunningAllocator, nc: Client, tmp_path: Path
) -> None:
    fake = fleet()
    store = await LedgerStore.open(nc)
    async with inventory(nats_server.url, fake, tmp_path / "state.json", xid_actions="13=drain", remediate=True):
        before = await wait_for(lambda: card(store, 0), what="gpu-a in the ledger")
        said = await inventory_api.get_inventory(nc, "gpu-a")
        devices = said["extra"]["cards"][0]["mig"]["instances"]
        target = next(d for d in devices if d["uuid"] == before.instances[1].uuid)
        fake.inject_xid(0, 13, gi=target["gpu_instance"], ci=target["compute_instance"])

        async def faulted() -> Card | None:
            found = await card(store, 0)
            return found if any(i.fault for i in found.instances) else None

        after = await wait_for(faulted, what="the instance's fault in the ledger")
        assert after.healthy and after.remedy is Remedy.NONE
        hit = after.instances[1]
        assert hit.fault.startswith(f"XID 13 on {hit.uuid}") and hit.remedy is Remedy.DRAIN
        assert [i.fault for i in after.instances if i is not hit] == ["", ""]
        assert all(c.healthy for c in (await store.read("gpu-a"))[0].node.cards)  # type: ignore[union-attr]


async def test_a_restart_knows_the_instances_it_made_and_forgets_those_gone(
    nats_server: NatsServer, allocator: RunningAllocator, nc: Client, tmp_path: Path
) -> None:
    fake = fleet()
    store = await LedgerStore.open(nc)
    state = tmp_path / "state.json"
    async with inventory(nats_server.url, fake, state):
        empty = await wait_for(lambda: card(store, 1), what="gpu-a in the ledger")
        kept = await inventory_api.make_mig(nc, "gpu-a", empty.uuid, slot("1g.5gb", 6), "alloc-1", 5.0)
        lost = await inventory_api.make_mig(nc, "gpu-a", empty.uuid, slot("1g.5gb", 5), "alloc-2", 5.0)
    config = MigConfig(fake)
    fake.nvmlInit()  # an operator's tool, while the inventory is away
    config.destroy(empty.uuid, lost.gpu_instance)  # gone
    config.create(empty.uuid, 0, slot("1g.5gb", 4))  # made by hand: static
    fake.nvmlShutdown()

    async with inventory(nats_server.url, fake, state, inventory_interval_s=60.0):

        async def republished() -> Card | None:
            found = await card(store, 1)
            return found if any(i.slot == slot("1g.5gb", 4) for i in found.instances) else None

        after = await wait_for(republished, what="the restarted inventory's instances")
        assert [(i.slot, i.static) for i in after.instances] == [(slot("1g.5gb", 4), True), (slot("1g.5gb", 6), False)]
        assert after.instances[1].uuid == kept.uuid
        assert "alloc-2" not in state.read_text() and "alloc-1" in state.read_text()


async def test_a_placement_over_unheld_instances_made_on_demand_destroys_them_once_let_go(
    nats_server: NatsServer, allocator: RunningAllocator, nc: Client, tmp_path: Path
) -> None:
    """Kept for reuse (``mig_keep_s``), an unheld instance made on demand gives way to a placement
    over it: destroyed, then the new one made. One still held in the ledger, or still running a
    process (a preempted pod ending), is waited for; a static one is never destroyed."""
    fake = fleet()
    store = await LedgerStore.open(nc)
    async with inventory(nats_server.url, fake, tmp_path / "state.json", mig_keep_s=600.0):
        empty = await wait_for(lambda: card(store, 1), what="gpu-a in the ledger")
        small = await inventory_api.make_mig(nc, "gpu-a", empty.uuid, slot("1g.5gb", 6), "alloc-1", 5.0)
        await store.mutate("gpu-a", lambda ledger: reserve(_known(ledger), holding(empty, slot("1g.5gb", 6))))

        big = asyncio.create_task(inventory_api.make_mig(nc, "gpu-a", empty.uuid, slot("3g.20gb", 4), "alloc-2", 20.0))
        await asyncio.sleep(1.0)
        assert not big.done()  # held by alloc-1
        fake.set_processes(1, [(4242, 1000, (small.gpu_instance, small.compute_instance))])
        await store.mutate("gpu-a", lambda ledger: release(_known(ledger), AllocationId("alloc-1"), time.time()))
        await asyncio.sleep(1.0)
        assert not big.done()  # let go in the ledger, but its process still runs
        assert [gi.start for gi in MigConfig(fake).read(empty.uuid)] == [6]
        fake.set_processes(1, [])
        made = await asyncio.wait_for(big, 10)
        assert [(gi.profile, gi.start) for gi in MigConfig(fake).read(empty.uuid)] == [("3g.20gb", 4)]
        assert made.uuid != small.uuid and made.card_index == 1

        static = await card(store, 0)
        with pytest.raises(FailedPrecondition, match=r"overlaps the static instance .* never destroyed"):
            await inventory_api.make_mig(nc, "gpu-a", static.uuid, slot("7g.40gb", 0), "alloc-3", 5.0)


class HeldScan(NvmlGpus):
    """NVML whose next scan, once armed, reads the cards and then waits for ``go`` before it answers:
    a scan that read the node before a change and would be applied after it."""

    def __init__(self, fake: FakeNvml) -> None:
        super().__init__(fake, fake.numa_node, "fake")
        self.armed, self.read, self.go = False, threading.Event(), threading.Event()

    def scan(self) -> Scan:
        found = super().scan()
        if self.armed:
            self.armed = False
            self.read.set()
            self.go.wait(10)
        return found


async def test_an_instance_made_while_the_node_is_scanned_stays_on_demand(
    nats_server: NatsServer, allocator: RunningAllocator, nc: Client, tmp_path: Path
) -> None:
    """A scan of the node's NVML loop (after any MIG change NVML reports) that read the cards before
    an instance was made must not be applied after the make: it would forget the make's record, and
    the instance would be published as static, never reused by another profile nor destroyed. The
    make waits for the scan."""
    fake = fleet()
    gpus = HeldScan(fake)
    store = await LedgerStore.open(nc)
    async with inventory(nats_server.url, fake, tmp_path / "state.json", gpus=gpus, mig_keep_s=1.0):
        static, empty = await wait_for(lambda: card(store, 0), what="gpu-a in the ledger"), await card(store, 1)
        gpus.armed = True
        fake.nvmlInit()  # an operator's tool: an instance made by hand (static), so NVML reports a change
        MigConfig(fake).create(static.uuid, 0, slot("1g.5gb", 3))
        fake.nvmlShutdown()
        assert await asyncio.to_thread(gpus.read.wait, 10), "the NVML loop scanned after the change"

        make = asyncio.create_task(inventory_api.make_mig(nc, "gpu-a", empty.uuid, slot("1g.5gb", 6), "alloc-1", 10.0))
        await asyncio.wait({make}, timeout=2.0)  # made at once where a scan does not hold the changes back
        gpus.go.set()
        made = await asyncio.wait_for(make, 10)

        async def shown() -> Card | None:
            found = await card(store, 1)
            return found if found.instances else None

        one = await wait_for(shown, what="the instance in the ledger")
        assert [(i.slot, i.static, i.uuid) for i in one.instances] == [(slot("1g.5gb", 6), False, made.uuid)]
        assert "alloc-1" in (tmp_path / "state.json").read_text()

        async def gone() -> bool:
            return (await card(store, 1)).instances == ()

        await wait_for(gone, what="the unheld instance destroyed (on demand, not static)")
        assert slot("1g.5gb", 3) in {i.slot for i in (await card(store, 0)).instances if i.static}


def _known(ledger: NodeLedger | None) -> NodeLedger:
    assert ledger is not None
    return ledger
