"""What the DRA e2e tests share: a kwok node with its inventory in DRA mode (fake NVML) on a real
control plane, waiting for its slices, and pods that use a ResourceClaim."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuledger_dev.controlplane.api import ApiError, KubeApi
from gpuledger_dev.controlplane.cluster import KWOK_NODE_LABEL, ControlPlane
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.app import Running, build_gpus, serve
from gpuledger_inventory.kube import SliceApi
from gpuledger_inventory.publisher import SlicePublisher
from gpuledger_inventory.settings import InventorySettings
from gpuledger_inventory.slices import DRIVER
from tests.support.waiting import wait_for

DEVICE_CLASS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "dra" / "deviceclass.yaml"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "20"}
SCHEDULER = "gpuledger-dra-e2e"


@dataclass
class DraNode:
    name: str
    api: KubeApi
    running: Running
    nvml: Any = None  # its fake NVML, where a test injects faults

    @property
    def publisher(self) -> SlicePublisher:
        assert self.running.inventory.slices is not None
        return self.running.inventory.slices

    async def slices(self) -> list[dict[str, Any]]:
        found = await self.api.get(SLICES, fieldSelector=f"spec.nodeName={self.name},spec.driver={DRIVER}")
        return list(found["items"])


@contextlib.asynccontextmanager
async def dra_node(
    cp: ControlPlane,
    nats: NatsServer,
    profile: str = "h100-sxm-8",
    pods: int = 20,
    slice_api: SliceApi | None = None,
    **overrides: Any,
) -> AsyncIterator[DraNode]:
    """A kwok node (room for ``pods`` pods) and its inventory in DRA mode on the fake NVML (the fleet
    file's one node); ``overrides``: more of the inventory's settings; ``slice_api``: the
    inventory's way to the ResourceSlices (the real API server's, from the settings, by default)."""
    assert cp.access is not None and cp.admin_kubeconfig is not None
    name = f"dra-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="gl-dra-"))
    fleet = work / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"nodes": [{"name": name, "profile": profile}]}))
    settings = InventorySettings(
        node=name,
        nats_url=nats.url,
        fake_fleet=str(fleet),
        kube="kubeconfig",
        kubeconfig=str(cp.admin_kubeconfig),
        mode="dra",
        http_host="127.0.0.1",
        http_port=0,
        event_wait_ms=50,
        heartbeat_interval_s=1.0,
        **overrides,
    )
    async with KubeApi(cp.access) as api:
        capacity = {**CAPACITY, "pods": str(pods)}
        meta = {"name": name, "labels": dict([KWOK_NODE_LABEL])}  # kwok plays it
        body = {"metadata": meta, "status": {"capacity": capacity, "allocatable": capacity}}
        await api.create("/api/v1/nodes", body)
        stop = asyncio.Event()
        started: asyncio.Future[Running] = asyncio.get_running_loop().create_future()
        gpus, host = build_gpus(settings)
        serving = serve(settings, gpus=gpus, host=host, slice_api=slice_api, stop=stop, on_started=started.set_result)
        task = asyncio.create_task(serving)
        try:
            running = await asyncio.wait_for(asyncio.shield(started), 30)
            yield DraNode(name, api, running, getattr(gpus, "nvml", None))
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
            with contextlib.suppress(ApiError):
                await api.delete(f"/api/v1/nodes/{name}")  # its slices go with it (ownerReferences)


async def published(node: DraNode, generation: int = 1, timeout: float = 30) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]] | None:
        found = await node.slices()
        ok = found and all(s["spec"]["pool"]["generation"] == generation for s in found)
        return found if ok and node.publisher.generation == generation else None

    return await wait_for(check, timeout, f"the slices of {node.name} at generation {generation}", 0.1)


CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"


async def ensure_device_class(api: KubeApi) -> None:
    """The DeviceClasses of deploy/kubernetes/dra, created as shipped (409: another test made them)."""
    for body in yaml.safe_load_all(DEVICE_CLASS.read_text()):
        try:
            await api.create("/apis/resource.k8s.io/v1/deviceclasses", body)
        except ApiError as err:
            if err.status != 409:
                raise


def claimed_pod(name: str, claim: str, priority_class: str) -> dict[str, Any]:
    """A pod of the claim with a priority class (labelled ``tier: <class>``), on no node named:
    kube-scheduler binds it where its claim is allocated."""
    body = claim_pod(name, "", claim)
    del body["spec"]["affinity"]
    body["spec"]["priorityClassName"] = priority_class
    body["metadata"]["labels"] = {"tier": priority_class}
    return body


def share_claim(name: str, memory: str = "10Gi", compute: str = "25") -> dict[str, Any]:
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": memory, "compute": compute}}},
    }
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}


async def allocated_claim(api: KubeApi, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    """The claim once kube-scheduler allocated it and reserved it for a pod."""

    async def check() -> dict[str, Any] | None:
        found = await api.get(f"{CLAIMS.format(ns=ns)}/{name}")
        status = found.get("status", {})
        return found if status.get("allocation") and status.get("reservedFor") else None

    return dict(await wait_for(check, timeout, f"claim {ns}/{name} allocated and reserved", 0.2))


@contextlib.asynccontextmanager
async def namespace(api: KubeApi, name: str) -> AsyncIterator[str]:
    await api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiError):
            await api.call("DELETE", f"/api/v1/namespaces/{name}/pods", params={"gracePeriodSeconds": "0"})
        with contextlib.suppress(ApiError):
            await api.delete(f"/api/v1/namespaces/{name}")


def claim_pod(name: str, node: str, claim: str) -> dict[str, Any]:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": SCHEDULER,
            "terminationGracePeriodSeconds": 0,
            "affinity": affinity,
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{"name": "app", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
