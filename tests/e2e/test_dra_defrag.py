"""Defragmentation of DRA mode-C claims on the real control plane (docs/preemption.md,
"Defragmentation"): placement with ``defrag: on``; two gated Tesla P4 nodes (7611 MiB a card). A
movable ReplicaSet's two pods, each with a 4 GiB claim made from its template, land on the target
node, one a card, while the spare node is full. Once the spare is free, a 5 GiB claim pinned to the
target fits nowhere and has nobody of lower priority to preempt: placement moves exactly one of the
ReplicaSet's pods (Eviction API), kube-controller-manager deletes its claim, the ReplicaSet makes
a new pod whose new claim mode C allocates on the spare, and the 5 GiB claim takes the card the
moved claim left."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from pathlib import Path
from typing import Any

import pytest

from gpuledger_dev.controlplane.cluster import ControlPlane, plain_scheduler_config
from gpuledger_dev.natsserver import NatsServer
from tests.e2e.dra_helpers import CLAIMS, SCHEDULER, claim_pod, ensure_device_class, namespace, published, share_claim
from tests.e2e.dra_ledger import bound, claim_entry, gated_node, ledger_of, placement_with_claims
from tests.e2e.helpers import movable_replica_set
from tests.support.replicas import running_allocator
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates"


def replica_set(ns: str, nodes: list[str]) -> dict[str, Any]:
    """Two movable pods that may run on ``nodes``, each with a 4 GiB claim from the template "gpu4"."""
    spec = claim_pod("x", nodes[0], "unused")["spec"]
    terms = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]} for n in nodes]  # ORed
    spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] = terms
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu4"}]
    return movable_replica_set(ns, spec)


async def test_a_claim_that_fits_nowhere_gets_room_by_moving_one_movable_pod_with_its_claim(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Path
) -> None:
    await asyncio.to_thread(control_plane.start_scheduler, SCHEDULER, plain_scheduler_config(SCHEDULER))
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(running_allocator(nats_server.url))
        await stack.enter_async_context(placement_with_claims(nats_server, placement_kubeconfig, defrag="on"))
        target = await stack.enter_async_context(gated_node(control_plane, nats_server, "tesla-p4-2"))
        spare = await stack.enter_async_context(gated_node(control_plane, nats_server, "tesla-p4-2"))
        api = target.api
        ns = await stack.enter_async_context(namespace(api, f"defrag-{target.name}"))
        await api.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"gpuledger.io/allocation": "ledger"}}})
        for node in (target, spare):
            await published(node)
            await wait_for(functools.partial(ledger_of, nats_server, node.name), 30, f"{node.name} in the ledger", 0.2)
        await ensure_device_class(api)
        pods, claims = f"/api/v1/namespaces/{ns}/pods", CLAIMS.format(ns=ns)

        for i in range(2):  # the spare full while the ReplicaSet's pods are placed: they land on the target
            await api.create(claims, share_claim(f"block-{i}", "7Gi", "10"))
            await api.create(pods, claim_pod(f"block-{i}", spare.name, f"block-{i}"))
            await bound(api, ns, f"block-{i}")
        template = {"metadata": {"name": "gpu4"}, "spec": {"spec": share_claim("gpu4", "4Gi", "10")["spec"]}}
        await api.create(TEMPLATES.format(ns=ns), template)
        await api.create(f"/apis/apps/v1/namespaces/{ns}/replicasets", replica_set(ns, [target.name, spare.name]))

        async def placed() -> list[dict[str, Any]] | None:
            found = [p for p in (await api.get(pods))["items"] if p["metadata"]["name"].startswith("movable-")]
            live = [p for p in found if not p["metadata"].get("deletionTimestamp")]
            return live if len(live) == 2 and all(p["spec"].get("nodeName") for p in live) else None

        first = await wait_for(placed, 90, "the ReplicaSet's two pods bound", 0.2)
        assert {p["spec"]["nodeName"] for p in first} == {target.name}
        for i in range(2):
            await api.delete(f"{pods}/block-{i}", grace_s=0)
            await api.delete(f"{claims}/block-{i}")

        async def spare_free() -> bool:
            found = await ledger_of(nats_server, spare.name)
            return found is not None and not list(found.live())

        await wait_for(spare_free, 60, f"{spare.name} free again", 0.2)

        big = await api.create(claims, share_claim("big", "5Gi", "10"))
        await api.create(pods, claim_pod("big", target.name, "big"))
        try:
            await bound(api, ns, "big", timeout=120)
        except TimeoutError as err:
            events = [f"{e['involvedObject']['name']}: {e.get('reason')}: {e.get('message')}"
                      for e in (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]]  # fmt: skip
            raise AssertionError("\n".join([str(err), *events[-30:]])) from None

        events = (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]
        moved = {e["involvedObject"]["name"] for e in events if e.get("reason") == "GpuledgerMoved"}
        assert len(moved) == 1 and moved <= {p["metadata"]["name"] for p in first}, moved
        told = next(e["message"] for e in events if e.get("reason") == "GpuledgerDefragmenting")
        assert target.name in told and next(iter(moved)) in told, told
        assert not any(e.get("reason") == "Preempted" for e in events)
        (gone,) = [p for p in first if p["metadata"]["name"] in moved]
        (old_claim,) = gone["status"]["resourceClaimStatuses"]

        async def recreated() -> list[dict[str, Any]] | None:
            found = await placed()
            names = {p["metadata"]["name"] for p in found or []}
            return found if found is not None and not names & moved else None

        after = await wait_for(recreated, 90, "the moved pod recreated and bound", 0.2)
        assert sorted(p["spec"]["nodeName"] for p in after) == sorted([target.name, spare.name])
        entry = await claim_entry(nats_server, target.name, big["metadata"]["uid"])
        assert entry is not None and entry.shares()[0].mem_mib == 5120

        async def old_claim_gone() -> bool:
            found = (await api.get(claims))["items"]
            return all(c["metadata"]["name"] != old_claim["resourceClaimName"] for c in found)

        await wait_for(old_claim_gone, 60, "the moved pod's claim deleted by kube-controller-manager", 0.2)
        for node in (target, spare):  # the moved claim holds nothing anywhere
            found = await ledger_of(nats_server, node.name)
            assert found is not None and all(a.owner.name != old_claim["resourceClaimName"] for a in found.live())
        await api.delete(f"/apis/apps/v1/namespaces/{ns}/replicasets/movable")
