"""Draining a failing card: placement evicts the pods holding a card whose remedy is drain (pods
directly, claims through their reservedFor), leaves tools and the node's other cards alone, tries a
refused eviction again with a back-off and never evicts a pod twice. A fake API records the calls."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import REGISTRY

from gpuledger_core.errors import Conflict, NotFound, Unavailable
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import (
    Allocation,
    AllocState,
    Card,
    CardMode,
    CardShare,
    Grant,
    Health,
    MigInstance,
    MigSlot,
    Node,
    Owner,
    OwnerKind,
    Remedy,
)
from gpuledger_placement.drainer import BLOCKED, DRAINED, DRAINING, RETIRED, Drainer, draining
from gpuledger_placement.view import FleetView

NODE = NodeName("n1")
XID = "XID 79: GPU has fallen off the bus"


class FakeApi:
    """Pods and claims by path; evictions and events recorded. An eviction marks the pod as being
    deleted, as the API server does; ``refuse[name]`` evictions of a pod are refused first (429)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.evicted: list[tuple[str, dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []
        self.reads: list[str] = []
        self.refuse: dict[str, int] = {}

    def pod(self, name: str, node: str = NODE, controller: bool = True, **meta: Any) -> None:
        owners = [{"kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": True}] if controller else []
        body = {"metadata": {"namespace": "team", "name": name, "uid": f"uid-{name}", "ownerReferences": owners,
                             **meta}, "spec": {"nodeName": node}}  # fmt: skip
        self.objects[f"/api/v1/namespaces/team/pods/{name}"] = body

    def claim(self, name: str, users: list[str]) -> None:
        reserved = [{"resource": "pods", "name": u, "uid": f"uid-{u}"} for u in users]
        body = {"metadata": {"namespace": "team", "name": name, "uid": f"uid-{name}"},
                "status": {"reservedFor": reserved}}  # fmt: skip
        self.objects[f"/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/{name}"] = body

    async def get_object(self, path: str) -> dict[str, Any]:
        self.reads.append(path)
        if path not in self.objects:
            raise NotFound(path)
        return copy.deepcopy(self.objects[path])

    async def create_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if path.endswith("/events"):
            self.events.append(dict(body))
            return dict(body)
        assert path.endswith("/eviction"), path
        pod_path, name = path.removesuffix("/eviction"), body["metadata"]["name"]
        self.evicted.append((name, dict(body)))
        if self.refuse.get(name, 0) > 0:
            self.refuse[name] -= 1
            raise Unavailable("429: Cannot evict pod as it would violate the pod's disruption budget")
        pod = self.objects.get(pod_path)
        if pod is None:
            raise NotFound(pod_path)
        if pod["metadata"]["uid"] != body["deleteOptions"]["preconditions"]["uid"]:
            raise Conflict("the uid precondition failed")
        pod["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
        return {}

    def evictions(self) -> list[str]:
        return [name for name, _ in self.evicted]

    def reasons(self) -> list[tuple[str, str, str]]:
        return [(e["involvedObject"]["kind"], e["involvedObject"]["name"], e["reason"]) for e in self.events]


def card(index: int, remedy: Remedy = Remedy.NONE) -> Card:
    health = Health.UNHEALTHY if remedy is not Remedy.NONE else Health.HEALTHY
    reason = XID if remedy is not Remedy.NONE else ""
    return Card(CardUuid(f"GPU-{index}"), index, "A100", 40960, health=health, health_reason=reason, remedy=remedy)


def held(owner: Owner, *indexes: int) -> Allocation:
    shares = tuple(CardShare(CardUuid(f"GPU-{i}"), i, 1024, 100) for i in indexes)
    return Allocation(AllocationId(f"a-{owner.id}"), owner, NODE, (Grant("c", shares),), AllocState.BOUND)


def pod(name: str) -> Owner:
    return Owner(OwnerKind.POD, f"uid-{name}", "team", name)


def claim(name: str) -> Owner:
    return Owner(OwnerKind.CLAIM, f"uid-{name}", "team", name)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fleet(drained: int | None, *allocations: Allocation, revision: int = 1, view: FleetView | None = None) -> FleetView:
    """Node n1 with four cards, card ``drained`` marked remedy drain, holding ``allocations``."""
    view = view or FleetView(None, 0.0, slots_per_card=4)
    cards = tuple(card(i, Remedy.DRAIN if i == drained else Remedy.NONE) for i in range(4))
    view.apply(NODE, NodeLedger(Node(NODE, cards), allocations), revision)
    return view


def drainer(api: FakeApi, view: FleetView, clock: Clock | None = None) -> Drainer:
    return Drainer(api, view, clock=clock or Clock(), first_backoff_s=5.0, max_backoff_s=20.0, pass_s=30.0)


def counted(result: str) -> float:
    return REGISTRY.get_sample_value("gpuledger_placement_drain_evictions_total", {"result": result}) or 0.0


async def test_only_the_pods_on_the_drained_card_are_evicted_each_with_an_event_and_one_on_the_node() -> None:
    api = FakeApi()
    for name in ("on-2", "also-on-2", "on-1", "on-3"):
        api.pod(name)
    view = fleet(2, held(pod("on-2"), 2), held(pod("also-on-2"), 2), held(pod("on-1"), 1), held(pod("on-3"), 3))
    before = counted("evicted")
    await drainer(api, view).sweep()
    assert sorted(api.evictions()) == ["also-on-2", "on-2"]
    assert api.evicted[0][1]["deleteOptions"] == {"preconditions": {"uid": "uid-on-2"}}
    assert sorted(api.reasons()) == [("Node", "n1", DRAINING), ("Pod", "also-on-2", DRAINED), ("Pod", "on-2", DRAINED)]
    message = next(e["message"] for e in api.events if e["involvedObject"]["name"] == "on-2")
    assert "card 2 (GPU-2) of node n1" in message and XID in message
    node_message = next(e["message"] for e in api.events if e["reason"] == DRAINING)
    assert "moving 2 pod(s) off" in node_message and XID in node_message
    assert counted("evicted") - before == 2
    assert not any("on-1" in path or "on-3" in path for path in api.reads)  # the other cards' pods: not even read


async def test_a_claim_is_drained_through_the_pods_it_is_reserved_for() -> None:
    api = FakeApi()
    api.pod("user-a")
    api.pod("user-b")
    api.claim("gpu-claim", ["user-a", "user-b"])
    await drainer(api, fleet(0, held(claim("gpu-claim"), 0))).sweep()
    assert sorted(api.evictions()) == ["user-a", "user-b"]
    message = next(e["message"] for e in api.events if e["involvedObject"]["name"] == "user-a")
    assert "through claim team/gpu-claim" in message


async def test_a_claim_of_the_same_name_but_another_uid_is_not_followed() -> None:
    api = FakeApi()
    api.pod("user-a")
    api.claim("gpu-claim", ["user-a"])
    api.objects["/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/gpu-claim"]["metadata"]["uid"] = "new"
    await drainer(api, fleet(0, held(claim("gpu-claim"), 0))).sweep()
    assert api.evictions() == []


async def test_a_tool_is_left_to_the_allocator_and_counted_on_the_node() -> None:
    api = FakeApi()
    tool = Owner(OwnerKind.TOOL, "batch-7")
    await drainer(api, fleet(1, held(tool, 1))).sweep()
    assert api.evictions() == [] and api.reads == []
    assert api.reasons() == [("Node", "n1", DRAINING)]
    assert "1 tool holder(s)" in api.events[0]["message"] and "moving 0 pod(s)" in api.events[0]["message"]


async def test_a_refused_eviction_is_tried_again_with_a_doubling_back_off_and_never_forced() -> None:
    api, clock = FakeApi(), Clock()
    api.pod("guarded")
    api.refuse["guarded"] = 3
    worker = drainer(api, fleet(2, held(pod("guarded"), 2)), clock)
    refused = counted("refused")
    tries = []
    for second in range(40):  # a sweep every second: the back-off, not the sweeps, sets the pace
        clock.now = 1000.0 + second
        before = len(api.evicted)
        await worker.sweep()
        if len(api.evicted) > before:
            tries.append(second)
    assert tries == [0, 5, 15, 35]  # refused at 0, 5 and 15 (back-off 5, 10, 20 = the cap)
    assert counted("refused") - refused == 3
    blocked = [r for r in api.reasons() if r[2] == BLOCKED]
    assert blocked == [("Pod", "guarded", BLOCKED)]  # said once
    assert api.reasons().count(("Pod", "guarded", DRAINED)) == 1


async def test_a_pod_evicted_or_terminating_is_not_evicted_again() -> None:
    api = FakeApi()
    api.pod("evicted-here")
    api.pod("terminating", deletionTimestamp="2026-12-01T00:00:00Z")
    view = fleet(2, held(pod("evicted-here"), 2), held(pod("terminating"), 2))
    worker = drainer(api, view)
    await worker.sweep()
    assert api.evictions() == ["evicted-here"]
    fleet(2, held(pod("evicted-here"), 2), held(pod("terminating"), 2), revision=2, view=view)  # still held
    worker.changed(NODE)
    await worker.sweep()
    assert api.evictions() == ["evicted-here"]


async def test_a_pod_gone_before_its_eviction_is_counted_gone() -> None:
    api = FakeApi()
    gone = counted("gone")
    await drainer(api, fleet(2, held(pod("vanished"), 2))).sweep()
    assert api.evictions() == [] and counted("gone") - gone == 1


async def test_a_pod_holding_several_cards_is_evicted_whole_and_a_bare_pod_too_each_event_says_so() -> None:
    api = FakeApi()
    api.pod("wide")
    api.pod("bare", controller=False)
    await drainer(api, fleet(2, held(pod("wide"), 1, 2, 3), held(pod("bare"), 2))).sweep()
    assert sorted(api.evictions()) == ["bare", "wide"]
    messages = {e["involvedObject"]["name"]: e["message"] for e in api.events}
    assert "card(s) 1,3 on the node go with it" in messages["wide"] and "no controller" not in messages["wide"]
    assert "no controller recreates this pod" in messages["bare"]


async def test_a_pod_not_bound_to_the_node_is_left_for_now() -> None:
    api = FakeApi()
    api.pod("pending", node="")
    await drainer(api, fleet(2, held(pod("pending"), 2))).sweep()
    assert api.evictions() == []


async def test_an_unhealthy_card_without_remedy_drain_keeps_its_holders() -> None:
    cards = (card(0), Card(CardUuid("GPU-1"), 1, "A100", 40960, health=Health.UNHEALTHY, health_reason=XID))
    ledger = NodeLedger(Node(NODE, cards), (held(pod("stays"), 1),))
    assert draining(ledger) == []
    reset = NodeLedger(Node(NODE, (card(0), card(1, Remedy.RESET))), (held(pod("stays"), 1),))
    assert draining(reset) == []


async def test_the_node_is_told_once_per_episode() -> None:
    api = FakeApi()
    api.pod("first")
    api.pod("second")
    view = fleet(2, held(pod("first"), 2))
    worker = drainer(api, view)
    await worker.sweep()
    fleet(2, held(pod("first"), 2), revision=2, view=view)
    worker.changed(NODE)
    await worker.sweep()
    assert api.reasons().count(("Node", "n1", DRAINING)) == 1
    fleet(None, revision=3, view=view)  # reset and back
    worker.changed(NODE)
    await worker.sweep()
    assert worker.cards == {}
    fleet(2, held(pod("second"), 2), revision=4, view=view)  # fails again: a new episode
    worker.changed(NODE)
    await worker.sweep()
    assert api.reasons().count(("Node", "n1", DRAINING)) == 2
    assert api.evictions() == ["first", "second"]


async def test_a_retired_card_is_told_on_the_node_once_per_retirement() -> None:
    api = FakeApi()
    view = FleetView(None, 0.0, slots_per_card=4)
    retired = NodeLedger(Node(NODE, (card(0), card(1, Remedy.RETIRED))), ())
    view.apply(NODE, retired, 1)
    worker = drainer(api, view)
    await worker.sweep()
    view.apply(NODE, retired, 2)
    worker.changed(NODE)
    await worker.sweep()
    assert api.reasons() == [("Node", "n1", RETIRED)]
    assert "card 1 (GPU-1) is retired until an operator acts (XID 79" in api.events[0]["message"]
    assert api.evictions() == []
    view.apply(NODE, NodeLedger(Node(NODE, (card(0), card(1))), ()), 3)  # an operator returned it
    worker.changed(NODE)
    await worker.sweep()
    view.apply(NODE, retired, 4)  # retired again: told again
    worker.changed(NODE)
    await worker.sweep()
    assert api.reasons() == [("Node", "n1", RETIRED)] * 2


@pytest.mark.timeout(5)
async def test_running_it_drains_a_card_as_soon_as_the_view_shows_it() -> None:
    api = FakeApi()
    api.pod("holder")
    view = fleet(None, held(pod("holder"), 2))
    view.ready.set()
    worker = Drainer(api, view, pass_s=60.0)
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.sleep(0.05)
        assert api.evictions() == []
        fleet(2, held(pod("holder"), 2), revision=2, view=view)
        while not api.evictions():
            await asyncio.sleep(0.01)
        assert api.evictions() == ["holder"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_faulted_mig_instance_moves_only_its_own_holder_off() -> None:
    bad, good = MigSlot("1g.5gb", 6, 1), MigSlot("1g.5gb", 5, 1)
    faulted = MigInstance(bad, False, "MIG-bad", "XID 13 on MIG-bad: graphics engine exception", Remedy.DRAIN)
    merely = MigInstance(MigSlot("1g.5gb", 4, 1), False, "MIG-slow", "XID 94 on MIG-slow", Remedy.NONE)
    mig = replace(card(0), mode=CardMode.MIG, instances=(faulted, MigInstance(good, False, "MIG-good"), merely))

    def on(owner: Owner, slot: MigSlot) -> Allocation:
        share = CardShare(CardUuid("GPU-0"), 0, 5120, 142, False, slot)
        return Allocation(AllocationId(f"a-{owner.id}"), owner, NODE, (Grant("c", (share,)),), AllocState.BOUND)

    api = FakeApi()
    for name in ("on-bad", "on-good", "on-slow"):
        api.pod(name)
    view = FleetView(None, 0.0, slots_per_card=4)
    allocations = (on(pod("on-bad"), bad), on(pod("on-good"), good), on(pod("on-slow"), merely.slot))
    view.apply(NODE, NodeLedger(Node(NODE, (mig, card(1))), allocations), 1)
    await drainer(api, view).sweep()
    assert api.evictions() == ["on-bad"]
    message = next(e["message"] for e in api.events if e["involvedObject"]["name"] == "on-bad")
    assert "MIG instance 1g.5gb@6 (MIG-bad) on card 0 (GPU-0) of node n1 (XID 13 on MIG-bad" in message
    assert [c.instance for c in draining(NodeLedger(Node(NODE, (mig,)), allocations))] == [faulted]
