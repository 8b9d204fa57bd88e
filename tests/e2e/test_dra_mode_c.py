"""DRA mode C on the real control plane (docs/dra-mode-c.md): in a namespace labelled
gpuledger.io/allocation=ledger the shipped MutatingAdmissionPolicy gates every pod with claims;
placement (as its service account, with the shipped RBAC) allocates each claim with the ledger's
policy, commits it in the ledger, writes it as kube-scheduler would and lifts the gate;
kube-scheduler binds the pod at once, without the binding-condition wait of mode B. A claim mode C
does not allocate is left to kube-scheduler with an event saying why."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gpuledger_core import claims
from gpuledger_core.claim_asks import claim_ask
from gpuledger_core.claim_placement import place_claim
from gpuledger_core.ids import AllocationId
from gpuledger_core.packing import make_policy
from gpuledger_dev.controlplane.cluster import ControlPlane
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.slices import DRIVER
from tests.e2e.dra_helpers import CLAIMS, claim_pod, share_claim
from tests.e2e.dra_ledger import COMMITTED, claim_entry, conditions, gated_world, ledger_of
from tests.e2e.dra_ledger import bound as pod_bound
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="session")]
GATE = "gpuledger.io/allocate"


def unbound_pod(name: str, claim: str) -> dict[str, Any]:
    """A pod of the claim, for kube-scheduler to place (no node named: mode C chooses it)."""
    pod = claim_pod(name, "", claim)
    del pod["spec"]["affinity"]
    return pod


async def test_the_ledger_allocates_a_gated_pods_claim_and_kube_scheduler_binds_it_at_once(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Any
) -> None:
    world_cm = gated_world(control_plane, nats_server, placement_kubeconfig, "h100-sxm-8", policy="binpack")
    async with world_cm as world:
        api, ns, node = world.api, world.ns, world.node
        # Mode B (the namespace is not labelled yet), kube-scheduler's first-fit: 70Gi on gpu-0, then
        # 20Gi on gpu-1 (gpu-0 has 10Gi left); the 70Gi goes. A 10Gi share now: first-fit would take
        # gpu-0, the ledger's binpack takes gpu-1, beside the 20Gi, and leaves gpu-0 whole.
        first = await world.claimed("first", share_claim("first", "70Gi", "50")["spec"]["devices"])
        second = await world.claimed("second", share_claim("second", "20Gi", "50")["spec"]["devices"])
        assert [d.device for d in claims.results_of(first, DRIVER) + claims.results_of(second, DRIVER)] == [
            "gpu-0", "gpu-1"]  # fmt: skip
        await api.delete(f"/api/v1/namespaces/{ns}/pods/first", grace_s=0)
        await api.delete(f"{CLAIMS.format(ns=ns)}/first")

        async def first_released() -> bool:
            return await claim_entry(nats_server, node.name, first["metadata"]["uid"]) is None

        await wait_for(first_released, 60, "the 70Gi claim released in the ledger", 0.2)
        await api.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"gpuledger.io/allocation": "ledger"}}})
        claim = await api.create(CLAIMS.format(ns=ns), share_claim("mine", "10Gi", "25"))
        ledger = await ledger_of(nats_server, node.name)
        assert ledger is not None
        ask = claim_ask(claim, {DRIVER: {"metadata": {"name": DRIVER}, "spec": {}}}, DRIVER)
        assert ask is not None
        expected = place_claim([ledger], ask, make_policy("binpack"), AllocationId("x"), 0.0, slots_per_card=8)
        assert [s.index for s in expected.allocation.shares()] == [1]  # beside the 20Gi share

        started = time.monotonic()
        created = await api.create(f"/api/v1/namespaces/{ns}/pods", unbound_pod("app", "mine"))
        assert {"name": GATE} in created["spec"].get("schedulingGates", []), created["spec"]  # the policy gated it

        async def bound() -> dict[str, Any] | None:
            pod = await api.get(f"/api/v1/namespaces/{ns}/pods/app")
            return pod if pod["spec"].get("nodeName") else None

        pod = await wait_for(bound, 60, "the pod bound", 0.05)
        took = time.monotonic() - started
        assert pod["spec"]["nodeName"] == node.name and not pod["spec"].get("schedulingGates")
        found = await api.get(f"{CLAIMS.format(ns=ns)}/mine")
        devices = claims.results_of(found, DRIVER)
        assert [d.device for d in devices] == [f"gpu-{s.index}" for s in expected.allocation.shares()]
        assert all(not d.binding_conditions for d in devices)  # allocated by the ledger: nothing to wait for
        assert "gpuledger.io/allocation" in found["metadata"]["finalizers"]
        assert [r["name"] for r in found["status"]["reservedFor"]] == ["app"]
        entry = await claim_entry(nats_server, node.name, found["metadata"]["uid"])
        assert entry is not None and entry.id == claims.allocation_id(claims.ref_of(found), devices)
        (share,) = entry.shares()
        assert (share.mem_mib, share.core_milli) == (10240, 250)
        assert took < 4.0, took  # no 5 s binding-condition poll
        assert COMMITTED not in conditions(found)  # mode B's controller only mirrored it

        await api.delete(f"/api/v1/namespaces/{ns}/pods/app", grace_s=0)
        await api.delete(f"{CLAIMS.format(ns=ns)}/mine")

        async def released() -> bool:
            gone = await claim_entry(nats_server, node.name, found["metadata"]["uid"])
            listed = await api.get(CLAIMS.format(ns=ns))
            return gone is None and all(c["metadata"]["name"] != "mine" for c in listed["items"])

        await wait_for(released, 60, "the claim deleted and its ledger entry released (gpuledger's finalizer)", 0.2)


async def test_a_claim_mode_c_does_not_allocate_is_left_to_kube_scheduler_with_an_event(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Any
) -> None:
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "tesla-p4-2") as world:
        api, ns = world.api, world.ns
        await api.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"gpuledger.io/allocation": "ledger"}}})
        body = share_claim("picky", "4Gi", "25")
        body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": "true"}}]
        await api.create(CLAIMS.format(ns=ns), body)
        created = await api.create(f"/api/v1/namespaces/{ns}/pods", unbound_pod("app", "picky"))
        uid = created["metadata"]["uid"]

        async def told() -> dict[str, Any] | None:
            events = await api.get(f"/api/v1/namespaces/{ns}/events", fieldSelector=f"involvedObject.uid={uid}")
            return next((e for e in events["items"] if e["reason"] == "GpuledgerLeftToScheduler"), None)

        event = await wait_for(told, 60, "the event saying why mode C left the claim", 0.2)
        assert "CEL selectors in a claim are left to kube-scheduler" in event["message"], event["message"]

        async def bound() -> bool:
            pod = await api.get(f"/api/v1/namespaces/{ns}/pods/app")
            return bool(pod["spec"].get("nodeName"))

        await wait_for(bound, 60, "the pod bound through mode B", 0.2)
        found = await api.get(f"{CLAIMS.format(ns=ns)}/picky")
        assert conditions(found)[COMMITTED]["status"] == "True"  # kube-scheduler allocated, the ledger committed


async def label_for_ledger(api: Any, ns: str) -> None:
    await api.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"gpuledger.io/allocation": "ledger"}}})


def unallocated_and_released(api: Any, server: NatsServer, node: str, ns: str, name: str, uid: str) -> Any:
    """Whether the claim is still there, deallocated, without gpuledger's finalizer, and holds nothing
    in the ledger."""

    async def check() -> bool:
        found = await api.get(f"{CLAIMS.format(ns=ns)}/{name}")
        return (
            not found.get("status", {}).get("allocation")
            and "gpuledger.io/allocation" not in (found["metadata"].get("finalizers") or [])
            and await claim_entry(server, node, uid) is None
        )

    return check


async def test_a_claim_no_pod_will_use_any_more_is_deallocated_and_released(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Any
) -> None:
    """A named claim whose pod ran and went, and one whose pod was deleted before kube-scheduler
    placed it (a pod of a scheduler that does not run: allocated by the ledger, never bound), are
    deallocated and their entries released, as kube-controller-manager deallocates the claims
    kube-scheduler allocated; the claims themselves stay for their next pod."""
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "tesla-p4-2") as world:
        api, ns, node = world.api, world.ns, world.node.name
        await label_for_ledger(api, ns)
        await api.create(CLAIMS.format(ns=ns), share_claim("used", "2Gi", "25"))
        await api.create(f"/api/v1/namespaces/{ns}/pods", unbound_pod("ran", "used"))
        await api.create(CLAIMS.format(ns=ns), share_claim("waited", "2Gi", "25"))
        stuck = unbound_pod("stuck", "waited")
        stuck["spec"]["schedulerName"] = "no-such-scheduler"
        await api.create(f"/api/v1/namespaces/{ns}/pods", stuck)

        async def reserved(name: str, pod: str) -> dict[str, Any] | None:
            found = await api.get(f"{CLAIMS.format(ns=ns)}/{name}")
            reservations = [r["name"] for r in found.get("status", {}).get("reservedFor") or []]
            return found if found["status"].get("allocation") and reservations == [pod] else None

        used = await wait_for(lambda: reserved("used", "ran"), 60, "the used claim allocated for its pod", 0.2)
        waited = await wait_for(
            lambda: reserved("waited", "stuck"), 60, "the waited claim allocated by the ledger", 0.2
        )
        for found in (used, waited):
            assert await claim_entry(nats_server, node, found["metadata"]["uid"]) is not None
        pod = await api.get(f"/api/v1/namespaces/{ns}/pods/stuck")
        assert not pod["spec"].get("nodeName") and not pod["spec"].get("schedulingGates")  # lifted, never bound

        await api.delete(f"/api/v1/namespaces/{ns}/pods/ran", grace_s=0)
        await api.delete(f"/api/v1/namespaces/{ns}/pods/stuck", grace_s=0)
        for name, found in (("used", used), ("waited", waited)):
            uid = found["metadata"]["uid"]
            gone = unallocated_and_released(api, nats_server, node, ns, name, uid)
            await wait_for(gone, 60, f"claim {name} deallocated and released", 0.2)

        # The claim serves its next pod: allocated again by the ledger.
        await api.create(f"/api/v1/namespaces/{ns}/pods", unbound_pod("next", "used"))
        again = await wait_for(lambda: reserved("used", "next"), 60, "the used claim allocated again", 0.2)
        assert await claim_entry(nats_server, node, again["metadata"]["uid"]) is not None


REFUSE_ONE = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": "refuse-one-allocation"},
    "spec": {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": ["resource.k8s.io"],
                    "apiVersions": ["v1"],
                    "operations": ["UPDATE"],
                    "resources": ["resourceclaims/status"],
                }
            ]
        },
        "validations": [
            {
                "expression": "object.metadata.name != 'refused' || !has(object.status.allocation)",
                "message": "this test refuses the allocation of claim refused",
            }
        ],
    },
}


async def test_an_allocation_the_api_server_refuses_is_rolled_back_in_the_ledger(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Any
) -> None:
    """An admission policy refuses the write of one claim's allocation: the ledger entry placement
    committed first is released each time (nothing stays held for a claim that is not allocated),
    the pod stays gated, and once the policy goes the claim is allocated."""
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "tesla-p4-2") as world:
        api, ns, node = world.api, world.ns, world.node.name
        policies = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
        bindings = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
        await api.create(policies, REFUSE_ONE)
        binding = {
            "metadata": {"name": "refuse-one-allocation"},
            "spec": {"policyName": "refuse-one-allocation", "validationActions": ["Deny"]},
        }
        await api.create(bindings, binding)
        try:
            await label_for_ledger(api, ns)
            await asyncio.sleep(2)  # the API server loads the policy
            created = await api.create(CLAIMS.format(ns=ns), share_claim("refused", "2Gi", "25"))
            uid = created["metadata"]["uid"]
            await api.create(f"/api/v1/namespaces/{ns}/pods", unbound_pod("app", "refused"))
            await api.create(CLAIMS.format(ns=ns), share_claim("fine", "2Gi", "25"))
            await api.create(f"/api/v1/namespaces/{ns}/pods", unbound_pod("other", "fine"))
            await pod_bound(api, ns, "other")  # placement is at work; the refused claim has been tried by now
            samples = []
            for _ in range(20):
                samples.append(await claim_entry(nats_server, node, uid))
                await asyncio.sleep(0.25)
            assert sum(1 for s in samples if s is not None) <= 2, samples  # released after each refusal
            found = await api.get(f"{CLAIMS.format(ns=ns)}/refused")
            assert not found.get("status", {}).get("allocation")
            pod = await api.get(f"/api/v1/namespaces/{ns}/pods/app")
            assert {"name": GATE} in pod["spec"].get("schedulingGates", [])
        finally:
            await api.delete(f"{bindings}/refuse-one-allocation")
            await api.delete(f"{policies}/refuse-one-allocation")
        await pod_bound(api, ns, "app")
        found = await api.get(f"{CLAIMS.format(ns=ns)}/refused")
        entry = await claim_entry(nats_server, node, uid)
        devices = claims.results_of(found, DRIVER)
        assert entry is not None and entry.id == claims.allocation_id(claims.ref_of(found), devices)
