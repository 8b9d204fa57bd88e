"""Placement's decisions for pods with MIG asks over an in-memory view: the filter's reasons, the
score by what a plan takes of the MIG workload, place and the workload observed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import pytest

from gpuledger_common.store import LedgerStore
from gpuledger_core.claim_asks import ClaimAsk, RequestAsk
from gpuledger_core.claims import ClaimRef
from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, commit
from gpuledger_core.mig import share_of
from gpuledger_core.mig_profiles import A100_40GB, GiProfile
from gpuledger_core.model import MIG_SMALLEST, CardMode, Grant, MigInstance, MigSlot, Owner, OwnerKind, Request
from gpuledger_core.pods import PodAsk, reserve_grants, reserve_pod
from gpuledger_core.preemption import room_held
from gpuledger_placement.app import Parts
from gpuledger_placement.convert import pod_ask_from
from gpuledger_placement.preemptor import Preemptor
from tests.unit.placement_service.test_preemptor_claims import Api, Store

from .fleet import parts

NODES = ("rtx-0", "p4-0", "h100-0", "a100-0")


def pod(*requests: Request, uid: str = "uid-1") -> PodAsk:
    owner = Owner(OwnerKind.POD, uid, "ns", uid)
    return PodAsk(owner, tuple(ContainerAsk(f"c{n}", r) for n, r in enumerate(requests)))


def slot(name: str, start: int) -> MigSlot:
    profile = A100_40GB.by_name(name)
    assert profile is not None
    return MigSlot(name, start, profile.memory_slices)


def with_mig(built: Parts, node: str = "a100-0", mig: tuple[int, ...] = (0, 1), *made: MigInstance) -> NodeLedger:
    """Cards ``mig`` of ``node`` in MIG mode (the first of them with the instances ``made``), as
    the node's inventory reports them."""
    entry = built.view.entry(node)
    assert entry is not None
    cards = list(entry.ledger.node.cards)
    for at, index in enumerate(mig):
        cards[index] = replace(cards[index], mode=CardMode.MIG, instances=made if at == 0 else ())
    ledger = NodeLedger(replace(entry.ledger.node, cards=tuple(cards)), entry.ledger.allocations)
    built.view.apply(NodeName(node), ledger, entry.revision + 1)
    return ledger


def test_a_mig_pod_fits_only_where_a_card_in_mig_mode_takes_it_and_the_others_say_why() -> None:
    built = parts()
    with_mig(built)
    found = built.service.filter(pod(Request(mig="1g.10gb")), NODES)
    assert found.fits == ("a100-0",)
    assert found.failed["h100-0"] == (
        "container c0: no card in MIG mode for MIG 1g.10gb (cards 0, 1, 2, 3, 4, 5, 6 and 7 in whole mode)"
    )
    assert "has 0 card(s) whose model offers MIG 1g.10gb (NVIDIA GeForce RTX 3090)" in found.unresolvable["rtx-0"]
    assumed = built.service.assumed.of(pod(Request(mig="1g.10gb")).owner)
    assert assumed is not None
    (share,) = assumed.allocation.grants[0].cards
    assert share.index in (0, 1) and share.mig is not None and share.mig.profile == "1g.10gb"
    assert "offers MIG 1g.5gb" in built.service.judge(pod(Request(mig="1g.5gb")), ["h100-0"]).unresolvable["h100-0"]


def test_a_gpu_pod_is_not_placed_on_cards_in_mig_mode() -> None:
    built = parts()
    with_mig(built, mig=(0, 1, 2, 3))
    found = built.service.judge(pod(Request(1)), ["a100-0"])
    assert "in MIG mode, which take MIG instances only" in found.failed["a100-0"]


def test_the_smallest_profile_holding_the_memory_is_placed() -> None:
    built = parts()
    with_mig(built)
    placed = built.service.place(pod(Request(mem_mib=8000, mig=MIG_SMALLEST)))
    (share,) = placed.grants[0].cards
    assert placed.node == "a100-0" and share.mig is not None and share.mig.profile == "1g.10gb"


