"""A simulated control plane for the local stack: an API server, a scheduler, and kubelets.

The API server and kubelets are the dev mode's fakes (``gpuledger_dev``), faithful at the wire: the
real placement service binds through the API server's REST paths, and the real plugin shim
registers with each kubelet over a unix socket and answers its Allocate calls. The scheduler
here does what kube-scheduler does with an extender: filter, prioritize, bind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from gpuledger_dev.extender_pki import ExtenderPki
from gpuledger_dev.fake_apiserver import FakeApiServer
from gpuledger_dev.fake_kubelet import AdmissionError, FakeKubelet
from gpuledger_dev.kubelet_pods import fake_pod

GPU = "gpuledger.io/gpu"


@dataclass(frozen=True, slots=True)
class Outcome:
    """Where a pod went and what its containers got, or why it is pending."""

    pod: str
    node: str = ""
    env: dict[str, dict[str, str]] = field(default_factory=dict)
    pending: str = ""
    dev: dict[str, tuple[str, ...]] = field(default_factory=dict)  # a real node's: what each container's /dev held


def gpu_pod(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "demo", "annotations": annotations or {}},
        "spec": {
            "schedulerName": "gpuledger-scheduler",
            "containers": [{"name": "app", "image": "cuda", "resources": {"limits": limits, "requests": limits}}],
        },
    }


class FakeCluster:
    def __init__(self, run_dir: Path, nodes: list[str]) -> None:
        self.run_dir, self.nodes = run_dir, nodes
        self.apiserver = FakeApiServer()
        self.kubelets: dict[str, FakeKubelet] = {}
        self.extender = ""
        self._http: aiohttp.ClientSession | None = None

    def plugin_dir(self, node: str) -> Path:
        return self.run_dir / node / "device-plugins"

    def pod_resources(self, node: str) -> Path:
        return self.run_dir / node / "pod-resources.sock"

    async def start(self) -> Path:
        """Start the API server and every kubelet; returns the API server's kubeconfig."""
        await self.apiserver.start()
        for node in self.nodes:
            self.apiserver.add_node(node)
            self.plugin_dir(node).mkdir(parents=True, exist_ok=True)
            kubelet = FakeKubelet(str(self.plugin_dir(node)), str(self.pod_resources(node)))
            await kubelet.start()
            self.kubelets[node] = kubelet
        return self.apiserver.kubeconfig(self.run_dir / "kubeconfig")

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        for kubelet in self.kubelets.values():
            await kubelet.stop()
        await self.apiserver.close()

    async def devices_ready(self) -> bool:
        """Every kubelet has the plugin registered and a device list."""
        return all(k.registrations and k.devices for k in self.kubelets.values())

    async def run(self, pod: dict[str, Any], nodes: list[str] | None = None) -> Outcome:
        """Schedule ``pod`` (only onto ``nodes`` if given, as a node selector would) and admit it."""
        stored = self.apiserver.add_pod(pod)
        name = stored["metadata"]["name"]
        node, why = await self._schedule(stored, nodes or self.nodes)
        if not node:
            return Outcome(name, pending=why)
        try:
            admitted = await self.kubelets[node].admit(fake_pod(stored, GPU))
        except AdmissionError as err:
            self.apiserver.set_phase(stored["metadata"]["namespace"], name, "Failed")
            return Outcome(name, node, pending=f"kubelet refused it: {err}")
        self.apiserver.set_phase(stored["metadata"]["namespace"], name, "Running")  # as kubelet reports it
        return Outcome(name, node, {c: admitted.env(c) for c in admitted.answers})

    async def use_extender(self, url: str, pki: ExtenderPki) -> None:
        """Call the extender at ``url`` as kube-scheduler does: with its client certificate."""
        self.extender = url
        connector = aiohttp.TCPConnector(ssl=pki.client())
        self._http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=15))

    async def pod_uid(self, namespace: str, name: str) -> str:
        return str(self.apiserver.pod(namespace, name)["metadata"]["uid"])

    async def delete(self, namespace: str, name: str) -> None:
        """The pod is deleted: its node's kubelet stops it, the API server forgets it."""
        pod = self.apiserver.pod(namespace, name)
        self.apiserver.delete_pod(namespace, name)
        node = pod.get("spec", {}).get("nodeName", "")
        if node in self.kubelets:
            self.kubelets[node].remove(fake_pod(pod, GPU))

    async def _schedule(self, pod: dict[str, Any], names: list[str]) -> tuple[str, str]:
        found = await self._post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        if found.get("Error"):
            return "", f"extender error: {found['Error']}"
        fits = found.get("NodeNames") or []
        if not fits:
            failed = {**(found.get("FailedNodes") or {}), **(found.get("FailedAndUnresolvableNodes") or {})}
            return "", "; ".join(f"{n}: {why}" for n, why in sorted(failed.items())) or "no node fits"
        best = fits[0]
        if len(fits) > 1:
            scores = await self._post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": fits})
            best = max(scores, key=lambda s: s["Score"])["Host"]
        meta = pod["metadata"]
        bound = await self._post(
            "bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": best}
        )
        if bound.get("Error"):
            return "", f"bind failed: {bound['Error']}"
        return best, ""

    async def _post(self, verb: str, body: Any) -> Any:
        assert self._http is not None, "start() first"
        async with self._http.post(f"{self.extender}/{verb}", json=body) as reply:
            if reply.status != 200:
                return {"Error": f"HTTP {reply.status}: {await reply.text()}"}
            return await reply.json()
