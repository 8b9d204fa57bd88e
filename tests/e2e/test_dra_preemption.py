"""Share-aware preemption in DRA mode C on the real control plane (docs/preemption.md): a node's two
cards full of low-priority 2-4 GiB claims, each with its pod; a high-priority pod's 5 GiB claim fits
nowhere. Placement evicts exactly the smallest set of low-priority claims' pods on one card (through
the Eviction API), holds the room for the high claim, allocates it there once those pods are gone,
and lifts its gate; the victims' claims are deallocated and hold nothing in the ledger. A pod of
equal priority evicts nobody; a claim whose first ``firstAvailable`` choice no eviction can serve
preempts for its second, and a claim of four cards of one NVLink group evicts one fully linked
quad's holders. Where a PodDisruptionBudget forbids every eviction, nothing is
forced: the pod is told so in an Event, and preempts once the budget allows it. Claims
kube-scheduler allocated and the ledger committed (mode B) are victims too: a mode-C claim's
preemption evicts the fewest of their pods, their claims vetoed (``gpuledger.io/rejected``, reason
Preempted) and deallocated by kube-controller-manager, the card taken by the preemptor, and a pod
naming a victim's claim again is not bound onto it."""

from __future__ import annotations

from typing import Any

import pytest

from gpuledger_core import claims
from gpuledger_core.ledger import NodeLedger
from gpuledger_dev.controlplane.cluster import ControlPlane
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.slices import DRIVER
from gpuledger_placement import claim_veto
from gpuledger_placement.claim_fields import COMMITTED, DELETE_PROTECTION, decided
from tests.e2e.dra_helpers import CLAIMS, claimed_pod, share_claim
from tests.e2e.dra_ledger import bound as pod_bound
from tests.e2e.dra_ledger import claim_entry, gated_world, ledger_of
from tests.e2e.helpers import HIGH, LOW, priority_classes, smallest_sets
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]
SHARES = ("4Gi", "2Gi", "2Gi", "2Gi", "2Gi")  # best fit puts 4 + 2 GiB on one card, 2 + 2 + 2 on the other
WANT = "5Gi"
WANT_MIB = 5120


async def fill(api: Any, ns: str) -> dict[str, str]:
    """The node's two cards filled with low-priority claims, one at a time (each lands where the
    policy puts it); their uids -> their pods' names."""
    names: dict[str, str] = {}
    for i, memory in enumerate(SHARES):
        made = await api.create(CLAIMS.format(ns=ns), share_claim(f"low-{i}", memory, "10"))
        await api.create(f"/api/v1/namespaces/{ns}/pods", claimed_pod(f"low-{i}", f"low-{i}", LOW))
        await pod_bound(api, ns, f"low-{i}")
        names[made["metadata"]["uid"]] = f"low-{i}"
    return names


async def filled(api: Any, ns: str, server: NatsServer, node: str) -> tuple[dict[str, str], NodeLedger, list[set[str]]]:
    """``fill``, then the node's ledger and the smallest sets of its pods a 5 GiB share may evict."""
    names = await fill(api, ns)
    before = await ledger_of(server, node)
    assert before is not None
    expected = smallest_sets(before, names, WANT_MIB)
    assert expected and all(len(s) < len(SHARES) for s in expected), expected
    return names, before, expected


async def events_of(api: Any, ns: str, reason: str) -> list[dict[str, Any]]:
    return list((await api.get(f"/api/v1/namespaces/{ns}/events", fieldSelector=f"reason={reason}"))["items"])


async def bound_evicting(api: Any, ns: str, node: str, names: dict[str, str], expected: list[set[str]]) -> set[str]:
    """Once the pod "high" is bound to ``node`` (else the namespace's last events, to say why),
    the pods among ``names`` it evicted: one of the ``expected`` smallest sets."""
    try:
        high = await pod_bound(api, ns, "high", timeout=120)
    except TimeoutError as err:
        events = [f"{e['involvedObject']['name']}: {e.get('reason')}: {e.get('message')}"
                  for e in (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]]  # fmt: skip
        raise AssertionError("\n".join([str(err), *events[-30:]])) from None
    assert high["spec"]["nodeName"] == node
    left = {p["metadata"]["name"] for p in (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]}
    evicted = {name for name in names.values() if name not in left}
    assert evicted in expected, f"evicted {sorted(evicted)}; the smallest sets were {expected}"
    return evicted


