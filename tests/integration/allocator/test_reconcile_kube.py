"""Reconciling with Kubernetes: a real nats-server, the allocator, the fake API server, the real client."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from prometheus_client import REGISTRY

from gpuledger_allocator.kube import ALLOCATION_ANNOTATION, KubePodLister
from gpuledger_common.announce import announce
from gpuledger_common.fleet import Fleet
from gpuledger_common.natsserver import NatsServer
from gpuledger_common.store import LedgerStore, node_key
from gpuledger_core.errors import Unavailable
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, AllocState, CardShare, Grant, Owner, OwnerKind
from gpuledger_placement import convert
from gpuledger_proto.gpuledger.allocator import v1 as pb
from gpuledger_testing.fake_apiserver import FakeApiServer
from gpuledger_testing.stack import RunningAllocator, running_allocator, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NODE = NodeName("rtx-0")


@pytest.fixture
async def store(nc: Client) -> LedgerStore:
    return await LedgerStore.open(nc)


@pytest.fixture
async def reconciling(
    nats_server: NatsServer, nc: Client, fleet: Fleet, apiserver: FakeApiServer, tmp_path: Path
) -> AsyncIterator[RunningAllocator]:
    kubeconfig = apiserver.kubeconfig(tmp_path / "kubeconfig")
    settings = {"kube": "kubeconfig", "kubeconfig": str(kubeconfig), "reconcile_interval_s": 0.05}
    async with running_allocator(nats_server.url, reconcile_grace_s=5.0, **settings) as running:
        await announce(nc, [n.node for n in fleet.nodes])
        stub = running.stub()

        async def all_nodes() -> bool:
            return len((await stub.get_cluster(pb.GetClusterRequest())).nodes) == len(fleet.nodes)

        await wait_for(all_nodes, what="fleet in the ledger")
        yield running


async def placed_pod(store: LedgerStore, apiserver: FakeApiServer, name: str, mem: int = 1000) -> Allocation:
    """A pod bound to rtx-0 with its allocation in the ledger and on its annotation, as bind leaves it."""
    ledger, _ = await store.read(NODE)
    assert ledger is not None
    card = ledger.node.cards[0]
    pod = apiserver.add_pod({"metadata": {"name": name}, "spec": {"nodeName": NODE}, "status": {"phase": "Running"}})
    owner = Owner(OwnerKind.POD, pod["metadata"]["uid"], "default", name)
    created = time.time() - 60
    grant = Grant("main", (CardShare(card.uuid, card.index, mem, 0),), device_ids=(f"{card.uuid}::1",))
    allocation = Allocation(
        AllocationId(f"a-{name}"), owner, NODE, (grant,), created_at=created, updated_at=created,
        lease_expires_at=created + 300,
    )  # fmt: skip
    await store.mutate(NODE, lambda current: reserve(current, allocation) if current else None)
    assert await store.claim_owner(owner, allocation.id, NODE) is not None
    pod["metadata"]["annotations"][ALLOCATION_ANNOTATION] = convert.allocation_annotation(allocation)
    return allocation


async def state_of(store: LedgerStore, allocation_id: str) -> Allocation | None:
    ledger, _ = await store.read(NODE)
    return ledger.get(AllocationId(allocation_id)) if isinstance(ledger, NodeLedger) else None


async def is_live(store: LedgerStore, allocation: Allocation) -> bool:
    found = await state_of(store, allocation.id)
    return found is not None and found.live


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def rounds(apiserver: FakeApiServer, count: int = 2) -> None:
    """Wait until the allocator has listed pods ``count`` more times."""
    seen = len([r for r in apiserver.requests if r[1] == "/api/v1/pods"])

    async def listed() -> bool:
        return len([r for r in apiserver.requests if r[1] == "/api/v1/pods"]) >= seen + count

    await wait_for(listed, what="reconcile rounds")


def test_the_annotation_name_is_the_one_bind_writes() -> None:
    assert ALLOCATION_ANNOTATION == convert.ALLOCATION_ANNOTATION


async def test_deleted_and_finished_pods_release_their_allocations(
    reconciling: RunningAllocator, store: LedgerStore, apiserver: FakeApiServer
) -> None:
    deleted, finished, running = [await placed_pod(store, apiserver, n) for n in ("gone", "done", "busy")]
    await rounds(apiserver)
    assert [await is_live(store, a) for a in (deleted, finished, running)] == [True, True, True]
    before = metric("gpuledger_allocator_reconcile_released_total", reason="pod deleted")
    apiserver.delete_pod("default", "gone")
    apiserver.set_phase("default", "done", "Succeeded")

    async def released(allocation_id: str, reason: str) -> bool:
        found = await state_of(store, allocation_id)
        return found is not None and found.state is AllocState.RELEASED and found.reason == reason

    await wait_for(lambda: released(deleted.id, "pod deleted"), what="release of the deleted pod's allocation")
    await wait_for(lambda: released(finished.id, "pod finished"), what="release of the finished pod's allocation")
    assert await is_live(store, running)
    assert await store.owner_of(deleted.owner) is None
    assert metric("gpuledger_allocator_reconcile_released_total", reason="pod deleted") >= before + 1


async def test_nothing_is_released_while_the_api_server_is_down(
    reconciling: RunningAllocator, store: LedgerStore, apiserver: FakeApiServer
) -> None:
    allocation = await placed_pod(store, apiserver, "quiet")
    await rounds(apiserver)
    await apiserver.close()
    apiserver.delete_pod("default", "quiet")
    failures = metric("gpuledger_allocator_reconcile_list_failures_total")

    async def failed_twice() -> bool:
        return metric("gpuledger_allocator_reconcile_list_failures_total") >= failures + 2

    await wait_for(failed_twice, what="failed listings")
    assert await is_live(store, allocation)
    await apiserver.start()

    async def released() -> bool:
        return not await is_live(store, allocation)

    await wait_for(released, what="release once the API server is back")


async def test_a_lost_ledger_is_rebuilt_from_the_annotations(
    reconciling: RunningAllocator, store: LedgerStore, apiserver: FakeApiServer, nc: Client, fleet: Fleet
) -> None:
    allocation = await placed_pod(store, apiserver, "survivor", mem=2000)
    rebuilt = metric("gpuledger_allocator_reconcile_rebuilt_total")
    await store.kv.purge(node_key(NODE))
    await announce(nc, [n.node for n in fleet.nodes if n.node.name == NODE])  # the inventory comes back

    async def back() -> Allocation | None:
        found = await state_of(store, allocation.id)
        return found if found is not None and found.state is AllocState.BOUND else None

    restored = await wait_for(back, what="the allocation rebuilt from the annotation")
    assert restored.grants == allocation.grants and restored.owner == allocation.owner
    assert restored.lease_expires_at is None
    assert metric("gpuledger_allocator_reconcile_rebuilt_total") >= rebuilt + 1
    await rounds(apiserver)  # later rounds leave it be
    assert await state_of(store, allocation.id) == restored


# --- the adapter alone: paging and failures ---


@pytest.fixture
async def lister(apiserver: FakeApiServer, tmp_path: Path) -> AsyncIterator[KubePodLister]:
    connected = await KubePodLister.connect(False, str(apiserver.kubeconfig(tmp_path / "kubeconfig")))
    connected.page_size = 2
    yield connected
    await connected.close()


def some_pods(apiserver: FakeApiServer, count: int = 5) -> None:
    for i in range(count):
        spec = {"nodeName": NODE} if i % 2 else {}
        meta = {"name": f"p{i}", "namespace": f"ns{i % 2}", "annotations": {ALLOCATION_ANNOTATION: "not json"}}
        apiserver.add_pod({"metadata": meta, "spec": spec, "status": {"phase": "Running"}})


async def test_the_lister_reads_every_page(lister: KubePodLister, apiserver: FakeApiServer) -> None:
    some_pods(apiserver)
    pods = await lister.list_pods()
    assert sorted(p.name for p in pods) == [f"p{i}" for i in range(5)]
    assert {p.node for p in pods} == {"", NODE} and all(p.allocation is None for p in pods)  # bad annotation
    assert len([r for r in apiserver.requests if r[1] == "/api/v1/pods"]) == 3


async def test_the_lister_fails_whole_on_a_failed_later_page(lister: KubePodLister, apiserver: FakeApiServer) -> None:
    some_pods(apiserver)
    apiserver.fail_lists = [None, (503, "too many requests")]
    with pytest.raises(Unavailable, match="too many requests"):
        await lister.list_pods()


async def test_continued_pages_come_from_the_first_snapshot(apiserver: FakeApiServer, tmp_path: Path) -> None:
    some_pods(apiserver, 4)
    lister = await KubePodLister.connect(False, str(apiserver.kubeconfig(tmp_path / "kubeconfig")))
    lister.page_size = 2
    try:
        first = await lister._page("")
        apiserver.delete_pod("ns1", "p3")
        second = await lister._page(first["metadata"]["continue"])
        assert [p["metadata"]["name"] for p in first["items"] + second["items"]] == ["p0", "p2", "p1", "p3"]
        apiserver.expire_continues()
        with pytest.raises(Unavailable, match="too old"):
            await lister._page(first["metadata"]["continue"])
    finally:
        await lister.close()
