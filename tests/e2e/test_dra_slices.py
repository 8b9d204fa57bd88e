"""DRA mode on the real API server: the inventory (fake NVML fleet) publishes its node's
ResourceSlices, the API server keeps them as sent, a health change bumps the pool generation with
the card tainted, an API server with a gate off is caught dropping fields, and the real
kube-scheduler allocates a ResourceClaim against the slices on a kwok node."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from gpuledger_common.natsserver import NatsServer, embedded_nats
from gpuledger_inventory.app import Running, serve
from gpuledger_inventory.publisher import SlicePublisher
from gpuledger_inventory.settings import Settings
from gpuledger_inventory.slices import DRIVER, differences, manifest
from gpuledger_testing.controlplane.api import ApiError, KubeApi
from gpuledger_testing.controlplane.cluster import ControlPlane, plain_scheduler_config
from gpuledger_testing.waiting import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="session")]

DEVICE_CLASS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "dra" / "deviceclass.yaml"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "20"}
SCHEDULER = "gpuledger-dra-e2e"


@dataclass
class DraNode:
    name: str
    api: KubeApi
    running: Running

    @property
    def publisher(self) -> SlicePublisher:
        assert self.running.inventory.slices is not None
        return self.running.inventory.slices

    async def slices(self) -> list[dict[str, Any]]:
        found = await self.api.get(SLICES, fieldSelector=f"spec.nodeName={self.name},spec.driver={DRIVER}")
        return list(found["items"])


@pytest_asyncio.fixture(loop_scope="session")
async def nats() -> AsyncIterator[NatsServer]:
    async with embedded_nats() as server:
        yield server


@contextlib.asynccontextmanager
async def dra_node(cp: ControlPlane, nats: NatsServer, profile: str = "h100-sxm-8") -> AsyncIterator[DraNode]:
    """A kwok node and its inventory in DRA mode on the fake NVML (the fleet file's one node)."""
    assert cp.access is not None and cp.admin_kubeconfig is not None
    name = f"dra-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="gl-dra-"))
    fleet = work / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"nodes": [{"name": name, "profile": profile}]}))
    settings = Settings(
        node=name, nats_url=nats.url, fake_fleet=str(fleet), kube="on", kubeconfig=str(cp.admin_kubeconfig),
        mode="dra", http_host="127.0.0.1", http_port=0, event_wait_ms=50, heartbeat_interval_s=1.0,
    )
    async with KubeApi(cp.access) as api:
        body = {"metadata": {"name": name}, "status": {"capacity": CAPACITY, "allocatable": CAPACITY}}
        await api.create("/api/v1/nodes", body)
        stop = asyncio.Event()
        started: asyncio.Future[Running] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(serve(settings, stop=stop, on_started=started.set_result))
        try:
            running = await asyncio.wait_for(asyncio.shield(started), 30)
            yield DraNode(name, api, running)
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


async def test_the_api_server_keeps_the_slices_as_the_inventory_wrote_them(
    control_plane: ControlPlane, nats: NatsServer
) -> None:
    async with dra_node(control_plane, nats) as node:
        (found,) = await published(node)
        wanted = node.publisher.wanted()
        assert wanted is not None
        sent = manifest(wanted, 0, 1)
        assert differences(sent["spec"], found["spec"]) == []
        assert differences(found["spec"], sent["spec"]) == []
        assert found["spec"]["pool"] == {"name": node.name, "generation": 1, "resourceSliceCount": 1}
        assert found["metadata"]["ownerReferences"][0]["kind"] == "Node"
        devices = found["spec"]["devices"]
        assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
        first = devices[0]
        assert first["allowMultipleAllocations"] is True
        assert first["capacity"]["memory"]["requestPolicy"]["validRange"] == {"min": "256Mi", "step": "256Mi"}
        assert first["attributes"]["productFamily"] == {"string": "hopper"}
        assert {d["attributes"]["nvlinkGroup8"]["int"] for d in devices} == {0}  # NVSwitch: one island
        assert node.publisher.last_error == ""
        # Nothing changed: a second poke writes nothing.
        node.publisher.poke()
        await asyncio.sleep(0.5)
        (again,) = await node.slices()
        assert again["metadata"]["resourceVersion"] == found["metadata"]["resourceVersion"]