def first_available(name: str) -> dict[str, Any]:
    """A claim whose first choice (8 GiB) no card of the node has, whatever is evicted, and whose
    second is the 5 GiB share: preemption makes room for the second."""
    body = share_claim(name, WANT, "10")
    fits = body["spec"]["devices"]["requests"][0]["exactly"]
    too_big = {**fits, "capacity": {"requests": {"memory": "8Gi", "compute": "10"}}}
    body["spec"]["devices"]["requests"][0] = {
        "name": "gpu",
        "firstAvailable": [{"name": "big", **too_big}, {"name": "fits", **fits}],
    }
    return body


@pytest.mark.parametrize("asked", ["exactly", "firstAvailable"])
async def test_a_high_priority_claim_evicts_the_fewest_low_priority_claims_pods_on_one_card(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Any, asked: str
) -> None:
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "tesla-p4-2") as world:
        api, ns, node = world.api, world.ns, world.node.name
        pods = f"/api/v1/namespaces/{ns}/pods"
        await api.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"gpuledger.io/allocation": "ledger"}}})
        async with priority_classes(api):
            names, before, expected = await filled(api, ns, nats_server, node)

            await api.create(CLAIMS.format(ns=ns), share_claim("equal", WANT, "10"))
            same = await api.create(pods, claimed_pod("equal", "equal", LOW))

            async def refused() -> bool:
                found = await events_of(api, ns, "GpuledgerUnschedulable")
                return any(e["involvedObject"].get("uid") == same["metadata"]["uid"] for e in found)

            await wait_for(refused, 60, "the equal-priority pod's claim refused", 0.2)

            high = share_claim("high", WANT, "10") if asked == "exactly" else first_available("high")
            await api.create(CLAIMS.format(ns=ns), high)
            await api.create(pods, claimed_pod("high", "high", HIGH))
            evicted = await bound_evicting(api, ns, node, names, expected)
            equal = await api.get(f"{pods}/equal")
            assert not equal["spec"].get("nodeName") and equal["spec"].get("schedulingGates")  # still waiting

            events = (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]
            assert {e["involvedObject"]["name"] for e in events if e.get("reason") == "Preempted"} == evicted
            held = next(e["message"] for e in events if e.get("reason") == "GpuledgerPreempting")
            assert node in held and all(name in held for name in evicted), held

            claim = await api.get(f"{CLAIMS.format(ns=ns)}/high")
            devices = claims.results_of(claim, DRIVER)
            assert [d.chosen for d in devices] == (["gpu"] if asked == "exactly" else ["gpu/fits"])
            entry = await claim_entry(nats_server, node, claim["metadata"]["uid"])
            assert entry is not None and entry.id == claims.allocation_id(claims.ref_of(claim), devices)
            victim_cards = {s.index for a in before.live() if names.get(a.owner.id) in evicted for s in a.shares()}
            assert {s.index for s in entry.shares()} == victim_cards
            assert entry.shares()[0].mem_mib == WANT_MIB

            async def victims_released() -> bool:
                for uid, name in names.items():
                    if name not in evicted:
                        continue
                    found = await api.get(f"{CLAIMS.format(ns=ns)}/{name}")
                    if found.get("status", {}).get("allocation") or await claim_entry(nats_server, node, uid):
                        return False
                return True

            await wait_for(victims_released, 60, "the victims' claims deallocated, holding nothing", 0.2)
            for uid, name in names.items():  # the others keep their cards
                assert (name in evicted) == (await claim_entry(nats_server, node, uid) is None), name


