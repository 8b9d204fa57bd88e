"""Reconciling with Kubernetes: a real nats-server, the allocator, the fake API server, the real client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from prometheus_client import REGISTRY

from gpuledger_allocator.kube import ALLOCATION_ANNOTATION, Expired, KubePodLister
from gpuledger_allocator.podcache import PodCache
from gpuledger_common.announce import announce
from gpuledger_common.kubeconfig import from_file
from gpuledger_common.store import LedgerStore, node_key
from gpuledger_core.errors import Unavailable
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, AllocState, CardShare, Grant, Owner, OwnerKind
from gpuledger_dev.fake_apiserver import FakeApiServer
from gpuledger_dev.fleet import Fleet
from gpuledger_dev.natsserver import NatsServer
from gpuledger_placement import convert
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import RunningAllocator, running_allocator, wait_for

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


async def placed_pod(
    store: LedgerStore, apiserver: FakeApiServer, name: str, mem: int = 1000, scheduler: str = "gpuledger-scheduler"
) -> Allocation:
    """A pod bound to rtx-0 with its allocation in the ledger and on its annotation, as bind leaves it."""
    ledger, _ = await store.read(NODE)
    assert ledger is not None
    card = ledger.node.cards[0]
    spec = {"nodeName": NODE, "schedulerName": scheduler}
    pod = apiserver.add_pod({"metadata": {"name": name}, "spec": spec, "status": {"phase": "Running"}})
    owner = Owner(OwnerKind.POD, pod["metadata"]["uid"], "default", name)
    created = time.time() - 60
    grant = Grant("main", (CardShare(card.uuid, card.index, mem, 0),), device_ids=(f"{card.uuid}::1",))
    allocation = Allocation(
        AllocationId(f"a-{name}"), owner, NODE, (grant,), created_at=created, updated_at=created,
        lease_expires_at=created + 300,
    )  # fmt: skip
    await store.mutate(NODE, lambda current: reserve(current, allocation) if current else None)
    assert await store.claim_owner(owner, allocation.id, NODE) is not None
    # written as bind writes it: a watch that sent the pod before sees this change too
    apiserver.annotate("default", name, ALLOCATION_ANNOTATION, convert.allocation_annotation(allocation))
    return allocation


async def state_of(store: LedgerStore, allocation_id: str) -> Allocation | None:
    ledger, _ = await store.read(NODE)
    return ledger.get(AllocationId(allocation_id)) if isinstance(ledger, NodeLedger) else None


async def is_live(store: LedgerStore, allocation: Allocation) -> bool:
    found = await state_of(store, allocation.id)
    return found is not None and found.live


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def rounds(count: int = 2) -> None:
    """Wait until the allocator has made ``count`` more reconcile rounds."""
    seen = metric("gpuledger_allocator_reconcile_rounds_total")

    async def made() -> bool:
        return metric("gpuledger_allocator_reconcile_rounds_total") >= seen + count

    await wait_for(made, what="reconcile rounds")


def pod_requests(apiserver: FakeApiServer) -> int:
    return len([r for r in apiserver.requests if r[1] == "/api/v1/pods"])


def test_the_annotation_name_is_the_one_bind_writes() -> None:
    assert ALLOCATION_ANNOTATION == convert.ALLOCATION_ANNOTATION


async def test_deleted_and_finished_pods_release_their_allocations(
    reconciling: RunningAllocator, store: LedgerStore, apiserver: FakeApiServer
) -> None:
    deleted, finished, running = [await placed_pod(store, apiserver, n) for n in ("gone", "done", "busy")]
    await rounds()
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

    async def forgotten() -> bool:  # owner records are dropped after the release is written
        return [await store.owner_of(a.owner) for a in (deleted, finished)] == [None, None]

    await wait_for(forgotten, what="the owner records of the released allocations dropped")
    assert await store.owner_of(running.owner) is not None
    assert metric("gpuledger_allocator_reconcile_released_total", reason="pod deleted") >= before + 1


async def test_nothing_is_released_while_the_api_server_is_down(
    reconciling: RunningAllocator, store: LedgerStore, apiserver: FakeApiServer
) -> None:
    allocation = await placed_pod(store, apiserver, "quiet")
    await rounds()
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
    await store.kv.delete(node_key(NODE))  # a purge is a rollup, which the allocator's buckets refuse
    await announce(nc, [n.node for n in fleet.nodes if n.node.name == NODE])  # the inventory comes back

    async def back() -> Allocation | None:
        found = await state_of(store, allocation.id)
        return found if found is not None and found.state is AllocState.BOUND else None

    restored = await wait_for(back, what="the allocation rebuilt from the annotation")
    assert restored.grants == allocation.grants and restored.owner == allocation.owner
    assert restored.lease_expires_at is None

    async def counted() -> bool:  # counted once the write is answered, which may come after we read it
        return metric("gpuledger_allocator_reconcile_rebuilt_total") >= rebuilt + 1

    await wait_for(counted, what="the rebuild counted")
    await rounds()  # later rounds leave it be
    assert await state_of(store, allocation.id) == restored


async def test_rounds_read_the_watch_not_a_listing_each(
    reconciling: RunningAllocator, store: LedgerStore, apiserver: FakeApiServer
) -> None:
    allocation = await placed_pod(store, apiserver, "watched")
    await rounds()
    listed = pod_requests(apiserver)
    await rounds(5)
    assert pod_requests(apiserver) == listed  # the watch that is open serves every round
    apiserver.delete_pod("default", "watched")

    async def released() -> bool:
        return not await is_live(store, allocation)

    started = time.monotonic()
    await wait_for(released, what="release of the deleted pod's allocation")
    assert time.monotonic() - started < 10  # the deletion starts a round: no full-interval wait


async def test_a_pod_the_watch_does_not_follow_keeps_its_cards_until_it_is_gone(
    reconciling: RunningAllocator, store: LedgerStore, apiserver: FakeApiServer
) -> None:
    # Bound by another scheduler (outside reconcile_field_selector): read by name, never taken as deleted.
    other = await placed_pod(store, apiserver, "elsewhere", scheduler="default-scheduler")
    reads = metric("gpuledger_allocator_reconcile_pod_reads_total")
    await rounds(3)
    assert await is_live(store, other)
    assert metric("gpuledger_allocator_reconcile_pod_reads_total") >= reads + 3
    assert ("GET", "/api/v1/namespaces/default/pods/elsewhere") in apiserver.requests
    apiserver.set_phase("default", "elsewhere", "Succeeded")

    async def released() -> bool:
        found = await state_of(store, other.id)
        return found is not None and found.state is AllocState.RELEASED and found.reason == "pod finished"

    await wait_for(released, what="release of the finished pod's allocation, read by name")


# --- the adapter alone: paging and failures ---


@pytest.fixture
async def lister(apiserver: FakeApiServer, tmp_path: Path) -> AsyncIterator[KubePodLister]:
    configuration = await from_file(str(apiserver.kubeconfig(tmp_path / "kubeconfig")))
    connected = KubePodLister(configuration, field_selector="")
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
    listed = await lister.list_pods()
    pods = listed.pods
    assert listed.resource_version
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
    lister = KubePodLister(await from_file(str(apiserver.kubeconfig(tmp_path / "kubeconfig"))), field_selector="")
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


async def test_the_lister_lists_only_the_selected_pods(lister: KubePodLister, apiserver: FakeApiServer) -> None:
    some_pods(apiserver, 2)
    apiserver.add_pod({"metadata": {"name": "ours"}, "spec": {"schedulerName": "gpuledger-scheduler"}})
    lister.field_selector = "spec.schedulerName=gpuledger-scheduler"
    assert [p.name for p in (await lister.list_pods()).pods] == ["ours"]
    lister.field_selector = "spec.nodeName=" + NODE
    assert [p.name for p in (await lister.list_pods()).pods] == ["p1"]
    lister.field_selector = "spec.color=blue"
    with pytest.raises(Unavailable, match=r"field label not supported: spec\.color"):
        await lister.list_pods()


async def test_the_watch_brings_every_change_after_the_listing(lister: KubePodLister, apiserver: FakeApiServer) -> None:
    some_pods(apiserver, 2)
    listed = await lister.list_pods()
    apiserver.add_pod({"metadata": {"name": "new"}})  # after the listing, before the watch
    events: list[tuple[str, str, str]] = []

    async def follow() -> None:
        async for event in lister.watch_pods(listed.resource_version, timeout_s=30):
            if event.pod is not None:
                events.append((event.kind, event.pod.name, event.pod.phase))

    following = asyncio.create_task(follow())
    try:
        async def added() -> bool:
            return ("ADDED", "new", "Pending") in events

        async def three() -> bool:
            return len(events) >= 3

        await wait_for(added, what="the pod made after the listing")
        apiserver.set_phase("default", "new", "Running")
        apiserver.delete_pod("ns0", "p0")
        await wait_for(three, what="two more events")
        assert events == [("ADDED", "new", "Pending"), ("MODIFIED", "new", "Running"), ("DELETED", "p0", "Running")]
    finally:
        following.cancel()


async def test_a_watch_from_a_forgotten_version_is_expired(lister: KubePodLister, apiserver: FakeApiServer) -> None:
    some_pods(apiserver, 1)
    listed = await lister.list_pods()
    apiserver.expire_continues()
    apiserver.set_phase("ns0", "p0", "Succeeded")  # the version moves on
    with pytest.raises(Expired, match="too old resource version"):
        async for _ in lister.watch_pods(listed.resource_version, timeout_s=5):
            pass


async def test_the_cache_lists_again_after_an_expired_watch(lister: KubePodLister, apiserver: FakeApiServer) -> None:
    some_pods(apiserver, 1)
    apiserver.bookmark_s = 60.0  # no bookmark moves the watch past the compaction
    cache = PodCache(lister, relist_s=600, retry_s=0.1, watch_s=1)
    listings = metric("gpuledger_allocator_reconcile_listings_total")
    running = asyncio.create_task(cache.run())
    try:
        async def synced() -> bool:
            return cache.synced

        async def later() -> bool:
            return any(p.name == "later" for p in cache.pods.values())

        await wait_for(synced, what="the first listing")
        apiserver.compact()  # the open watch goes on; the next one, from its last version, is too old

        async def listed_again() -> bool:
            return metric("gpuledger_allocator_reconcile_listings_total") >= listings + 2

        await wait_for(listed_again, what="a second listing after the watch expired")
        apiserver.add_pod({"metadata": {"name": "later"}})
        await wait_for(later, what="the new pod in the cache, watched from the new listing")
        assert cache.synced
    finally:
        running.cancel()


async def test_a_replica_started_beside_a_lost_ledger_rebuilds_it_at_once_not_an_interval_later(
    nats_server: NatsServer, store: LedgerStore, apiserver: FakeApiServer, fleet: Fleet, tmp_path: Path
) -> None:
    """The first round runs when the pod watch has listed the pods, not ``reconcile_interval_s``
    after the one the replica tried before it had."""
    node = next(n.node for n in fleet.nodes if n.node.name == NODE)
    await store.mutate(NODE, lambda _: NodeLedger(node, ()))  # the inventory is back, the allocations are not
    card = node.cards[0]
    spec = {"nodeName": NODE, "schedulerName": "gpuledger-scheduler"}
    pod = apiserver.add_pod({"metadata": {"name": "orphan"}, "spec": spec, "status": {"phase": "Running"}})
    owner = Owner(OwnerKind.POD, pod["metadata"]["uid"], "default", "orphan")
    now = time.time()
    allocation = Allocation(
        AllocationId("a-orphan"), owner, NODE, (Grant("main", (CardShare(card.uuid, card.index, 1000, 0),)),),
        AllocState.BOUND, created_at=now, updated_at=now,
    )  # fmt: skip
    pod["metadata"]["annotations"][ALLOCATION_ANNOTATION] = convert.allocation_annotation(allocation)
    kubeconfig = apiserver.kubeconfig(tmp_path / "kubeconfig")
    settings = {"kube": "kubeconfig", "kubeconfig": str(kubeconfig), "reconcile_interval_s": 30.0}
    async with running_allocator(nats_server.url, **settings):
        await wait_for(lambda: is_live(store, allocation), timeout=10.0, what="the allocation rebuilt")