async def test_an_unhealthy_card_bumps_the_generation_and_is_tainted_not_removed(
    control_plane: ControlPlane, nats: NatsServer
) -> None:
    async with dra_node(control_plane, nats) as node:
        await published(node)
        answer = await node.running.inventory.set_health({"index": 3, "healthy": False, "by": "e2e", "note": "bad"})
        assert answer["changed"]
        (found,) = await published(node, 2)
        devices = {d["name"]: d for d in found["spec"]["devices"]}
        assert len(devices) == 8
        (taint,) = devices["gpu-3"]["taints"]
        assert taint["key"] == "gpu.gpuledger.io/unhealthy" and taint["effect"] == "NoSchedule"
        assert "timeAdded" in taint
        assert all("taints" not in d for n, d in devices.items() if n != "gpu-3")
        await node.running.inventory.set_health({"index": 3, "healthy": True, "by": "e2e"})
        (healed,) = await published(node, 3)
        assert all("taints" not in d for d in healed["spec"]["devices"])


async def test_an_api_server_that_drops_a_field_is_an_error_naming_it(nats: NatsServer) -> None:
    """With DRAConsumableCapacity off, kube-apiserver 1.36 drops allowMultipleAllocations and the
    capacities' requestPolicy on write, without an error (resourceslice strategy.go)."""
    workdir = Path(tempfile.mkdtemp(prefix="gl-cp-gate-"))
    cp = ControlPlane(workdir, controllers=(), feature_gates={"DRAConsumableCapacity": False})
    await asyncio.to_thread(cp.__enter__)
    try:
        async with dra_node(cp, nats, "rtx3090-1") as node:

            async def failed() -> str | None:
                return node.publisher.last_error or None

            error = await wait_for(failed, 30, "the publisher's error", 0.1)
            assert "spec.devices[0].allowMultipleAllocations" in error
            assert "spec.devices[0].capacity.memory.requestPolicy" in error
            assert "DRAConsumableCapacity" in error
            assert node.publisher.generation == 0  # never counted as written
    finally:
        await asyncio.to_thread(cp.stop)


async def test_kube_scheduler_allocates_a_claim_from_the_slices(
    control_plane: ControlPlane, nats: NatsServer
) -> None:
    await asyncio.to_thread(control_plane.start_scheduler, SCHEDULER, plain_scheduler_config(SCHEDULER))
    async with dra_node(control_plane, nats) as node:
        await published(node)
        api, ns = node.api, node.name
        with contextlib.suppress(ApiError):
            await api.create("/apis/resource.k8s.io/v1/deviceclasses", yaml.safe_load(DEVICE_CLASS.read_text()))
        await api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        try:
            request = {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": DRIVER,
                    "capacity": {"requests": {"memory": "10Gi", "compute": "25"}},
                },
            }
            claim = {"metadata": {"name": "share"}, "spec": {"devices": {"requests": [request]}}}
            await api.create(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim)
            await api.create(f"/api/v1/namespaces/{ns}/pods", _pod("app", node.name, "share"))

            async def allocated() -> dict[str, Any] | None:
                found = await api.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/share")
                return found if found.get("status", {}).get("allocation") else None

            found = await wait_for(allocated, 60, "the claim allocated", 0.2)
            (result,) = found["status"]["allocation"]["devices"]["results"]
            assert (result["driver"], result["pool"], result["device"]) == (DRIVER, node.name, "gpu-0")
            assert result["consumedCapacity"] == {"memory": "10Gi", "compute": "25", "slots": "1"}
            assert result.get("shareID")
            pod = await api.get(f"/api/v1/namespaces/{ns}/pods/app")
            reserved = found["status"].get("reservedFor", [])
            assert any(r.get("uid") == pod["metadata"]["uid"] for r in reserved), reserved
        finally:
            with contextlib.suppress(ApiError):
                await api.call("DELETE", f"/api/v1/namespaces/{ns}/pods", params={"gracePeriodSeconds": "0"})
            with contextlib.suppress(ApiError):
                await api.delete(f"/api/v1/namespaces/{ns}")


def _pod(name: str, node: str, claim: str) -> dict[str, Any]:
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
