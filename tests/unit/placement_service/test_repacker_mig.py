"""Defragmentation for a pod asking MIG: a movable pod's instance moved to a free placement of its
profile on another node's MIG card, and the card it left held for the pod. An API double and a
store double over the view's ledgers."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

from gpuledger_common.store import LedgerStore
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, commit
from gpuledger_core.mig import share_of
from gpuledger_core.model import Grant, MigInstance, MigSlot, Owner, OwnerKind, Request
from gpuledger_core.pods import PodAsk, reserve_grants
from gpuledger_dev.fleet import parse_fleet
from gpuledger_placement.app import Parts, build
from gpuledger_placement.convert import pod_ask_from
from gpuledger_placement.kube import NoPodApi
from gpuledger_placement.preemptor import Preemptor
from gpuledger_placement.repacker import MOVABLE_LABEL, Defrag
from gpuledger_placement.settings import PlacementSettings
from tests.unit.placement_service.test_preemptor_claims import Store
from tests.unit.placement_service.test_repacker_claims import Listing
from tests.unit.placement_service.test_service_mig import profile_named, slot, with_mig

NOW = 1_000_000.0
FLEET = """
nodes:
  - name: a100-0
    profile: a100-pcie-4
  - name: a100-1
    profile: a100-pcie-4
"""


def _held(api: Listing, built: Parts, node: str, name: str, at: MigSlot, movable: bool) -> None:
    """A running pod on card 0 of ``node`` holding the instance ``at`` (made on demand); ``movable``:
    labelled so, with a controller; else of a priority above the pending pod's."""
    labels = {MOVABLE_LABEL: "true"} if movable else {}
    owners = [{"kind": "ReplicaSet", "uid": "rs-uid", "controller": True}] if movable else []
    body = {"metadata": {"namespace": "team", "name": name, "uid": f"{name}-uid", "labels": labels,
                         "ownerReferences": owners},
            "spec": {"nodeName": node, "priority": 1 if movable else 200, "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "startTime": "2026-12-01T00:00:00Z"}}  # fmt: skip
    api.put(f"/api/v1/namespaces/team/pods/{name}", body)
    entry = built.view.entry(node)
    assert entry is not None
    ledger, cards = entry.ledger, list(entry.ledger.node.cards)
    cards[0] = replace(cards[0], instances=(*cards[0].instances, MigInstance(at, static=False)))
    ledger = NodeLedger(replace(ledger.node, cards=tuple(cards)), ledger.allocations)
    holder = PodAsk(Owner(OwnerKind.POD, f"{name}-uid", "team", name), (ContainerAsk("c", Request(mig=at.profile)),))
    grant = Grant("c", (share_of(cards[0], profile_named(at.profile), at.start),))
    reserved = reserve_grants(ledger, holder, AllocationId(name), (grant,), 0.0, 60.0, 8)
    built.view.apply(NodeName(node), commit(reserved, AllocationId(name), 1.0), entry.revision + 1)


def world(fixed: MigSlot) -> tuple[Parts, Listing, Preemptor]:
    """Card 0 of each node in MIG mode: a100-0's holds a movable pod's 1g.5gb at 0, a100-1's another
    pod's ``fixed``; the other cards whole."""
    built = build(PlacementSettings(kube="off", stale_after_s=0.0), None, NoPodApi(), None, None)
    for revision, listed in enumerate(parse_fleet(FLEET).nodes, start=1):
        built.view.apply(NodeName(listed.node.name), NodeLedger(listed.node), revision)
    api = Listing()
    for name in ("a100-0", "a100-1"):
        with_mig(built, name, (0,))
    _held(api, built, "a100-0", "small", slot("1g.5gb", 0), movable=True)
    _held(api, built, "a100-1", "fixed", fixed, movable=False)
    preemptor = Preemptor(api, cast(LedgerStore, Store(built.view)), built.service, clock=lambda: NOW,
                          preempting=False, defrag=Defrag(clock=lambda: NOW))  # fmt: skip
    return built, api, preemptor


def pending(api: Listing) -> dict[str, Any]:
    limits = {"gpuledger.io/mig-7g.40gb": "1"}
    body = {"metadata": {"namespace": "team", "name": "big", "uid": "big-uid"},
            "spec": {"priority": 1, "containers": [{"name": "c", "resources": {"limits": limits}}]}}  # fmt: skip
    return api.put("/api/v1/namespaces/team/pods/big", body)


async def test_a_mig_pod_gets_the_card_a_movable_pod_s_instance_leaves_for_another_node() -> None:
    built, api, preemptor = world(slot("3g.20gb", 4))  # room for a 1g.5gb, not for a 7g.40gb
    raw = pending(api)
    assert built.service.filter(pod_ask_from(raw), ["a100-0", "a100-1"]).fits == ()
    moved = await preemptor.preempt(raw, pod_ask_from(raw), ["a100-0", "a100-1"])
    assert moved is not None and [a.owner.name for a in moved.evict] == ["small"]
    assert api.calls == ["evict small"]
    hold = built.view.entries[NodeName("a100-0")].ledger.of_owner("pod:big-uid")
    assert hold is not None and [(s.index, s.mig) for s in hold.shares()] == [(0, slot("7g.40gb", 0))]


async def test_a_mig_pod_moves_nobody_where_the_instance_would_fit_nowhere_else() -> None:
    _, api, preemptor = world(slot("7g.40gb", 0))  # a100-1's MIG card full, its others whole
    raw = pending(api)
    assert await preemptor.preempt(raw, pod_ask_from(raw), ["a100-0", "a100-1"]) is None
    assert api.calls == []
