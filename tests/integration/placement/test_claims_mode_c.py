"""The claims controller's part in DRA mode C, against a real nats-server: a claim the ledger
allocated that no pod will use any more is deallocated and released (and one a waiting pod names is
not); a failed write of mode C's allocation releases only that replica's entry, and none when the
claim was allocated meanwhile by another replica. The API server is a double holding claims and
pods by path (its contract with the real one is the e2e suite's: tests/e2e/test_dra_mode_c.py)."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.aio.client import Client

from gpuledger_common.store import LedgerStore
from gpuledger_core import claims
from gpuledger_core.claims import AllocatedDevice, ClaimRef
from gpuledger_core.errors import Conflict, NotFound
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, release
from gpuledger_core.model import Allocation, AllocState, Node
from gpuledger_core.preemption import PREEMPTED_BY
from gpuledger_dev.fleet import Fleet
from gpuledger_placement import claims_sweep
from gpuledger_placement.claim_write import finalize
from gpuledger_placement.claims import ALLOCATED_BY_LEDGER, DRIVER, WRITING_S, ClaimsController, claim_path
from gpuledger_placement.view import FleetView

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NS = "ns"


class Objects:
    """Claims and pods by path, with resourceVersions; a write with a stale one is a Conflict."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.version = 0

    def put(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.items[path] = stored
        return copy.deepcopy(stored)

    async def list_objects(self, path: str, params: Mapping[str, str], timeout_s: float = 60.0) -> dict[str, Any]:
        found = [copy.deepcopy(v) for k, v in self.items.items() if k.startswith(f"{path}/")]
        return {"items": found, "metadata": {"resourceVersion": str(self.version)}}

    async def watch(
        self, path: str, params: Mapping[str, str], timeout_s: float = 300.0
    ) -> AsyncIterator[dict[str, Any]]:
        raise AssertionError("not watched here")
        yield {}

    async def get_object(self, path: str) -> dict[str, Any]:
        if path not in self.items:
            raise NotFound(f"{path} not found")
        return copy.deepcopy(self.items[path])

    async def replace_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        main = path.removesuffix("/status")
        if main not in self.items:
            raise NotFound(f"{main} not found")
        if body["metadata"].get("resourceVersion") != self.items[main]["metadata"]["resourceVersion"]:
            raise Conflict(f"{main} changed")
        merged = copy.deepcopy(self.items[main])
        if path.endswith("/status"):
            merged["status"] = copy.deepcopy(body.get("status") or {})
        else:
            merged["metadata"] = copy.deepcopy(dict(body["metadata"]))
        return self.put(main, merged)


def stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def allocated_by_ledger(
    api: Objects, store: LedgerStore, view: FleetView, fleet: Fleet, name: str, device: str, age_s: float
) -> tuple[dict[str, Any], Allocation]:
    """Claim ``name`` allocated by mode C ``age_s`` ago on the first node's ``device``, reserved for
    no pod, with gpuledger's finalizer; its entry in the ledger and the view."""
    node = big(fleet)
    ref = ClaimRef(NS, name, f"uid-{name}")
    result = {"request": "gpu", "driver": DRIVER, "pool": str(node.name), "device": device}
    body = {
        "metadata": {"namespace": NS, "name": name, "uid": ref.uid, "finalizers": [ALLOCATED_BY_LEDGER]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {"allocation": {"devices": {"results": [result]}, "allocationTimestamp": stamp(time.time() - age_s)}},
    }
    stored = api.put(claim_path(ref), body)
    devices = [AllocatedDevice("gpu", node.name, device)]
    entry = claims.ledger_allocation(ref, devices, node, time.time() - age_s)

    def add(ledger: NodeLedger | None) -> NodeLedger:
        held = ledger.allocations if ledger is not None else ()
        return NodeLedger(node, (*held, entry))

    written = await store.mutate(node.name, add)
    assert written.new is not None
    view.apply(node.name, written.new, written.revision)
    return stored, entry


def big(fleet: Fleet) -> Node:
    """The fleet's node with the most cards."""
    return max((m.node for m in fleet.nodes), key=lambda n: len(n.cards))


async def world(nc: Client) -> tuple[Objects, LedgerStore, FleetView, ClaimsController]:
    api = Objects()
    store = await LedgerStore.open(nc, retry_s=0.5)
    view = FleetView(store, stale_after_s=0, slots_per_card=8)
    view.ready.set()
    return api, store, view, ClaimsController(api, store, view)


async def held(store: LedgerStore, fleet: Fleet, uid: str) -> AllocationId | None:
    ledger, _ = await store.read(big(fleet).name)
    found = ledger.of_owner(f"claim:{uid}") if ledger is not None else None
    return found.id if found is not None else None


async def test_a_claim_no_pod_will_use_is_deallocated_its_entry_released_and_its_finalizer_removed(
    nc: Client, fleet: Fleet
) -> None:
    api, store, view, controller = await world(nc)
    claim, _ = await allocated_by_ledger(api, store, view, fleet, "unused", "gpu-0", age_s=60)
    await controller.settle(claim)
    after = await api.get_object(claim_path(claims.ref_of(claim)))
    assert "allocation" not in after["status"]
    assert ALLOCATED_BY_LEDGER not in after["metadata"]["finalizers"]
    assert await held(store, fleet, "uid-unused") is None


async def test_a_deleted_claim_s_entry_is_released_even_before_this_replica_s_view_has_seen_it(
    nc: Client, fleet: Fleet
) -> None:
    """Another placement replica allocated the claims; this replica's view has not seen those
    writes yet when it settles their deletion: the node comes from each claim's allocation."""
    api, store, view, _ = await world(nc)
    blind = FleetView(store, stale_after_s=0, slots_per_card=8)  # this replica's: never fed
    blind.ready.set()
    controller = ClaimsController(api, store, blind)
    deleting, _ = await allocated_by_ledger(api, store, view, fleet, "deleting", "gpu-0", age_s=60)
    deleting["metadata"]["deletionTimestamp"] = stamp(time.time())
    await controller.settle(deleting)  # being deleted, reserved for no pod: released, finalizer off
    assert await held(store, fleet, "uid-deleting") is None
    after = await api.get_object(claim_path(claims.ref_of(deleting)))
    assert ALLOCATED_BY_LEDGER not in after["metadata"]["finalizers"]
    deleted, _ = await allocated_by_ledger(api, store, view, fleet, "deleted", "gpu-1", age_s=60)
    controller.offer(deleted, deleted=True)  # the watch's DELETED event, with the claim's last state
    await controller.idle()
    assert await held(store, fleet, "uid-deleted") is None
    assert not blind.holders  # the view still knows neither: the releases went by the claims


async def test_a_claim_a_waiting_pod_names_or_a_young_one_stays_allocated(nc: Client, fleet: Fleet) -> None:
    api, store, view, controller = await world(nc)
    awaited, awaited_id = await allocated_by_ledger(api, store, view, fleet, "awaited", "gpu-0", age_s=60)
    young, young_id = await allocated_by_ledger(api, store, view, fleet, "young", "gpu-1", age_s=1)
    waiting = {"resourceClaims": [{"name": "gpu", "resourceClaimName": "awaited"}], "containers": []}
    api.put(f"/api/v1/namespaces/{NS}/pods/next", {"metadata": {"name": "next", "namespace": NS}, "spec": waiting})
    ran = {"nodeName": "n", "resourceClaims": [{"name": "gpu", "resourceClaimName": "young"}], "containers": []}
    api.put(f"/api/v1/namespaces/{NS}/pods/ran", {"metadata": {"name": "ran", "namespace": NS}, "spec": ran})
    for claim in (awaited, young):
        await controller.settle(claim)
    for claim, entry in ((awaited, awaited_id), (young, young_id)):
        after = await api.get_object(claim_path(claims.ref_of(claim)))
        assert after["status"].get("allocation") and ALLOCATED_BY_LEDGER in after["metadata"]["finalizers"]
        assert await held(store, fleet, claims.ref_of(claim).uid) == entry.id
    assert set(controller._rechecks) == {"uid-awaited", "uid-young"}  # each looked at again later
    for task in controller._rechecks.values():
        task.cancel()


async def test_a_failed_write_releases_only_this_replicas_entry_and_none_of_a_claim_allocated_meanwhile(
    nc: Client, fleet: Fleet
) -> None:
    api, store, view, controller = await world(nc)
    # Allocated meanwhile (another replica's write won): its entry stays, whatever this replica says.
    theirs, their_entry = await allocated_by_ledger(api, store, view, fleet, "theirs", "gpu-0", age_s=0)
    await controller.withdraw(claims.ref_of(theirs), replace(their_entry, id=AllocationId("c-mine")), "test")
    await controller.idle()
    assert await held(store, fleet, "uid-theirs") == their_entry.id
    # Not allocated: only this replica's entry goes, not one another replica wrote (another id, or
    # the same id, the same cards chosen, written at another time).
    bare, bare_entry = await allocated_by_ledger(api, store, view, fleet, "bare", "gpu-1", age_s=0)
    path = claim_path(claims.ref_of(bare))
    api.items[path]["status"] = {}
    await controller.withdraw(claims.ref_of(bare), replace(bare_entry, id=AllocationId("c-not-this-one")), "test")
    assert await held(store, fleet, "uid-bare") == bare_entry.id
    other_write = replace(bare_entry, created_at=bare_entry.created_at - 0.25)
    await controller.withdraw(claims.ref_of(bare), other_write, "test")
    assert await held(store, fleet, "uid-bare") == bare_entry.id
    await controller.withdraw(claims.ref_of(bare), bare_entry, "test")
    assert await held(store, fleet, "uid-bare") is None


async def test_a_young_entry_of_an_unallocated_claim_a_pod_waits_for_is_left_to_the_replica_writing_it(
    nc: Client, fleet: Fleet
) -> None:
    """Another placement replica has reserved the claim's entry and not yet written the claim: the
    entry stays (released, should the claim still be unallocated once it is ``WRITING_S`` old)."""
    api, store, view, controller = await world(nc)
    claim, entry = await allocated_by_ledger(api, store, view, fleet, "writing", "gpu-0", age_s=1)
    path = claim_path(claims.ref_of(claim))
    api.items[path]["status"] = {}
    waiting = {"resourceClaims": [{"name": "gpu", "resourceClaimName": "writing"}], "containers": []}
    api.put(f"/api/v1/namespaces/{NS}/pods/app", {"metadata": {"name": "app", "namespace": NS}, "spec": waiting})
    await controller.settle(await api.get_object(path))
    assert await held(store, fleet, "uid-writing") == entry.id
    assert set(controller._rechecks) == {"uid-writing"}
    controller._rechecks.pop("uid-writing").cancel()
    controller.clock = lambda: time.time() + WRITING_S  # still unallocated that much later: released
    await controller.settle(await api.get_object(path))
    assert await held(store, fleet, "uid-writing") is None
    # No pod waits for it: released at once, young or not.
    lone, _ = await allocated_by_ledger(api, store, view, fleet, "lone", "gpu-1", age_s=1)
    controller.clock = time.time
    api.items[claim_path(claims.ref_of(lone))]["status"] = {}
    await controller.settle(await api.get_object(claim_path(claims.ref_of(lone))))
    assert await held(store, fleet, "uid-lone") is None


async def test_a_young_entry_of_a_claim_its_waiting_pod_owns_but_does_not_name_yet_stays(
    nc: Client, fleet: Fleet
) -> None:
    """Mode C allocates a template's claim as soon as kube-controller-manager makes it, before the
    pod's status names it: the pod owning it waits for it as much as one naming it."""
    api, store, view, controller = await world(nc)
    claim, entry = await allocated_by_ledger(api, store, view, fleet, "made", "gpu-0", age_s=1)
    path = claim_path(claims.ref_of(claim))
    api.items[path]["status"] = {}
    owner = {"kind": "Pod", "name": "app", "uid": "pod-1", "controller": True}
    api.items[path]["metadata"]["ownerReferences"] = [owner]
    waiting = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one"}], "containers": []}
    meta = {"name": "app", "namespace": NS, "uid": "pod-1"}
    api.put(f"/api/v1/namespaces/{NS}/pods/app", {"metadata": meta, "spec": waiting})
    await controller.settle(await api.get_object(path))
    assert await held(store, fleet, "uid-made") == entry.id
    controller._rechecks.pop("uid-made").cancel()
    api.items[f"/api/v1/namespaces/{NS}/pods/app"]["metadata"]["uid"] = "pod-2"  # another pod of that name
    await controller.settle(await api.get_object(path))
    assert await held(store, fleet, "uid-made") is None


async def test_an_entry_mode_c_wrote_itself_is_not_read_again_to_be_proved(nc: Client, fleet: Fleet) -> None:
    """The claims controller holds a mode-C claim's allocation with a compare-and-set that finds
    nothing to change, and so reads the node's ledger to prove it; after this replica's own write of
    that very entry (``written_here``) it does not, once."""
    api, store, view, controller = await world(nc)
    claim, entry = await allocated_by_ledger(api, store, view, fleet, "mine", "gpu-0", age_s=1)
    reads = store._writes.stats.reads
    controller.written_here["uid-mine"] = entry.id
    await controller.settle(claim)
    assert store._writes.stats.reads == reads and controller.written_here == {}
    await controller.settle(claim)  # any later version: proved by a read as before
    assert store._writes.stats.reads == reads + 1
    assert await held(store, fleet, "uid-mine") == entry.id
    for task in controller._rechecks.values():
        task.cancel()


async def test_a_claim_preemption_took_back_is_not_held_again_and_is_deallocated_though_a_pod_waits(
    nc: Client, fleet: Fleet
) -> None:
    api, store, view, controller = await world(nc)
    claim, entry = await allocated_by_ledger(api, store, view, fleet, "victim", "gpu-0", age_s=60)
    node = big(fleet).name

    def take_back(ledger: NodeLedger | None) -> NodeLedger:
        assert ledger is not None
        return release(ledger, entry.id, time.time(), f"{PREEMPTED_BY}pod {NS}/high")

    written = await store.mutate(node, take_back)
    assert written.new is not None
    view.apply(node, written.new, written.revision)
    next_pod = {"resourceClaims": [{"name": "gpu", "resourceClaimName": "victim"}], "containers": []}
    api.put(f"/api/v1/namespaces/{NS}/pods/next", {"metadata": {"name": "next", "namespace": NS}, "spec": next_pod})
    await controller.settle(claim)  # still allocated in the API, reserved for no pod, a pod waiting for it
    assert await held(store, fleet, "uid-victim") is None  # not held again
    after = await api.get_object(claim_path(claims.ref_of(claim)))
    assert "allocation" not in after["status"]  # deallocated: its next pod gets a new allocation
    assert ALLOCATED_BY_LEDGER not in after["metadata"]["finalizers"]


async def test_the_room_preemption_holds_for_an_unallocated_claim_stays_until_the_claim_is_allocated(
    nc: Client, fleet: Fleet
) -> None:
    api, store, view, controller = await world(nc)
    claim, entry = await allocated_by_ledger(api, store, view, fleet, "high", "gpu-0", age_s=60)
    node = big(fleet).name
    hold = replace(entry, state=AllocState.RESERVED, lease_expires_at=time.time() + 120)

    def held_room(ledger: NodeLedger | None) -> NodeLedger:
        assert ledger is not None
        return NodeLedger(ledger.node, tuple(hold if a.id == entry.id else a for a in ledger.allocations))

    written = await store.mutate(node, held_room)
    assert written.new is not None
    view.apply(node, written.new, written.revision)
    path = claim_path(claims.ref_of(claim))
    api.items[path]["status"] = {}
    await controller.settle(await api.get_object(path))
    assert await held(store, fleet, "uid-high") == entry.id
    listed = await api.list_objects(f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims", {})
    await claims_sweep.release_orphans(controller, listed["items"], time.time() + 3600)
    assert await held(store, fleet, "uid-high") == entry.id
    controller.offer(await api.get_object(path), deleted=True)  # the claim deleted: its room goes
    await controller.idle()
    assert await held(store, fleet, "uid-high") is None


class Watched(Objects):
    """Objects whose watch of claims brings what the test puts in ``events``."""

    def __init__(self) -> None:
        super().__init__()
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def watch(
        self, path: str, params: Mapping[str, str], timeout_s: float = 300.0
    ) -> AsyncIterator[dict[str, Any]]:
        while True:
            yield await self.events.get()


async def test_a_gate_waits_until_the_watch_of_claims_brings_the_claim_allocated(nc: Client, fleet: Fleet) -> None:
    api = Watched()
    store = await LedgerStore.open(nc, retry_s=0.5)
    view = FleetView(store, stale_after_s=0, slots_per_card=8)
    controller = ClaimsController(api, store, view)
    claim, _ = await allocated_by_ledger(api, store, view, fleet, "mine", "gpu-0", age_s=60)
    unallocated = {**claim, "status": {}}
    watching = asyncio.create_task(controller._watch("1"))
    try:
        await api.events.put({"type": "ADDED", "object": unallocated})
        waiting = asyncio.create_task(controller.cache.seen_allocated(NS, "mine", "uid-mine", 5.0))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # seen, but not allocated yet
        await api.events.put({"type": "MODIFIED", "object": claim})
        assert await asyncio.wait_for(waiting, 2.0) is True
        other = {**claim, "metadata": {**claim["metadata"], "uid": "uid-another"}}  # the same name, another claim
        await api.events.put({"type": "MODIFIED", "object": other})
        await asyncio.sleep(0.1)
        assert await controller.cache.seen_allocated(NS, "mine", "uid-mine", 0.3) is False
    finally:
        watching.cancel()
        for task in controller._busy.values():
            task.cancel()


async def test_a_claim_mode_c_allocated_without_its_finalizer_gets_it_from_the_claims_controller_once_old(
    nc: Client, fleet: Fleet
) -> None:
    """The allocator writes the finalizer after the allocation; where it could not (it stopped in
    between), the claims controller adds it once the allocation is ``WRITING_S`` old, and never to
    a claim kube-scheduler allocated (its own finalizer) or one the allocator is finalizing now."""
    api, store, view, controller = await world(nc)
    bare, _ = await allocated_by_ledger(api, store, view, fleet, "bare", "gpu-0", age_s=60)
    young, _ = await allocated_by_ledger(api, store, view, fleet, "young", "gpu-1", age_s=1)
    theirs, _ = await allocated_by_ledger(api, store, view, fleet, "theirs", "gpu-2", age_s=60)
    mine, _ = await allocated_by_ledger(api, store, view, fleet, "mine", "gpu-3", age_s=60)
    reserved = [{"resource": "pods", "name": "app", "uid": "pod-1"}]
    finalizers = {"bare": [], "young": [], "theirs": ["resource.kubernetes.io/delete-protection"], "mine": []}
    for claim in (bare, young, theirs, mine):
        path = claim_path(claims.ref_of(claim))
        api.items[path]["metadata"]["finalizers"] = finalizers[claim["metadata"]["name"]]
        api.items[path]["status"]["reservedFor"] = reserved
    controller.finalizing.add("uid-mine")
    for claim in (bare, young, theirs, mine):
        await controller.settle(await api.get_object(claim_path(claims.ref_of(claim))))
    after = {n: api.items[claim_path(ClaimRef(NS, n, f"uid-{n}"))]["metadata"]["finalizers"] for n in finalizers}
    assert after == {"bare": [ALLOCATED_BY_LEDGER], "young": [], "mine": [],
                     "theirs": ["resource.kubernetes.io/delete-protection"]}  # fmt: skip
    assert set(controller._rechecks) == {"uid-young"}  # left to its allocator, looked at again later
    controller._rechecks.pop("uid-young").cancel()


async def test_the_allocator_writes_the_finalizer_after_the_allocation_read_again_on_a_conflict(
    nc: Client, fleet: Fleet
) -> None:
    api, store, view, controller = await world(nc)
    claim, _ = await allocated_by_ledger(api, store, view, fleet, "new", "gpu-0", age_s=0)
    path = claim_path(claims.ref_of(claim))
    api.items[path]["metadata"]["finalizers"] = []
    stale = await api.get_object(path)
    api.put(path, await api.get_object(path))  # changed since: the first write conflicts
    controller.finalizing.add("uid-new")
    await finalize(api, controller, claims.ref_of(claim), stale)
    assert api.items[path]["metadata"]["finalizers"] == [ALLOCATED_BY_LEDGER] and controller.finalizing == set()
    gone, _ = await allocated_by_ledger(api, store, view, fleet, "dealloc", "gpu-1", age_s=0)
    gone_path = claim_path(claims.ref_of(gone))
    api.items[gone_path]["metadata"]["finalizers"] = []
    api.items[gone_path]["status"] = {}  # deallocated meanwhile: no finalizer for it
    await finalize(api, controller, claims.ref_of(gone), await api.get_object(gone_path))
    assert api.items[gone_path]["metadata"]["finalizers"] == []
