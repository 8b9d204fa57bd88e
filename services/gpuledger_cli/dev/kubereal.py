"""The local stack on a real control plane: kube-apiserver, kube-scheduler with gpuledger's
extender, kube-controller-manager, etcd and kwok (built from Go modules on first use), and a
simulated kubelet per kwok node that plays the device manager's side for the plugin shim.

Every demo pod goes the real way: created through the API, scheduled by kube-scheduler (our
extender filters and binds), admitted by the node's kubelet (Allocate from the plugin shim), and
turned Running by kwok. A pod that cannot be placed is Pending with kube-scheduler's
FailedScheduling event, which carries the extender's reason.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from gpuledger_cli.dev.kubesim import Outcome
from gpuledger_common.fleet import Fleet
from gpuledger_testing.controlplane.api import ApiError, KubeApi
from gpuledger_testing.controlplane.cluster import ControlPlane, scheduler_config
from gpuledger_testing.extender_pki import ExtenderPki
from gpuledger_testing.kwok_kubelet import KwokKubelet

NAMESPACE = "demo"
SCHEDULER = "gpuledger-scheduler"
DEFAULT_CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "110"}
OUTCOME_S = 60.0


def node_object(name: str, cpu_milli: int = 0, memory_mib: int = 0) -> dict[str, Any]:
    """A kwok Node with its cpu, memory and pods capacity set at creation (kwok keeps them)."""
    capacity = dict(DEFAULT_CAPACITY)
    if cpu_milli:
        capacity["cpu"] = f"{cpu_milli}m"
    if memory_mib:
        capacity["memory"] = f"{memory_mib}Mi"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


class RealCluster:
    def __init__(self, run_dir: Path, fleet: Fleet) -> None:
        self.run_dir, self.fleet = run_dir, fleet
        self.nodes = [str(n.node.name) for n in fleet.nodes]
        self.control_plane = ControlPlane(run_dir / "cp")
        self.kubelets: dict[str, KwokKubelet] = {}
        self.extender = ""
        self.api: KubeApi | None = None

    def plugin_dir(self, node: str) -> Path:
        return self.run_dir / node / "device-plugins"

    def pod_resources(self, node: str) -> Path:
        return self.run_dir / node / "pod-resources.sock"

    @property
    def kubeconfig(self) -> Path:
        assert self.control_plane.admin_kubeconfig is not None
        return self.control_plane.admin_kubeconfig

    async def start(self) -> Path:
        """Build (if needed) and start the control plane, create the nodes, start their kubelets."""
        await asyncio.to_thread(self.control_plane.start)
        assert self.control_plane.access is not None
        self.api = await KubeApi(self.control_plane.access).__aenter__()
        await self.api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        for member in self.fleet.nodes:
            node = str(member.node.name)
            await self.api.create("/api/v1/nodes", node_object(node, member.node.cpu_milli, member.node.memory_mib))
            self.plugin_dir(node).mkdir(parents=True, exist_ok=True)
            kubelet = KwokKubelet(node, self.plugin_dir(node), self.pod_resources(node), self.control_plane.access)
            await kubelet.__aenter__()
            self.kubelets[node] = kubelet
        return self.kubeconfig

    async def use_extender(self, url: str, pki: ExtenderPki) -> None:
        """Start kube-scheduler with gpuledger's configuration from deploy/, pointed at ``url``,
        presenting its client certificate from ``pki``."""
        self.extender = url
        config = scheduler_config(url, pki.scheduler_tls())
        await asyncio.to_thread(self.control_plane.start_scheduler, "kube-scheduler", config)

    async def stop(self) -> None:
        for kubelet in self.kubelets.values():
            await kubelet.__aexit__(None, None, None)
        if self.api is not None:
            await self.api.__aexit__(None, None, None)
        await asyncio.to_thread(self.control_plane.stop)

    async def devices_ready(self) -> bool:
        """Every kubelet has the plugin registered and wrote its devices into the Node's status."""
        if not all(k.registered and k.devices for k in self.kubelets.values()):
            return False
        assert self.api is not None
        for node in self.nodes:
            found = await self.api.get(f"/api/v1/nodes/{node}")
            if int(found.get("status", {}).get("allocatable", {}).get("gpuledger.io/gpu", "0")) == 0:
                return False
        return True

    async def pod_uid(self, namespace: str, name: str) -> str:
        assert self.api is not None
        return str((await self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}"))["metadata"]["uid"])

    async def run(self, pod: dict[str, Any], nodes: list[str] | None = None) -> Outcome:
        """Create ``pod`` (kept to ``nodes`` by node affinity if given) and wait until it runs or is refused."""
        assert self.api is not None
        body = dict(pod)
        if nodes:
            body["spec"] = {**pod["spec"], "affinity": _on_nodes(nodes)}
        namespace = body["metadata"].get("namespace", NAMESPACE)
        created = await self.api.create(f"/api/v1/namespaces/{namespace}/pods", body)
        return await self.outcome(namespace, created["metadata"]["name"], created["metadata"]["uid"])

    async def outcome(self, namespace: str, name: str, uid: str, timeout: float = OUTCOME_S) -> Outcome:
        """Running (with what its containers got), refused by kubelet, or Pending with the scheduler's reason."""
        assert self.api is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pod = await self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            status, node = pod.get("status", {}), pod.get("spec", {}).get("nodeName", "")
            if status.get("phase") == "Running":
                return Outcome(name, node, self.kubelets[node].container_envs(uid))
            if status.get("phase") == "Failed":
                return Outcome(name, node, pending=f"kubelet refused it: {status.get('message', '')}")
            why = await self.scheduling_failure(namespace, name, uid)
            if why and not node:
                return Outcome(name, pending=why)
            await asyncio.sleep(0.1)
        raise TimeoutError(f"pod {namespace}/{name} neither ran nor was refused within {timeout:g}s")

    async def scheduling_failure(self, namespace: str, name: str, uid: str) -> str:
        """The message of the pod's latest FailedScheduling event ('' if none)."""
        assert self.api is not None
        events = await self.api.get(
            f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.uid={uid},reason=FailedScheduling"
        )
        items = sorted(events.get("items", []), key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        return str(items[-1].get("message", "")) if items else ""

    async def delete(self, namespace: str, name: str) -> None:
        assert self.api is not None
        try:
            await self.api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiError as err:
            if err.status != 404:
                raise


def _on_nodes(nodes: list[str]) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes)}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