def test_prioritize_ranks_the_node_whose_layout_keeps_the_most_for_the_workload_first() -> None:
    """A 1g.5gb beside a workload of 3g.20gb: on a100-0 it takes the free instance at 0, where a
    3g no longer fits anyway; on a100-1's empty card any placement blocks one of its two 3g."""
    built = parts()
    with_mig(built, "a100-0", (0,), MigInstance(slot("1g.5gb", 0), static=True))
    entry = built.view.entry("a100-0")
    assert entry is not None
    cards = list(entry.ledger.node.cards)
    cards[0] = replace(cards[0], instances=())
    built.view.apply(
        NodeName("a100-1"), NodeLedger(replace(entry.ledger.node, name=NodeName("a100-1"), cards=tuple(cards))), 1
    )
    for n in range(3):
        built.service.policies.observe(pod(Request(mig="3g.20gb"), uid=f"w{n}"))
    built.service.policies.refresh()
    ask = pod(Request(mig="1g.5gb"), uid="new")
    assert built.service.prioritize(ask, [*NODES, "a100-1"]) == {
        "rtx-0": 0,
        "p4-0": 0,
        "h100-0": 0,
        "a100-0": 10,
        "a100-1": 0,
    }
    placed = built.service.place(ask)
    (share,) = placed.grants[0].cards
    assert (placed.node, share.index, share.mig) == ("a100-0", 0, slot("1g.5gb", 0))
    assert placed.ranked == ("a100-0", "a100-1")


def test_mig_asks_are_the_mig_workload_not_typical_pods() -> None:
    built = parts()
    with_mig(built)
    policies = built.service.policies
    before = len(policies.tracker.seen())
    built.service.filter(pod(Request(2, mig="3g.20gb")), NODES)
    assert len(policies.tracker.seen()) == before
    assert policies.mig_asks.workload().weights == (("3g.20gb", 1.0),)
    generation = policies.generation
    policies.refresh()
    assert policies.mig_chooser().workload.weights == (("3g.20gb", 1.0),)
    assert policies.generation == generation + 1


def test_a_bind_reserves_the_instances_the_chooser_picks_on_the_ledger() -> None:
    built = parts()
    ledger = with_mig(built)
    _, policy = built.service.policies.get("default")
    ask = pod(Request(2, mig="3g.20gb"))
    after = reserve_pod(
        ledger,
        ask,
        policy,
        AllocationId("a-1"),
        now=0,
        lease_s=60,
        slots_per_card=8,
        hint=((0, 1),),
        chooser=built.service.policies.mig_chooser(),
    )
    allocation = after.get(AllocationId("a-1"))
    assert allocation is not None
    (grant,) = allocation.grants
    assert sorted(s.index for s in grant.cards) == [0, 1]
    assert all(s.mig is not None and s.mig.profile == "3g.20gb" for s in grant.cards)
    assert len(grant.device_ids) == 2
    full = "container c0: no free placement of MIG 7g.40gb: cards 0 and 1 full"
    with pytest.raises(Exhausted, match=full):
        reserve_pod(
            after,
            pod(Request(mig="7g.40gb"), uid="u2"),
            policy,
            AllocationId("a-2"),
            now=0,
            lease_s=60,
            slots_per_card=8,
        )


def test_the_mig_workload_is_seeded_from_the_live_allocations() -> None:
    built = parts()
    ledger = with_mig(built)
    _, policy = built.service.policies.get("default")
    for n, profile in enumerate(("3g.20gb", "2g.10gb", "2g.10gb")):
        ask = pod(Request(mig=profile), uid=f"s{n}")
        ledger = reserve_pod(ledger, ask, policy, AllocationId(f"a-s{n}"), now=n, lease_s=60, slots_per_card=8)
    policies = built.service.policies
    assert policies.seed(ledger.allocations) == 3
    assert policies.mig_chooser().workload.weights == (("2g.10gb", 2 / 3), ("3g.20gb", 1 / 3))
    assert not policies.tracker.seen()


