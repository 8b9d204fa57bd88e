"""The dominant-resource guard on the real control plane: every pod of gpuledger-scheduler reaches
the extender (no managedResources), so a pod that takes no card but would use up a GPU node's CPU
while its card is free is sent to another node, or waits with the guard's reason; a smaller one
runs there. And what keeps other pods off GPU nodes: the admission policy that lets only
gpuledger-scheduler's pods (and DaemonSet pods) tolerate the GPU nodes' taint, and the 1.36
component that gives gpuledger-scheduler's pods that toleration."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuledger_cli.dev.kubereal import RealCluster, node_object
from gpuledger_cli.dev.stack import Stack
from gpuledger_testing.controlplane.api import ApiError, KubeApi
from gpuledger_testing.waiting import wait_for
from tests.e2e.helpers import POLL_S, get_pod, ledger, namespace, running

pytestmark = pytest.mark.asyncio(loop_scope="session")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
GPU_NODE = "rtx-0"  # 16 cores, 64 GiB, one card: the guard keeps 4 cores and 32 GiB while it is free
CPU_NODE = "e2e-cpu-0"  # no cards
TAINT = "gpuledger.io/gpu-node"


def cpu_pod(name: str, ns: str, cpu: str, nodes: list[str], scheduler: str = "gpuledger-scheduler") -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
            },
            "containers": [{"name": "app", "image": "cpu", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}],
        },
    }


async def bound_to(api: KubeApi, ns: str, name: str) -> str:
    async def node() -> str | None:
        return (await get_pod(api, ns, name))["spec"].get("nodeName") or None

    found = await wait_for(node, 60, f"pod {ns}/{name} bound", POLL_S)
    assert found is not None
    return found


@pytest.mark.timeout(180)
async def test_a_cpu_pod_that_would_strand_the_card_goes_elsewhere_or_waits_with_the_reason(
    stack: Stack, cluster: RealCluster, api: KubeApi
) -> None:
    async def card_free() -> bool:
        found = (await ledger(stack)).get(GPU_NODE)
        return found is not None and not list(found.live())

    await wait_for(card_free, 60, f"{GPU_NODE}'s card held by nobody (an earlier test's pods gone)", POLL_S)
    with contextlib.suppress(ApiError):
        await api.create("/api/v1/nodes", node_object(CPU_NODE, 16000, 65536))
    async with namespace(api, "e2e-guard") as ns:
        await api.create(f"/api/v1/namespaces/{ns}/pods", cpu_pod("big-anywhere", ns, "14", [GPU_NODE, CPU_NODE]))
        assert await bound_to(api, ns, "big-anywhere") == CPU_NODE  # rtx-0 fits it, but would strand its card

        made = await api.create(f"/api/v1/namespaces/{ns}/pods", cpu_pod("big-here", ns, "14", [GPU_NODE]))
        why = await wait_for(
            lambda: cluster.scheduling_failure(ns, "big-here", made["metadata"]["uid"]),
            60,
            "the guard's reason",
            POLL_S,
        )
        assert "1 guard: CPU left would be 2000m, below the 4000m kept for 1 free card(s)" in why, why
        assert not (await get_pod(api, ns, "big-here"))["spec"].get("nodeName")

        await api.create(f"/api/v1/namespaces/{ns}/pods", cpu_pod("small-here", ns, "10", [GPU_NODE]))
        assert await bound_to(api, ns, "small-here") == GPU_NODE  # leaves 6 cores: room for the card's pods
        await running(api, ns, "small-here")
    with contextlib.suppress(ApiError):
        await api.delete(f"/api/v1/nodes/{CPU_NODE}")


def _objects(path: Path) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all(path.read_text()) if o]


@pytest.mark.timeout(120)
async def test_only_gpuledger_schedulers_pods_tolerate_the_gpu_node_taint_and_they_get_it(
    cluster: RealCluster, api: KubeApi
) -> None:
    cp = cluster.control_plane
    guard_policy = [
        o
        for o in _objects(DEPLOY / "base" / "admission.yaml")
        if o["metadata"]["name"] == "gpuledger-gpu-nodes-through-gpuledger"
    ]
    component = _objects(DEPLOY / "components" / "gpu-node-toleration" / "toleration.yaml")
    cp.kubectl("apply", "--server-side", "-f", "-", input_text=yaml.safe_dump_all(guard_policy + component))
    async with namespace(api, "e2e-guard-taint") as ns:
        create = f"/api/v1/namespaces/{ns}/pods?dryRun=All"
        theirs = cpu_pod("theirs", ns, "1", [GPU_NODE], scheduler="default-scheduler")
        theirs["spec"]["tolerations"] = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]

        async def refused() -> str | None:
            try:
                await api.create(create, theirs)
            except ApiError as err:
                return str(err) if err.status in (403, 422) else None
            return None

        why = await wait_for(refused, 30, "the taint policy in force", 0.5)
        assert "only pods of gpuledger-scheduler may tolerate the GPU nodes' taint" in str(why)
        wildcard = dict(theirs, spec={**theirs["spec"], "tolerations": [{"operator": "Exists"}]})
        with pytest.raises(ApiError):
            await api.create(create, wildcard)
        daemon = dict(theirs, metadata={**theirs["metadata"], "ownerReferences": [_daemonset_owner()]})
        await api.create(create, daemon)  # a DaemonSet's pod runs on every node

        async def tolerated() -> list[Any] | None:
            made = await api.create(create, cpu_pod("ours", ns, "1", [GPU_NODE]))
            found = [t for t in made["spec"].get("tolerations", []) if t.get("key") == TAINT]
            return found or None

        given = await wait_for(tolerated, 30, "the toleration given to gpuledger-scheduler's pods", 0.5)
        assert given == [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]


def _daemonset_owner() -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "0000-agent", "controller": True}
