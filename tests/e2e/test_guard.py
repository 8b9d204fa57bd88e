"""The dominant-resource guard on the real control plane: every pod of gpuledger-scheduler reaches
the extender (no managedResources), so a pod that takes no card but would use up a GPU node's CPU
while its card is free is sent to another node, or waits with the guard's reason; a smaller one
runs there. And what keeps other pods off GPU nodes: the admission policy that lets only
gpuledger-scheduler's pods (and the pods the DaemonSet controller itself creates) tolerate the GPU
nodes' taint, and the 1.36 component that gives gpuledger-scheduler's pods that toleration."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuledger_dev.controlplane.api import ApiError, KubeApi
from gpuledger_dev.controlplane.cluster import Access, ControlPlane, Process
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster, node_object
from tests.e2e.helpers import POLL_S, get_pod, ledger, namespace, running
from tests.support.waiting import wait_for

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


def apply_taint_policy(cp: ControlPlane) -> None:
    """The base's taint policy and the 1.36 toleration component, as shipped (server-side apply)."""
    guard_policy = [
        o
        for o in _objects(DEPLOY / "base" / "admission.yaml")
        if o["metadata"]["name"] == "gpuledger-gpu-nodes-through-gpuledger"
    ]
    component = _objects(DEPLOY / "components" / "gpu-node-toleration" / "toleration.yaml")
    cp.kubectl("apply", "--server-side", "-f", "-", input_text=yaml.safe_dump_all(guard_policy + component))


def tolerating_pod(name: str, ns: str) -> dict[str, Any]:
    """A default-scheduler pod that tolerates the GPU nodes' taint: what the policy refuses."""
    pod = cpu_pod(name, ns, "1", [GPU_NODE], scheduler="default-scheduler")
    pod["spec"]["tolerations"] = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    return pod


async def refused_by_policy(api: KubeApi, path: str, pod: dict[str, Any]) -> str | None:
    """The policy's refusal of ``pod`` (None while the pod is let in, or refused for another reason,
    such as RBAC not loaded yet)."""
    try:
        await api.create(path, pod)
    except ApiError as err:
        if err.status in (403, 422) and POLICY_SAYS in str(err):
            return str(err)
    return None


POLICY_SAYS = "only pods of gpuledger-scheduler may tolerate the GPU nodes' taint"


@pytest.mark.timeout(120)
async def test_only_gpuledger_schedulers_pods_tolerate_the_gpu_node_taint_and_they_get_it(
    cluster: RealCluster, api: KubeApi
) -> None:
    apply_taint_policy(cluster.control_plane)
    async with namespace(api, "e2e-guard-taint") as ns:
        create = f"/api/v1/namespaces/{ns}/pods?dryRun=All"
        theirs = tolerating_pod("theirs", ns)
        await wait_for(lambda: refused_by_policy(api, create, theirs), 30, "the taint policy in force", 0.5)
        wildcard = dict(theirs, spec={**theirs["spec"], "tolerations": [{"operator": "Exists"}]})
        assert await refused_by_policy(api, create, wildcard)

        async def tolerated() -> list[Any] | None:
            made = await api.create(create, cpu_pod("ours", ns, "1", [GPU_NODE]))
            found = [t for t in made["spec"].get("tolerations", []) if t.get("key") == TAINT]
            return found or None

        given = await wait_for(tolerated, 30, "the toleration given to gpuledger-scheduler's pods", 0.5)
        assert given == [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]


@pytest.mark.timeout(180)
async def test_a_forged_daemonset_owner_is_not_exempt_and_a_real_daemonsets_pod_is(
    cluster: RealCluster, api: KubeApi
) -> None:
    """The exemption is keyed on who creates the pod (the request's userInfo, set by the API server
    from the caller's credentials), not on the pod's ownerReferences, which any client may write."""
    cp = cluster.control_plane
    apply_taint_policy(cp)
    async with namespace(api, "e2e-guard-daemonset") as ns:
        forged = tolerating_pod("forged", ns)
        forged["metadata"]["ownerReferences"] = [_daemonset_owner()]
        async with ordinary_user(cp, api, ns) as user:
            why = await wait_for(
                lambda: refused_by_policy(user, f"/api/v1/namespaces/{ns}/pods?dryRun=All", forged),
                30,
                "an ordinary user's pod with a forged DaemonSet owner refused by the taint policy",
                0.5,
            )
        assert "names default-scheduler" in str(why)

        with daemonset_controller(cp) as controller:
            await api.create(f"/apis/apps/v1/namespaces/{ns}/daemonsets", agent_daemonset(ns))

            async def created() -> dict[str, Any] | None:
                controller.check()  # a controller that died says why, with its log
                return await _daemonset_pod(api, ns)

            pod = await wait_for(
                created,
                60,
                "the DaemonSet controller's pod, let in by the taint policy (the DaemonSet's FailedCreate "
                "events say why not)",
                0.5,
            )
        [owner] = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("DaemonSet", "agent", True)
        assert any(t.get("key") == TAINT for t in pod["spec"]["tolerations"])
        await api.delete(f"/apis/apps/v1/namespaces/{ns}/daemonsets/agent")


@contextlib.asynccontextmanager
async def ordinary_user(cp: ControlPlane, api: KubeApi, ns: str) -> AsyncIterator[KubeApi]:
    """The API as a service account that may create pods in ``ns`` and nothing else."""
    await api.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "someone"}})
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}
    await api.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", {"metadata": {"name": "pods"}, "rules": [rule]}
    )
    binding = {
        "metadata": {"name": "someone-pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
        "subjects": [{"kind": "ServiceAccount", "name": "someone", "namespace": ns}],
    }
    await api.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", binding)
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
    token = await api.create(f"/api/v1/namespaces/{ns}/serviceaccounts/someone/token", request)
    assert cp.access is not None
    async with KubeApi(Access(cp.access.server, cp.access.ca_pem, token["status"]["token"])) as user:
        yield user


@contextlib.contextmanager
def daemonset_controller(cp: ControlPlane) -> Iterator[Process]:
    """kube-controller-manager running only the DaemonSet controller, as kubeadm runs it: with
    --use-service-account-credentials, so the pods it creates reach admission as
    system:serviceaccount:kube-system:daemon-set-controller."""
    assert cp.bins is not None and cp.admin_kubeconfig is not None
    argv = [
        str(cp.bins.kube_controller_manager),
        "--kubeconfig",
        str(cp.admin_kubeconfig),
        "--controllers",
        "daemonset-controller",
        "--use-service-account-credentials",
        "--leader-elect=false",
        "--secure-port=0",
    ]
    process = Process("daemonset-controller", argv, cp.workdir / "logs" / "daemonset-controller.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def agent_daemonset(ns: str) -> dict[str, Any]:
    """A node agent's DaemonSet on the GPU node: it tolerates the taint and names no scheduler."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": GPU_NODE},
                    "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "agent", "image": "agent"}],
                },
            },
        },
    }


async def _daemonset_pod(api: KubeApi, ns: str) -> dict[str, Any] | None:
    pods = (await api.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="app=agent"))["items"]
    return dict(pods[0]) if pods else None


def _daemonset_owner() -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "0000-agent", "controller": True}
