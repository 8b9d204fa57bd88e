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
from pathlib import Path
from typing import Any

import pytest

from gpuledger_common.kubeconfig import from_file
from gpuledger_core.errors import Unavailable
from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.model import Card, CardMode, Node
from gpuledger_dev.controlplane.api import ApiError, KubeApi
from gpuledger_dev.controlplane.cluster import KWOK_NODE_LABEL, ControlPlane, plain_scheduler_config
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.kube import KubeSliceApi
from gpuledger_inventory.slices import DRIVER, SliceConfig, desired, differences, manifest
from tests.e2e.dra_helpers import (
    CLAIMS,
    SCHEDULER,
    SLICES,
    allocated_claim,
    claim_pod,
    dra_node,
    ensure_device_class,
    namespace,
    published,
    share_claim,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="session")]
MIG_CLASS = "mig.gpu.gpuledger.io"


async def test_the_api_server_keeps_the_slices_as_the_inventory_wrote_them(
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    async with dra_node(control_plane, nats_server) as node:
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
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    async with dra_node(control_plane, nats_server) as node:
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


async def test_slices_deleted_behind_the_inventorys_back_come_back_at_once_and_binding_conditions_are_kept(
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    """kubelet deletes its node's slices when it starts: the inventory's watch of them sees it and
    writes them again, at a later generation, long before a resync would."""
    async with dra_node(
        control_plane, nats_server, "tesla-p4-2", dra_resync_s=600.0, dra_binding_conditions=True
    ) as node:
        (found,) = await published(node)

        async def watching() -> bool:
            return node.publisher.watching

        await wait_for(watching, 30, "the watch of the slices open", 0.05)
        started = asyncio.get_running_loop().time()
        device = found["spec"]["devices"][0]
        assert device["bindingConditions"] == ["gpuledger.io/committed"]
        assert device["bindingFailureConditions"] == ["gpuledger.io/rejected"]
        await node.api.delete(f"{SLICES}/{found['metadata']['name']}")
        (back,) = await published(node, 2)
        assert asyncio.get_running_loop().time() - started < 30
        assert back["metadata"]["uid"] != found["metadata"]["uid"]
        assert back["spec"]["devices"] == found["spec"]["devices"]


class Unwatched(KubeSliceApi):
    """The real API server's slices, with a watch that breaks at once each time it is opened."""

    def watch_slices(self, node: str, driver: str) -> AsyncIterator[dict[str, Any]]:
        return self._broken()

    async def _broken(self) -> AsyncIterator[dict[str, Any]]:
        raise Unavailable("the watch of the slices broke (as the test has it)")
        yield {}  # an async generator


async def test_a_deletion_the_watch_missed_is_mended_by_the_resync(
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    assert control_plane.admin_kubeconfig is not None
    api = Unwatched(await from_file(str(control_plane.admin_kubeconfig)))
    async with dra_node(control_plane, nats_server, "tesla-p4-2", slice_api=api, dra_resync_s=0.5) as node:
        (found,) = await published(node)
        await node.api.delete(f"{SLICES}/{found['metadata']['name']}")
        (back,) = await published(node, 2)
        assert back["metadata"]["uid"] != found["metadata"]["uid"]


async def test_an_api_server_that_drops_a_field_is_an_error_naming_it(nats_server: NatsServer) -> None:
    """With DRAConsumableCapacity off, kube-apiserver 1.36 drops allowMultipleAllocations and the
    capacities' requestPolicy on write, without an error (resourceslice strategy.go)."""
    workdir = Path(tempfile.mkdtemp(prefix="gl-cp-gate-"))
    cp = ControlPlane(workdir, controllers=(), feature_gates={"DRAConsumableCapacity": False})
    await asyncio.to_thread(cp.__enter__)
    try:
        async with dra_node(cp, nats_server, "rtx3090-1") as node:

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
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    await asyncio.to_thread(control_plane.start_scheduler, SCHEDULER, plain_scheduler_config(SCHEDULER))
    async with dra_node(control_plane, nats_server) as node, namespace(node.api, node.name) as ns:
        await published(node)
        api = node.api
        await ensure_device_class(api)
        await api.create(CLAIMS.format(ns=ns), share_claim("share"))
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("app", node.name, "share"))
        found = await allocated_claim(api, ns, "share")
        (result,) = found["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["device"]) == (DRIVER, node.name, "gpu-0")
        assert result["consumedCapacity"] == {"memory": "10Gi", "compute": "25", "slots": "1"}
        assert result.get("shareID")
        pod = await api.get(f"/api/v1/namespaces/{ns}/pods/app")
        assert [r["uid"] for r in found["status"]["reservedFor"]] == [pod["metadata"]["uid"]]


async def test_a_whole_card_claim_takes_a_card_alone_and_a_tainted_card_is_never_allocated(
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    await asyncio.to_thread(control_plane.start_scheduler, SCHEDULER, plain_scheduler_config(SCHEDULER))
    async with dra_node(control_plane, nats_server, "tesla-p4-2") as node, namespace(node.api, node.name) as ns:
        api = node.api
        await published(node)
        await ensure_device_class(api)
        whole = {
            "metadata": {"name": "whole"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        }
        await api.create(CLAIMS.format(ns=ns), whole)
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("whole", node.name, "whole"))
        (taken,) = (await allocated_claim(api, ns, "whole"))["status"]["allocation"]["devices"]["results"]
        assert taken["device"] == "gpu-0"
        assert taken["consumedCapacity"]["memory"] == "7424Mi"  # the whole card: its 7611 MiB in whole 256 MiB steps
        # gpu-0 has no room left: a share goes to gpu-1, which then turns unhealthy.
        await api.create(CLAIMS.format(ns=ns), share_claim("share", "1Gi", "10"))
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("share", node.name, "share"))
        (shared,) = (await allocated_claim(api, ns, "share"))["status"]["allocation"]["devices"]["results"]
        assert shared["device"] == "gpu-1"
        await node.running.inventory.set_health({"index": 1, "healthy": False, "by": "e2e", "note": "XID 79"})
        await published(node, 2)
        await api.create(CLAIMS.format(ns=ns), share_claim("late", "1Gi", "10"))
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("late", node.name, "late"))

        async def unschedulable() -> dict[str, object] | None:
            pod = await api.get(f"/api/v1/namespaces/{ns}/pods/late")
            conditions = pod.get("status", {}).get("conditions", [])
            hit = [c for c in conditions if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"]
            return hit[0] if hit else None

        condition = await wait_for(unschedulable, 60, "the pod refused for want of an untainted card", 0.2)
        late = await api.get(f"{CLAIMS.format(ns=ns)}/late")
        assert not late.get("status", {}).get("allocation"), late["status"]
        assert "cannot allocate all claims" in str(condition.get("message", "")), condition
        # It is the taint that keeps it off gpu-1: a claim that tolerates it gets gpu-1.
        tolerant = share_claim("tolerant", "1Gi", "10")
        toleration = {"key": "gpu.gpuledger.io/unhealthy", "operator": "Exists", "effect": "NoSchedule"}
        tolerant["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [toleration]
        await api.create(CLAIMS.format(ns=ns), tolerant)
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("tolerant", node.name, "tolerant"))
        (result,) = (await allocated_claim(api, ns, "tolerant"))["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-1"


async def test_matchattribute_on_an_nvlink_group_gets_four_mutually_linked_cards(
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    """DGX-1 (hybrid cube mesh): the fully linked quads are 0-3 and 4-7. With gpu-0 taken, four
    cards of one NVLink group can only be 4-7 (first-fit in device order would start at gpu-1)."""
    await asyncio.to_thread(control_plane.start_scheduler, SCHEDULER, plain_scheduler_config(SCHEDULER))
    async with dra_node(control_plane, nats_server, "dgx1-v100") as node, namespace(node.api, node.name) as ns:
        api = node.api
        await published(node)
        await ensure_device_class(api)
        whole = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
        one = {"metadata": {"name": "one"}, "spec": {"devices": {"requests": [whole]}}}
        await api.create(CLAIMS.format(ns=ns), one)
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("one", node.name, "one"))
        (first,) = (await allocated_claim(api, ns, "one"))["status"]["allocation"]["devices"]["results"]
        assert first["device"] == "gpu-0"
        four = {"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": 4}}
        constraint = {"requests": ["gpus"], "matchAttribute": f"{DRIVER}/nvlinkGroup4"}
        spec = {"devices": {"requests": [four], "constraints": [constraint]}}
        await api.create(CLAIMS.format(ns=ns), {"metadata": {"name": "quad"}, "spec": spec})
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("quad", node.name, "quad"))
        results = (await allocated_claim(api, ns, "quad"))["status"]["allocation"]["devices"]["results"]
        assert sorted(r["device"] for r in results) == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]


async def test_mig_placements_pass_validation_and_kube_scheduler_keeps_to_their_counters(
    control_plane: ControlPlane,
) -> None:
    """A card in MIG mode as the inventory publishes it (slices_mig: devices that consume a counter
    set in a counters-only slice) beside a whole card: the API server keeps the slices as sent, the
    shipped classes keep cards and placements apart, a profile named by selector and a memory ask
    are allocated where the counters allow, and a placement the counters no longer allow is not."""
    await asyncio.to_thread(control_plane.start_scheduler, SCHEDULER, plain_scheduler_config(SCHEDULER))
    assert control_plane.access is not None
    name = f"mig-{uuid.uuid4().hex[:6]}"
    cards = (Card(CardUuid("GPU-mig-0"), 0, "NVIDIA A100-SXM4-40GB", 40960, minor=0, mode=CardMode.MIG),
             Card(CardUuid("GPU-mig-1"), 1, "NVIDIA A100-SXM4-40GB", 40960, minor=1))  # fmt: skip
    wanted = desired(Node(NodeName(name), cards), {}, None, SliceConfig())
    async with KubeApi(control_plane.access) as api, namespace(api, name) as ns:
        capacity = {"cpu": "8", "memory": "32Gi", "pods": "20"}
        body = {"metadata": {"name": name, "labels": dict([KWOK_NODE_LABEL])},
                "status": {"capacity": capacity, "allocatable": capacity}}  # fmt: skip
        await api.create("/api/v1/nodes", body)
        try:
            for n in range(wanted.count):
                sent = manifest(wanted, n, 1)
                kept = await api.create(SLICES, sent)
                assert differences(sent["spec"], kept["spec"]) == [], n
            await ensure_device_class(api)

            async def ask(claim: str, request: dict[str, Any]) -> None:
                await api.create(CLAIMS.format(ns=ns), {"metadata": {"name": claim},
                                                       "spec": {"devices": {"requests": [request]}}})  # fmt: skip
                await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod(claim, name, claim))

            def profile(named: str) -> dict[str, Any]:
                selector = {"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "{named}"'}}
                return {"name": "gpu", "exactly": {"deviceClassName": MIG_CLASS, "selectors": [selector]}}

            async def device_of(claim: str) -> str:
                (result,) = (await allocated_claim(api, ns, claim))["status"]["allocation"]["devices"]["results"]
                return str(result["device"])

            await ask("big", profile("4g.20gb"))
            assert await device_of("big") == "gpu-0-mig-4g-20gb-0"
            await ask("half", {"name": "gpu", "exactly": {"deviceClassName": MIG_CLASS,
                                                          "capacity": {"requests": {"memory": "19Gi"}}}})  # fmt: skip
            assert await device_of("half") == "gpu-0-mig-3g-20gb-4"  # the smallest holding 19 GiB, beside the 4g
            await ask("card", {"name": "gpu", "exactly": {"deviceClassName": DRIVER}})
            assert await device_of("card") == "gpu-1"
            await ask("more", profile("1g.5gb"))

            async def unschedulable() -> dict[str, Any] | None:
                pod = await api.get(f"/api/v1/namespaces/{ns}/pods/more")
                hit = [c for c in pod.get("status", {}).get("conditions", [])
                       if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"]  # fmt: skip
                return hit[0] if hit else None

            await wait_for(unschedulable, 60, "the 1g.5gb refused: the card's memory slices are all taken", 0.2)
            more = await api.get(f"{CLAIMS.format(ns=ns)}/more")
            assert not more.get("status", {}).get("allocation"), more["status"]
        finally:
            with contextlib.suppress(ApiError):
                await api.delete(f"/api/v1/nodes/{name}")
            for n in range(wanted.count):
                with contextlib.suppress(ApiError):
                    await api.delete(f"{SLICES}/{manifest(wanted, n, 1)['metadata']['name']}")
