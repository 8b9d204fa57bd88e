"""Defragmentation moves a movable pod with the claims made for it that the ledger allocated (DRA
mode C): the claim's entry is released as moved (``preemption.preempted``: the claims controller
does not hold it again while its pod ends) and the room held for the pod that needed it. A claim
that is not the pod's own never moves. A claim's later ``firstAvailable`` choices are made room for
when its first cannot be. An API double and a store double over the view's ledger."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from gpuledger_common.store import LedgerStore
from gpuledger_core import claims
from gpuledger_core.claim_asks import ClaimAsk, RequestAsk
from gpuledger_core.claim_placement import claim_as_pods
from gpuledger_core.claims import ClaimRef
from gpuledger_core.errors import PermissionDenied
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Request
from gpuledger_core.preemption import preempted
from gpuledger_placement.claims import DRIVER
from gpuledger_placement.convert import pod_ask_from
from gpuledger_placement.preemption_holders import CLAIMS, PDBS, Listings
from gpuledger_placement.preemptor import Preemptor
from gpuledger_placement.repacker import MOVABLE_LABEL, Defrag, own_claims
from tests.unit.placement_service.fleet import parts
from tests.unit.placement_service.test_preemptor_claims import NODE, NS, Api, Store, claim, claim_path, high

NOW = 1_000_000.0


class Listing(Api):
    """The double, with the movable pods listed by their label; with ``no_claims``, listing claims
    is refused (a classic deployment's placement is not granted it)."""

    no_claims = False
    claim_lists = 0

    async def list_objects(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        if path == CLAIMS:
            self.claim_lists += 1
            if self.no_claims:
                raise PermissionDenied("resourceclaims is forbidden: cannot list resource resourceclaims")
        if path == "/api/v1/pods" and params.get("labelSelector") == f"{MOVABLE_LABEL}=true":
            found = [v for k, v in self.items.items() if "/pods/" in k and (v["metadata"].get("labels") or {})]
            return {"items": found}
        return await super().list_objects(path, params)


def movable_pod(api: Api, name: str, claim_name: str) -> dict[str, Any]:
    body = {"metadata": {"namespace": NS, "name": name, "uid": f"{name}-uid", "labels": {MOVABLE_LABEL: "true"},
                         "ownerReferences": [{"kind": "ReplicaSet", "uid": "rs-uid", "controller": True}]},
            "spec": {"nodeName": str(NODE), "priority": 1, "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "startTime": "2026-12-01T00:00:00Z",
                       "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim_name}]}}  # fmt: skip
    return api.put(f"/api/v1/namespaces/{NS}/pods/{name}", body)


def world(owned: bool) -> tuple[Api, Preemptor]:
    """Two movable pods, each with a mode-C claim of 4 GiB, one on each card of p4-0 (7611 MiB each):
    a 5 GiB pod fits neither card until one claim moves. ``owned``: the claims were made for their
    pods (else they are claims of their own, merely used by them)."""
    built, api = parts(), Listing()
    ledger = built.view.entries[NODE].ledger
    for name, card in (("m1", 0), ("m2", 1)):
        movable_pod(api, name, f"{name}-gpu")
        raw = claim(name, card, 4096, "C")
        raw["metadata"]["name"] = f"{name}-gpu"
        if owned:
            raw["metadata"]["ownerReferences"] = [
                {"kind": "Pod", "name": name, "uid": f"{name}-uid", "controller": True}
            ]
        stored = api.put(claim_path(f"{name}-gpu"), raw)
        entry = claims.ledger_allocation(claims.ref_of(stored), claims.results_of(stored, DRIVER), ledger.node, 0.0)
        ledger = NodeLedger(ledger.node, (*ledger.allocations, entry))
    built.view.apply(NODE, ledger, built.view.entries[NODE].revision + 1)
    defrag = Defrag(clock=lambda: NOW)
    preemptor = Preemptor(api, cast(LedgerStore, Store(built.view)), built.service, clock=lambda: NOW,
                          preempting=False, defrag=defrag)  # fmt: skip
    return api, preemptor


def pending(api: Api) -> dict[str, Any]:
    raw = high(api)
    raw["spec"]["priority"] = 1  # a peer of the movable pods: defragmentation, not preemption
    return api.put(f"/api/v1/namespaces/{NS}/pods/high", raw)


async def test_a_movable_pod_moves_with_its_mode_c_claim_whose_entry_is_released_as_moved() -> None:
    api, preemptor = world(owned=True)
    raw = pending(api)
    moved = await preemptor.preempt(raw, pod_ask_from(raw), [str(NODE)])
    assert moved is not None and len(moved.evict) == 1
    gone = moved.evict[0].owner.id  # claim-m1 or claim-m2: one claim off one card
    assert api.calls == [f"evict {gone.removeprefix('claim-')}"]
    ledger = preemptor.service.view.entries[NODE].ledger
    entry = ledger.get(moved.evict[0].id)
    assert entry is not None and not entry.live and entry.reason.startswith("moved for pod team/high")
    assert preempted(entry)  # the claims controller leaves it released while its pod ends
    hold = ledger.of_owner("pod:high-uid")
    assert hold is not None and [s.index for s in hold.shares()] == [s.index for s in moved.evict[0].shares()]


async def test_a_claim_not_made_for_the_pod_never_moves() -> None:
    api, preemptor = world(owned=False)
    raw = pending(api)
    assert await preemptor.preempt(raw, pod_ask_from(raw), [str(NODE)]) is None
    assert api.calls == []
    pod = api.items[f"/api/v1/namespaces/{NS}/pods/m1"]
    assert own_claims(pod, {(NS, "m1-gpu"): api.items[claim_path("m1-gpu")]}) == []


async def test_claims_not_listable_leave_pods_holding_by_claims_in_place_and_pods_without_claims_list_none() -> None:
    api, preemptor = world(owned=True)
    cast(Listing, api).no_claims = True
    raw = pending(api)
    assert await preemptor.preempt(raw, pod_ask_from(raw), [str(NODE)]) is None  # refused: logged, nothing moved
    assert api.calls == []
    for name in ("m1", "m2"):  # pods that use no claim: claims are not even listed
        del api.items[f"/api/v1/namespaces/{NS}/pods/{name}"]["status"]["resourceClaimStatuses"]
    before = cast(Listing, api).claim_lists
    assert await preemptor._claims_of([api.items[f"/api/v1/namespaces/{NS}/pods/m1"]], Listings(api)) == []
    assert cast(Listing, api).claim_lists == before


async def test_one_attempt_reads_the_claims_and_budgets_once_when_preemption_falls_back_to_defragmentation() -> None:
    """Nobody below the pod's priority: the choice of victims lists the node's claims and budgets,
    then defragmentation moves a claim; both read the same listing."""
    api, preemptor = world(owned=True)
    preemptor.preempting = True
    listed: list[str] = []
    reading = api.list_objects

    async def counted(path: str, params: Mapping[str, str]) -> dict[str, Any]:
        listed.append(path)
        return await reading(path, params)

    api.list_objects = counted  # type: ignore[method-assign]
    raw = pending(api)
    moved = await preemptor.preempt(raw, pod_ask_from(raw), [str(NODE)])
    assert moved is not None and len(moved.evict) == 1  # moved, not preempted: nobody is of lower priority
    assert listed.count(CLAIMS) == 1 and listed.count(PDBS) == 1, listed


async def test_a_claim_whose_first_choice_no_move_serves_is_made_room_for_at_its_next_choice() -> None:
    api, preemptor = world(owned=True)
    raw = pending(api)
    too_big, five = Request(1, mem_mib=8192), Request(1, mem_mib=5120)  # p4-0's cards have 7611 MiB
    ask = ClaimAsk(
        ClaimRef(NS, "wants", "claim-wants"), (RequestAsk("gpu", (("gpu/big", too_big), ("gpu/five", five))),)
    )
    first, *others = claim_as_pods(ask)
    assert await preemptor.preempt(raw, first, [str(NODE)]) is None  # no move makes 8 GiB on one card
    assert api.calls == []
    moved = await preemptor.preempt(raw, first, [str(NODE)], others)
    assert moved is not None and len(moved.evict) == 1
    assert api.calls == [f"evict {moved.evict[0].owner.id.removeprefix('claim-')}"]
    hold = preemptor.service.view.entries[NODE].ledger.of_owner("claim:claim-wants")
    assert hold is not None and [(s.index, s.mem_mib) for s in hold.shares()] == [
        (s.index, 5120) for s in moved.evict[0].shares()
    ]