def _mig_holder(api: Api, ledger: NodeLedger, name: str, priority: int, card: int, at: MigSlot) -> NodeLedger:
    """A running pod of ``priority`` on a100-0 holding the instance ``at`` (made on demand) of ``card``."""
    body = {"metadata": {"namespace": "team", "name": name, "uid": f"{name}-uid", "labels": {}},
            "spec": {"nodeName": "a100-0", "priority": priority, "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "startTime": "2026-12-01T00:00:00Z"}}  # fmt: skip
    api.put(f"/api/v1/namespaces/team/pods/{name}", body)
    cards = list(ledger.node.cards)
    cards[card] = replace(cards[card], instances=(*cards[card].instances, MigInstance(at, static=False)))
    ledger = NodeLedger(replace(ledger.node, cards=tuple(cards)), ledger.allocations)
    holder = PodAsk(Owner(OwnerKind.POD, f"{name}-uid", "team", name), (ContainerAsk("c", Request(mig=at.profile)),))
    grant = Grant("c", (share_of(cards[card], profile_named(at.profile), at.start),))
    return commit(reserve_grants(ledger, holder, AllocationId(name), (grant,), 0.0, 60.0, 8), AllocationId(name), 1.0)


def profile_named(name: str) -> GiProfile:
    found = A100_40GB.by_name(name)
    assert found is not None
    return found


def _mig_world(limits: dict[str, str]) -> tuple[Parts, Api, dict[str, Any], Preemptor]:
    """Card 0 of a100-0: low-priority 3g.20gb at 4, 2g.10gb at 0 and 1g.5gb at 2; card 1: a 7g.40gb
    of a higher priority than the pod ``high`` (priority 100, ``limits``) that is to preempt."""
    built, api = parts(), Api()
    ledger = with_mig(built)
    for name, priority, card, at in (
        ("a", 1, 0, slot("3g.20gb", 4)),
        ("b", 1, 0, slot("2g.10gb", 0)),
        ("c", 1, 0, slot("1g.5gb", 2)),
        ("d", 200, 1, slot("7g.40gb", 0)),
    ):
        ledger = _mig_holder(api, ledger, name, priority, card, at)
    built.view.apply(NodeName("a100-0"), ledger, 10)
    raw = api.put("/api/v1/namespaces/team/pods/high", {
        "metadata": {"namespace": "team", "name": "high", "uid": "high-uid"},
        "spec": {"priority": 100, "containers": [{"name": "c", "resources": {"limits": limits}}]},
    })  # fmt: skip
    preemptor = Preemptor(api, cast(LedgerStore, Store(built.view)), built.service, clock=lambda: 1_000_000.0)
    return built, api, raw, preemptor


async def test_a_mig_pod_evicts_only_the_holders_of_the_placement_it_needs_and_holds_it() -> None:
    """A 4g.20gb (start 0 only) needs the 2g and the 1g of card 0 to go, not its 3g; their
    instances, made on demand and then held by no one, are no obstacle."""
    built, api, raw, preemptor = _mig_world({"gpuledger.io/mig-4g.20gb": "1"})
    assert built.service.filter(pod(Request(mig="4g.20gb")), NODES).fits == ()
    preemptor.consider(raw, pod_ask_from(raw), ["a100-0"])  # as filter hands it over
    await preemptor.idle()
    assert sorted(api.calls) == ["evict b", "evict c"]
    after = built.view.entries[NodeName("a100-0")].ledger
    hold = after.of_owner("pod:high-uid")
    assert hold is not None and [(s.index, s.mig) for s in hold.shares()] == [(0, slot("4g.20gb", 0))]
    assert {a.owner.name for a in after.live()} == {"a", "d", "high"}


async def test_a_mode_c_claim_asking_mig_preempts_as_a_pod_does_its_room_held_for_the_claim() -> None:
    built, api, raw, preemptor = _mig_world({})
    ref = ClaimRef("team", "high-mig", "claim-uid")
    ask = ClaimAsk(ref, (RequestAsk("mig", (("mig", Request(mig="4g.20gb")),)),))
    preemptor.consider_claim(raw, ask, ["a100-0"])  # as the claim allocator hands it over
    await preemptor.idle()
    assert sorted(api.calls) == ["evict b", "evict c"]
    hold = built.view.entries[NodeName("a100-0")].ledger.of_owner(ref.owner.key)
    assert hold is not None and room_held(hold)
    assert [(s.index, s.mig) for s in hold.shares()] == [(0, slot("4g.20gb", 0))]
