"""The plugin shim against a fake kubelet, a real nats-server and the real ledger store."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.store import LedgerStore
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import (
    Allocation,
    Card,
    CardShare,
    Grant,
    Isolation,
    Link,
    Node,
    Owner,
    OwnerKind,
    PcieLevel,
)
from gpuledger_core.slots import assign_device_ids
from gpuledger_dev.fake_kubelet import FakeContainer, FakeKubelet, FakePod
from gpuledger_dev.natsserver import NatsServer, embedded_nats
from gpuledger_plugin.app import Running, running
from gpuledger_plugin.settings import PluginSettings

NODE = "n1"
SLOTS = 4
CARDS = 4


def make_node(cards: int = CARDS) -> Node:
    links = tuple(
        Link(
            a,
            b,
            4 if a // 2 == b // 2 else 0,
            PcieLevel.SINGLE_SWITCH if a // 2 == b // 2 else PcieLevel.SYSTEM,
        )
        for a in range(cards)
        for b in range(a + 1, cards)
    )
    return Node(
        NodeName(NODE),
        tuple(
            Card(CardUuid(f"GPU-card-{i}"), i, "H100", 81920, numa=i // 2, minor=i)
            for i in range(cards)
        ),
        links,
    )


def share(card: int, mem: int = 4096, core: int = 250) -> CardShare:
    return CardShare(CardUuid(f"GPU-card-{card}"), card, mem, core)


@dataclass
class Stack:
    nats: NatsServer
    nc: Client
    store: LedgerStore
    kubelet: FakeKubelet
    plugin: Running
    dirs: Path

    async def reserve(
        self,
        pod: FakePod,
        shares: dict[str, tuple[CardShare, ...]],
        isolation: Isolation = Isolation.NONE,
    ) -> Allocation:
        """What the extender does at bind: reserve exact cards and slot IDs per container."""
        grants = tuple(
            Grant(c.name, shares[c.name], init=c.init) for c in pod.containers if c.name in shares
        )
        owner = Owner(OwnerKind.POD, pod.uid, pod.namespace, pod.name)
        now = time.time()
        allocation = Allocation(
            AllocationId(f"alloc-{pod.name}"),
            owner,
            NodeName(NODE),
            grants,
            isolation=isolation,
            created_at=now,
            updated_at=now,
            lease_expires_at=now + 300,
        )

        def transition(ledger: NodeLedger | None) -> NodeLedger:
            assert ledger is not None
            return reserve(ledger, assign_device_ids(ledger, allocation, SLOTS))

        written = await self.store.mutate(NODE, transition)
        assert written.new is not None
        found = written.new.get(allocation.id)
        assert found is not None
        return found

    async def ledger(self) -> NodeLedger:
        ledger, _ = await self.store.read(NODE)
        assert ledger is not None
        return ledger


def pod(name: str, *containers: FakeContainer) -> FakePod:
    return FakePod("default", name, f"uid-{name}", containers)


@pytest.fixture
def dirs() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gl-", dir="/tmp"))  # unix socket paths must stay short
    (path / "dp").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def nats_server() -> AsyncIterator[NatsServer]:
    async with embedded_nats() as server:
        yield server


def settings_for(dirs: Path, nats_url: str, **extra: object) -> PluginSettings:
    values: dict[str, object] = {
        "node": NODE,
        "nats_url": nats_url,
        "device_plugin_dir": str(dirs / "dp"),
        "pod_resources_socket": str(dirs / "pr.sock"),
        "slots_per_card": SLOTS,
        "http_host": "127.0.0.1",
        "http_port": 0,
        "kubelet_poll_s": 0.05,
        "reconcile_interval_s": 3600.0,
        "answer_timeout_s": 1.5,
        "preferred_wait_s": 1.0,  # each below answer_timeout_s
        "allocate_wait_s": 1.0,
        "placement_timeout_s": 0.05,
    }
    values.update(extra)
    return PluginSettings(**values)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def plugin_stack(dirs: Path, nats_server: NatsServer, **settings: object) -> AsyncIterator[Stack]:
    """The plugin shim with a fake kubelet on a one-node ledger; ``settings`` override the test defaults."""
    nc = await bus.connect(nats_server.url, "test")
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: NodeLedger(make_node()))
    kubelet = FakeKubelet(str(dirs / "dp"), str(dirs / "pr.sock"))
    await kubelet.start()
    try:
        async with running(settings_for(dirs, nats_server.url, **settings)) as plugin:
            await kubelet.wait_for(lambda k: len(k.healthy()) == CARDS * SLOTS)
            yield Stack(nats_server, nc, store, kubelet, plugin, dirs)
    finally:
        await kubelet.stop()
        await nc.close()


@pytest.fixture
async def stack(dirs: Path, nats_server: NatsServer) -> AsyncIterator[Stack]:
    async with plugin_stack(dirs, nats_server) as running_stack:
        yield running_stack