async def test_an_eviction_a_budget_forbids_is_never_forced_and_preemption_goes_on_once_it_allows(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Any
) -> None:
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "tesla-p4-2") as world:
        api, ns = world.api, world.ns
        pods = f"/api/v1/namespaces/{ns}/pods"
        budgets = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
        await api.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"gpuledger.io/allocation": "ledger"}}})
        async with priority_classes(api):
            keep_all = {"maxUnavailable": 0, "selector": {"matchLabels": {"tier": LOW}}}
            await api.create(budgets, {"metadata": {"name": "keep-all"}, "spec": keep_all})
            names = await fill(api, ns)

            # Running, as their kubelet would say: the Eviction API lets a pod that is not running yet
            # go whatever its budget says (kwok plays no kubelet for this node's claim pods).
            for name in names.values():
                await api.patch(f"{pods}/{name}/status", {"status": {"phase": "Running"}})
            await api.create(CLAIMS.format(ns=ns), share_claim("high", WANT, "10"))
            high = await api.create(pods, claimed_pod("high", "high", HIGH))

            async def blocked() -> dict[str, Any] | None:
                found = await events_of(api, ns, "GpuledgerPreemptionBlocked")
                return next((e for e in found if e["involvedObject"].get("uid") == high["metadata"]["uid"]), None)

            event = await wait_for(blocked, 60, "the pod told that a budget refused the eviction", 0.2)
            assert "never forced" in event["message"] and "disruption budget" in event["message"], event["message"]
            left = {p["metadata"]["name"]: p for p in (await api.get(pods))["items"]}
            assert all(name in left and not left[name]["metadata"].get("deletionTimestamp") for name in names.values())
            assert not left["high"]["spec"].get("nodeName") and left["high"]["spec"].get("schedulingGates")
            assert not await events_of(api, ns, "Preempted")

            await api.delete(f"{budgets}/keep-all")  # the budget allows it now: tried again, it preempts
            bound = await pod_bound(api, ns, "high", timeout=90)
            assert bound["spec"]["nodeName"] == world.node.name
            assert {e["involvedObject"]["name"] for e in await events_of(api, ns, "Preempted")} <= set(names.values())


async def test_a_mode_b_claim_s_pod_is_the_fewest_victims_of_a_mode_c_claim_and_its_claim_is_not_used_again(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Any
) -> None:
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "tesla-p4-2") as world:
        api, ns, node = world.api, world.ns, world.node.name
        pods, claims_path = f"/api/v1/namespaces/{ns}/pods", CLAIMS.format(ns=ns)
        async with priority_classes(api):
            names = await fill(api, ns)  # the namespace not opted in yet: kube-scheduler allocates (mode B)
            for name in names.values():
                low = await api.get(f"{claims_path}/{name}")
                assert DELETE_PROTECTION in low["metadata"]["finalizers"], low["metadata"]
                assert decided(low, DRIVER, claims.results_of(low, DRIVER)) == COMMITTED
            before = await ledger_of(nats_server, node)
            assert before is not None
            expected = smallest_sets(before, names, WANT_MIB)
            assert expected and all(len(s) < len(SHARES) for s in expected), expected

            await api.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"gpuledger.io/allocation": "ledger"}}})
            await api.create(claims_path, share_claim("high", WANT, "10"))
            await api.create(pods, claimed_pod("high", "high", HIGH))  # gated: mode C allocates its claim
            evicted = await bound_evicting(api, ns, node, names, expected)
            events = (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]
            assert {e["involvedObject"]["name"] for e in events if e.get("reason") == "Preempted"} == evicted

            claim = await api.get(f"{claims_path}/high")
            entry = await claim_entry(nats_server, node, claim["metadata"]["uid"])
            assert entry is not None and entry.shares()[0].mem_mib == WANT_MIB
            victim_cards = {s.index for a in before.live() if names.get(a.owner.id) in evicted for s in a.shares()}
            assert {s.index for s in entry.shares()} == victim_cards

            async def deallocated() -> bool:  # kube-controller-manager's, once no pod reserves them
                for uid, name in names.items():
                    if name in evicted:
                        found = await api.get(f"{claims_path}/{name}")
                        if found.get("status", {}).get("allocation") or await claim_entry(nats_server, node, uid):
                            return False
                return True

            await wait_for(deallocated, 60, "the victims' claims deallocated, holding nothing", 0.2)
            for uid, name in names.items():  # the others keep their cards, committed
                kept = await claim_entry(nats_server, node, uid)
                assert (name in evicted) == (kept is None), name
                if name not in evicted:
                    low = await api.get(f"{claims_path}/{name}")
                    assert decided(low, DRIVER, claims.results_of(low, DRIVER)) == COMMITTED, name
                    assert not claim_veto.is_vetoed(low, DRIVER), name

            # A pod naming a victim's claim again, in mode B: kube-scheduler allocates the claim anew
            # only where its own count of the slices has room, and the ledger decides; the preemptor's
            # card is not given to it.
            await api.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"gpuledger.io/allocation": None}}})
            victim = sorted(evicted)[0]
            await api.create(pods, claimed_pod("again", victim, LOW))
            with pytest.raises(TimeoutError):
                await pod_bound(api, ns, "again", timeout=15)
            assert await claim_entry(nats_server, node, claim["metadata"]["uid"]) == entry
            uid = next(u for u, n in names.items() if n == victim)
            assert await claim_entry(nats_server, node, uid) is None


