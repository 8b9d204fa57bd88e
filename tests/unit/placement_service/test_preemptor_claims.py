"""Claims as preemption victims in placement's preemptor: the claims mode C allocated and the ones
kube-scheduler allocated and the ledger committed (mode B) are victims through their pods; a claim
the ledger only mirrors (no binding condition, mode A) never is. A mode-B victim's allocation is
vetoed (``gpuledger.io/rejected``, reason Preempted) before its pod is evicted, and written back as
it was where an eviction is refused. An API double and a store double over the view's ledger."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, cast

from gpuledger_common.store import LedgerStore
from gpuledger_common.store.writes import Transition, Written
from gpuledger_core import claims
from gpuledger_core.claim_asks import ClaimAsk, RequestAsk
from gpuledger_core.claim_placement import claim_as_pods
from gpuledger_core.claims import ClaimRef
from gpuledger_core.errors import Conflict, NotFound, Unavailable
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import OwnerKind, Request
from gpuledger_core.preemption import preempted
from gpuledger_placement import claim_veto, preemption_holders
from gpuledger_placement.claim_fields import COMMITTED, REJECTED, decided
from gpuledger_placement.claims import ALLOCATED_BY_LEDGER, DRIVER
from gpuledger_placement.convert import pod_ask_from
from gpuledger_placement.preemptor import Preemptor
from gpuledger_placement.view import FleetView
from tests.unit.placement_service.fleet import parts

NS = "team"
NODE = NodeName("p4-0")  # two Tesla P4 of 7611 MiB
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"  # kube-scheduler's finalizer on the claims it allocates


def claim_path(name: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{name}"


class Api:
    """Pods, claims and budgets by path; a write with a stale resourceVersion is a Conflict; the
    evictions, in order, with what each victim's claim said at that moment."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.calls: list[str] = []
        self.refuse: set[str] = set()  # pods whose eviction a budget refuses
        self.raced: list[str] = []  # paths another writer changes just before our next patch lands

    def put(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.items[path] = stored
        return copy.deepcopy(stored)

    async def get_object(self, path: str) -> dict[str, Any]:
        if path not in self.items:
            raise NotFound(path)
        return copy.deepcopy(self.items[path])

    async def list_objects(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        if path == "/api/v1/pods":
            node = params.get("fieldSelector", "").removeprefix("spec.nodeName=")
            found = [v for k, v in self.items.items() if "/pods/" in k and v["spec"].get("nodeName") == node]
        elif path == CLAIMS:
            found = [v for k, v in self.items.items() if "/resourceclaims/" in k]
        else:
            found = []
        return {"items": copy.deepcopy(found)}

    async def create_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if path.endswith("/eviction"):
            name = path.removesuffix("/eviction").rsplit("/", 1)[1]
            if name in self.refuse:
                raise Unavailable("Cannot evict pod as it would violate the pod's disruption budget")
            self.calls.append(f"evict {name}")
            del self.items[path.removesuffix("/eviction")]
        return dict(body)

    async def patch_object(self, path: str, body: Any, content_type: str) -> dict[str, Any]:
        if path in self.raced:  # kube-scheduler's status write, say, lands first
            self.raced.remove(path)
            self.put(path, self.items[path])
        stored = self.items[path]
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != stored["metadata"]["resourceVersion"]:
            raise Conflict(path)
        merged = copy.deepcopy(stored)
        for key, value in ((body.get("metadata") or {}).get("annotations") or {}).items():
            merged["metadata"].setdefault("annotations", {})[key] = value
        return self.put(path, merged)

    async def replace_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        main = path.removesuffix("/status")
        if main not in self.items:
            raise NotFound(main)
        if body["metadata"].get("resourceVersion") != self.items[main]["metadata"]["resourceVersion"]:
            raise Conflict(main)
        self.calls.append(f"status {main.rsplit('/', 1)[1]}")
        merged = copy.deepcopy(self.items[main])
        merged["status"] = copy.deepcopy(body.get("status") or {})
        return self.put(main, merged)


class Store:
    """The ledger store as the preemptor uses it: a compare-and-set over the view's ledger."""

    def __init__(self, view: FleetView) -> None:
        self.view = view

    async def mutate(self, node: str, transition: Transition, attempts: int | None = None) -> Written:
        entry = self.view.entries[NodeName(node)]
        new = transition(entry.ledger)
        return Written(entry.ledger, new, entry.revision + 1)

    async def claim_owner(self, *_: Any, **__: Any) -> int:
        return 1


def running_pod(api: Api, name: str, priority: int) -> dict[str, Any]:
    body = {"metadata": {"namespace": NS, "name": name, "uid": f"{name}-uid", "labels": {}},
            "spec": {"nodeName": str(NODE), "priority": priority, "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "startTime": "2026-12-01T00:00:00Z"}}  # fmt: skip
    return api.put(f"/api/v1/namespaces/{NS}/pods/{name}", body)


def claim(name: str, card: int, mib: int, mode: str) -> dict[str, Any]:
    """A claim of one share of ``card`` reserved for pod ``name``: allocated by mode C (gpuledger's
    finalizer), or by kube-scheduler with the binding condition committed (B) or without one (A)."""
    consumed = {"memory": f"{mib}Mi", "compute": "10"}
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": str(NODE), "device": f"gpu-{card}",
                              "shareID": f"share-{name}", "consumedCapacity": consumed}  # fmt: skip
    status: dict[str, Any] = {
        "allocation": {"devices": {"results": [result]}, "allocationTimestamp": "2026-12-01T00:00:00Z"},
        "reservedFor": [{"resource": "pods", "name": name, "uid": f"{name}-uid"}],
    }
    if mode == "B":
        result |= {"bindingConditions": [COMMITTED], "bindingFailureConditions": [REJECTED]}
        committed = {"type": COMMITTED, "status": "True", "reason": "Reserved", "message": "ledger allocation"}
        status["devices"] = [{"driver": DRIVER, "pool": str(NODE), "device": f"gpu-{card}",
                              "shareID": f"share-{name}", "conditions": [committed]},
                             {"driver": "other.example.com", "pool": "x", "device": "nic-0"}]  # fmt: skip
    finalizer = ALLOCATED_BY_LEDGER if mode == "C" else DELETE_PROTECTION
    meta = {"namespace": NS, "name": name, "uid": f"claim-{name}", "finalizers": [finalizer]}
    return {"metadata": meta, "spec": {}, "status": status}


def world(holders: list[tuple[str, int, int, str]]) -> tuple[Api, Preemptor]:
    """Each holder (name, card, MiB, mode) a running low-priority pod and its claim, in the ledger."""
    built = parts()
    api = Api()
    view = built.view
    ledger = view.entries[NODE].ledger
    for name, card, mib, mode in holders:
        running_pod(api, name, priority=1)
        stored = api.put(claim_path(name), claim(name, card, mib, mode))
        entry = claims.ledger_allocation(claims.ref_of(stored), claims.results_of(stored, DRIVER), ledger.node, 0.0)
        ledger = NodeLedger(ledger.node, (*ledger.allocations, entry))
    view.apply(NODE, ledger, view.entries[NODE].revision + 1)
    preemptor = Preemptor(api, cast(LedgerStore, Store(view)), built.service, clock=lambda: 1_000_000.0)
    return api, preemptor


def high(api: Api, mib: int = 5120) -> dict[str, Any]:
    limits = {"gpuledger.io/gpu": "1", "gpuledger.io/gpu-mem": str(mib)}
    body = {"metadata": {"namespace": NS, "name": "high", "uid": "high-uid"},
            "spec": {"priority": 100, "containers": [{"name": "c", "resources": {"limits": limits}}]}}  # fmt: skip
    return api.put(f"/api/v1/namespaces/{NS}/pods/high", body)


# card 0: a mode-B 4 GiB and a mode-A 2 GiB; card 1: three mode-C 2 GiB. A 5 GiB pod fits on card 0
# once the mode-B claim goes (one victim), on card 1 once two mode-C claims go.
FULL = [("b", 0, 4096, "B"), ("a", 0, 2048, "A"), ("c1", 1, 2048, "C"), ("c2", 1, 2048, "C"), ("c3", 1, 2048, "C")]


async def test_claims_mode_c_and_mode_b_allocated_are_victims_and_a_mirrored_one_is_not() -> None:
    _, preemptor = world(FULL)
    found = await preemption_holders.holders(preemptor, [NODE])
    claimed = {k.split(":", 1)[1] for k in found if k.startswith(f"{OwnerKind.CLAIM}:")}
    assert claimed == {"claim-b", "claim-c1", "claim-c2", "claim-c3"}
    assert found[f"{OwnerKind.CLAIM}:claim-b"].priority == 1

    not_committed = claim("b", 0, 4096, "B")
    del not_committed["status"]["devices"]  # kube-scheduler waits at PreBind: the ledger has not decided
    assert not claim_veto.mode_b(not_committed, DRIVER)
    assert claim_veto.mode_b(claim("b", 0, 4096, "B"), DRIVER)
    assert not claim_veto.mode_b(claim("a", 0, 2048, "A"), DRIVER)
    assert not claim_veto.mode_b(claim("c1", 1, 2048, "C"), DRIVER)


async def test_a_mode_b_claim_s_pod_is_the_fewest_victims_its_claim_vetoed_first_and_its_cards_held() -> None:
    api, preemptor = world(FULL)
    raw = high(api)
    victims = await preemptor.preempt(raw, pod_ask_from(raw), [str(NODE)])
    assert victims is not None
    assert [a.owner.id for a in victims.evict] == ["claim-b"]
    assert api.calls == ["status b", "evict b"]  # vetoed before its pod goes
    vetoed = api.items[claim_path("b")]
    assert decided(vetoed, DRIVER, claims.results_of(vetoed, DRIVER)) == REJECTED
    assert claim_veto.is_vetoed(vetoed, DRIVER)
    assert "preempted by pod team/high" in vetoed["status"]["devices"][-1]["conditions"][0]["message"]
    assert {"driver": "other.example.com", "pool": "x", "device": "nic-0"} in vetoed["status"]["devices"]
    ledger = preemptor.service.view.entries[NODE].ledger
    assert preempted(ledger.of_owner("claim:claim-b") or ledger.get(victims.evict[0].id))
    hold = ledger.of_owner("pod:high-uid")
    assert hold is not None and [s.index for s in hold.shares()] == [0]
    live = {a.owner.id for a in ledger.live()}
    assert live == {"high-uid", "claim-a", "claim-c1", "claim-c2", "claim-c3"}  # nothing else taken


async def test_an_eviction_refused_writes_the_vetoed_claim_back_as_it_was_and_holds_nothing() -> None:
    api, preemptor = world(FULL)
    api.refuse.add("b")
    before = copy.deepcopy(api.items[claim_path("b")]["status"])
    raw = high(api)
    assert await preemptor.preempt(raw, pod_ask_from(raw), [str(NODE)]) is None
    assert api.calls == ["status b", "status b"]  # vetoed, then written back
    assert api.items[claim_path("b")]["status"] == before
    ledger = preemptor.service.view.entries[NODE].ledger
    assert ledger.of_owner("pod:high-uid") is None and ledger.of_owner("claim:claim-b") is not None


async def test_a_mode_b_claim_changed_since_it_was_listed_is_not_vetoed_and_nobody_is_evicted() -> None:
    api, _ = world(FULL)
    stale = copy.deepcopy(api.items[claim_path("b")])
    api.put(claim_path("b"), api.items[claim_path("b")])  # a new resourceVersion
    assert not await claim_veto.veto(api, [stale], DRIVER, "preempted", 0.0)
    assert api.calls == [] and not claim_veto.is_vetoed(api.items[claim_path("b")], DRIVER)


async def test_a_failed_veto_writes_back_the_claims_vetoed_before_it() -> None:
    api, _ = world([("b", 0, 4096, "B"), ("b2", 1, 4096, "B")])
    first, second = copy.deepcopy(api.items[claim_path("b")]), copy.deepcopy(api.items[claim_path("b2")])
    api.put(claim_path("b2"), api.items[claim_path("b2")])  # changed since it was listed
    assert not await claim_veto.veto(api, [first, second], DRIVER, "preempted", 0.0)
    assert api.items[claim_path("b")]["status"] == first["status"]


async def test_a_claim_allocated_anew_or_gone_is_not_written_back() -> None:
    api, _ = world([("b", 0, 4096, "B")])
    listed = copy.deepcopy(api.items[claim_path("b")])
    assert await claim_veto.veto(api, [listed], DRIVER, "preempted", 0.0)
    anew = copy.deepcopy(api.items[claim_path("b")])
    anew["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-1"  # deallocated and allocated again
    api.put(claim_path("b"), anew)
    await claim_veto.restore(api, [listed], DRIVER)
    assert api.items[claim_path("b")]["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1"
    assert claim_veto.is_vetoed(api.items[claim_path("b")], DRIVER)
    del api.items[claim_path("b")]
    await claim_veto.restore(api, [listed], DRIVER)  # gone: nothing to do
    assert claims.ref_of(listed) == ClaimRef(NS, "b", "claim-b")


async def test_a_first_available_claim_preempts_for_the_first_choice_victims_can_make_room_for() -> None:
    api, preemptor = world([("low", 0, 4096, "C"), ("top", 1, 4096, "C")])
    api.items[f"/api/v1/namespaces/{NS}/pods/top"]["spec"]["priority"] = 1000  # outranks the pod: stays
    raw = high(api)
    two_cards, one_share = Request(2), Request(1, mem_mib=5120)
    choices = (("gpu/two", two_cards), ("gpu/one", one_share))
    ask = ClaimAsk(ClaimRef(NS, "wants", "claim-wants"), (RequestAsk("gpu", choices),))
    first, *others = claim_as_pods(ask)
    assert [[c.request for c in p.containers] for p in (first, *others)] == [[two_cards], [one_share]]

    assert await preemptor.preempt(raw, first, [str(NODE)]) is None  # two cards: card 1's holder outranks it
    assert api.calls == []
    victims = await preemptor.preempt(raw, first, [str(NODE)], others)
    assert victims is not None and [a.owner.id for a in victims.evict] == ["claim-low"]
    assert api.calls == ["evict low"]
    hold = preemptor.service.view.entries[NODE].ledger.of_owner("claim:claim-wants")
    assert hold is not None and [s.index for s in hold.shares()] == [0]


async def test_mode_c_preempts_for_a_later_first_available_choice_of_a_claim_that_fits_nowhere() -> None:
    api, preemptor = world([("low", 0, 4096, "C"), ("top", 1, 4096, "C")])
    api.items[f"/api/v1/namespaces/{NS}/pods/top"]["spec"]["priority"] = 1000
    choices = (("gpu/two", Request(2)), ("gpu/one", Request(1, mem_mib=5120)))
    preemptor.consider_claim(high(api), ClaimAsk(ClaimRef(NS, "wants", "claim-wants"), (RequestAsk("gpu", choices),)),
                             [str(NODE)])  # fmt: skip
    await preemptor.idle()
    assert api.calls == ["evict low"]


async def test_a_pod_changed_between_its_read_and_the_announcement_is_read_again_and_preempted_for() -> None:
    api, preemptor = world(FULL)
    raw = high(api)
    api.raced.append(f"/api/v1/namespaces/{NS}/pods/high")  # PodScheduled False, written as filter answers
    victims = await preemptor.preempt(raw, pod_ask_from(raw), [str(NODE)])
    assert victims is not None and [a.owner.id for a in victims.evict] == ["claim-b"]
    assert api.calls == ["status b", "evict b"]