async def test_a_mode_b_pod_kube_scheduler_cannot_allocate_for_evicts_the_fewest_low_priority_claims_pods(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Any
) -> None:
    """kube-scheduler allocates (the namespace is not opted in) and has no preemption for devices:
    placement preempts for the pod it leaves Unschedulable, and kube-scheduler then allocates the
    freed card itself, which the ledger commits in place of the room it held."""
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "tesla-p4-2") as world:
        api, ns, node = world.api, world.ns, world.node.name
        pods, claims_path = f"/api/v1/namespaces/{ns}/pods", CLAIMS.format(ns=ns)
        async with priority_classes(api):
            names, before, expected = await filled(api, ns, nats_server, node)

            await api.create(claims_path, share_claim("high", WANT, "10"))
            created = await api.create(pods, claimed_pod("high", "high", HIGH))
            assert not created["spec"].get("schedulingGates")  # kube-scheduler's to allocate
            evicted = await bound_evicting(api, ns, node, names, expected)
            events = (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]
            assert {e["involvedObject"]["name"] for e in events if e.get("reason") == "Preempted"} == evicted

            claim = await api.get(f"{claims_path}/high")
            devices = claims.results_of(claim, DRIVER)
            assert decided(claim, DRIVER, devices) == COMMITTED  # kube-scheduler's allocation, the ledger's yes
            entry = await claim_entry(nats_server, node, claim["metadata"]["uid"])
            assert entry is not None and entry.id == claims.allocation_id(claims.ref_of(claim), devices)
            victim_cards = {s.index for a in before.live() if names.get(a.owner.id) in evicted for s in a.shares()}
            assert {s.index for s in entry.shares()} == victim_cards and entry.shares()[0].mem_mib == WANT_MIB
            for uid, name in names.items():  # the others keep their cards
                assert (name in evicted) == (await claim_entry(nats_server, node, uid) is None), name


async def test_a_claim_of_four_nvlinked_cards_evicts_one_quad_s_low_priority_pods(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Any
) -> None:
    """DGX-1 (quads 0-3 and 4-7 fully linked), every card held by a low-priority whole-card claim:
    a high-priority claim of four cards of one NVLink group evicts the holders of one quad, all four
    and nobody else, and is allocated that quad."""
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "dgx1-v100") as world:
        api, ns, node = world.api, world.ns, world.node.name
        pods = f"/api/v1/namespaces/{ns}/pods"
        await api.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"gpuledger.io/allocation": "ledger"}}})
        whole = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
        async with priority_classes(api):
            names: dict[str, str] = {}
            for i in range(8):
                made = await api.create(
                    CLAIMS.format(ns=ns), {"metadata": {"name": f"low-{i}"}, "spec": {"devices": {"requests": [whole]}}}
                )
                await api.create(pods, claimed_pod(f"low-{i}", f"low-{i}", LOW))
                await pod_bound(api, ns, f"low-{i}")
                names[made["metadata"]["uid"]] = f"low-{i}"
            before = await ledger_of(nats_server, node)
            assert before is not None
            card_of = {names[a.owner.id]: a.shares()[0].index for a in before.live() if a.owner.id in names}
            assert sorted(card_of.values()) == list(range(8))

            four = {"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": 4}}
            constraint = {"requests": ["gpus"], "matchAttribute": f"{DRIVER}/nvlinkGroup4"}
            spec = {"devices": {"requests": [four], "constraints": [constraint]}}
            await api.create(CLAIMS.format(ns=ns), {"metadata": {"name": "high"}, "spec": spec})
            await api.create(pods, claimed_pod("high", "high", HIGH))
            quads = [{n for n, c in card_of.items() if c // 4 == q} for q in (0, 1)]
            evicted = await bound_evicting(api, ns, node, names, quads)

            claim = await api.get(f"{CLAIMS.format(ns=ns)}/high")
            cards = sorted(int(d.device.removeprefix("gpu-")) for d in claims.results_of(claim, DRIVER))
            assert cards == sorted(card_of[n] for n in evicted)
