"""The kwok node's kubelet with its DRA side (``gpuledger_dev.kwok_dra``) on the real control
plane, against the real DRA plugin (gpuledger-plugin --mode dra, its ledger check on): the plugin
registers through the registration directory, a pod whose claim kube-scheduler allocated (and the
ledger holds) turns Running only after NodePrepareResources wrote the claim's CDI spec; a claim
the plugin refuses keeps its pod Pending, never Failed, with the reason recorded and as an Event,
until the cause is gone; deleting the pod unprepares the claim; a kubelet restart registers the
plugin again and prepares nothing twice; a claim two pods share is unprepared after the last; a
pod's claim made from a template (by kube-controller-manager) is found through the pod's status and
unprepared when the pod finishes, and an extended resource a DeviceClass serves through the claim
kube-scheduler made for the pod; what a plugin answers is checked (devices allocated to the claim,
every claim answered, every CDI id resolved on disk). And kubelet's plugin watcher alone, against registration sockets
written here: what it refuses and why, the service it picks, a socket that goes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from grpclib.server import Server

from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.controlplane.cluster import ControlPlane, plain_scheduler_config
from gpuledger_dev.kubelet_pods import ADMITTED
from gpuledger_dev.kwok_dra import FAILED_PREPARE, KwokDra
from gpuledger_dev.kwok_dra_claims import V1BETA1, PreparedDevice
from gpuledger_dev.kwok_dra_plugins import PluginWatcher
from gpuledger_dev.kwok_kubelet import KwokDraSettings, KwokKubelet, KwokKubeletSettings
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.slices import DRIVER
from gpuledger_plugin.dra.app import RunningDra, running
from gpuledger_plugin.dra.settings import DraSettings
from gpuledger_proto import pluginregistration as reg
from gpuledger_proto.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from gpuledger_proto.k8s.io.kubelet.pkg.apis.dra import v1beta1 as dra_beta
from tests.e2e.dra_helpers import (
    CLAIMS,
    SCHEDULER,
    DraNode,
    allocated_claim,
    claim_pod,
    dra_node,
    ensure_device_class,
    namespace,
    published,
    share_claim,
)
from tests.e2e.dra_ledger import ledger_of, placement_with_claims
from tests.support.replicas import running_allocator
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="session")]
QUICK = KwokKubeletSettings(backoff_max_s=1.0)
COMPLETE = "gpuledger.io/test-complete"  # kwok's pod-complete Stage: the pod succeeds


@dataclass
class Node:
    """A DRA node: its inventory, namespace, kubelet (with the DRA side) and the plugin's settings."""

    dra_node: DraNode
    ns: str
    kubelet: KwokKubelet
    plugin: DraSettings

    @property
    def dra(self) -> KwokDra:
        assert self.kubelet.dra is not None
        return self.kubelet.dra

    @property
    def api(self) -> KubeApi:
        return self.dra_node.api

    async def claim_pod(self, pod: str, claim: str, memory: str = "2Gi", create_claim: bool = True) -> str:
        if create_claim:
            await self.api.create(CLAIMS.format(ns=self.ns), share_claim(claim, memory, "10"))
        made = await self.api.create(f"/api/v1/namespaces/{self.ns}/pods", claim_pod(pod, self.dra_node.name, claim))
        return str(made["metadata"]["uid"])

    async def get(self, pod: str) -> dict[str, Any]:
        found: dict[str, Any] = await self.api.get(f"/api/v1/namespaces/{self.ns}/pods/{pod}")
        return found

    async def running(self, pod: str, within: float = 30) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            found = await self.get(pod)
            return found if found.get("status", {}).get("phase") == "Running" else None

        return dict(await wait_for(check, within, f"pod {pod} Running", 0.1))

    async def delete(self, pod: str) -> None:
        await self.api.call("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{pod}", params={"gracePeriodSeconds": "0"})

    async def claim_uid(self, claim: str) -> str:
        return str((await self.api.get(f"{CLAIMS.format(ns=self.ns)}/{claim}"))["metadata"]["uid"])

    async def events(self, pod_uid: str) -> list[dict[str, Any]]:
        path, selector = f"/api/v1/namespaces/{self.ns}/events", f"involvedObject.uid={pod_uid}"
        found = await self.api.get(path, fieldSelector=selector)
        return list(found["items"])

    def specs(self) -> dict[str, dict[str, Any]]:
        """The CDI specs in the plugin's cdi_dir, by file name."""
        return {p.name: json.loads(p.read_text()) for p in Path(self.plugin.cdi_dir).glob("*.json")}

    def spec_ids(self) -> set[str]:
        return {f"{s['kind']}={d['name']}" for s in self.specs().values() for d in s["devices"]}


@contextlib.asynccontextmanager
async def dra_kubelet_node(
    cp: ControlPlane,
    server: NatsServer,
    binding_conditions: bool,
    wipe_slices: bool = False,
    wipe_delay_s: float = 30.0,
    **inventory: Any,
) -> AsyncIterator[Node]:
    """A kwok node in DRA mode with the kubelet and its DRA side running (the plugin is not);
    ``inventory``: more of the inventory's settings."""
    assert cp.access is not None
    await asyncio.to_thread(cp.start_scheduler, SCHEDULER, plain_scheduler_config(SCHEDULER))
    work = Path(tempfile.mkdtemp(prefix="gl-dk-", dir="/tmp"))  # unix socket paths must stay short
    node_cm = dra_node(cp, server, inventory_interval_s=1.0, dra_binding_conditions=binding_conditions, **inventory)
    try:
        async with node_cm as node, namespace(node.api, node.name) as ns:
            await published(node)
            await ensure_device_class(node.api)
            plugin = DraSettings(
                node=node.name, registry_dir=str(work / "reg"), plugin_dir=str(work / "plugins"),
                cdi_dir=str(work / "cdi"), kubeconfig=str(cp.admin_kubeconfig), http_host="127.0.0.1", http_port=0,
                socket_poll_s=0.05, nats_url=server.url,
            )  # fmt: skip
            dra = KwokDraSettings(
                plugin.registry_dir, plugin.cdi_dir, poll_s=0.05, wipe_slices=wipe_slices, wipe_delay_s=wipe_delay_s
            )
            async with KwokKubelet(node.name, work / "dp", work / "pr.sock", cp.access, QUICK, dra) as kubelet:
                yield Node(node, ns, kubelet, plugin)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def admin_kubeconfig(cp: ControlPlane) -> Path:
    """Placement with its claims controller runs as the admin here: the RBAC is test_dra_claims.py's."""
    assert cp.admin_kubeconfig is not None
    return cp.admin_kubeconfig


async def registered(node: Node, plugin: RunningDra, n: int = 1) -> None:
    await node.kubelet.wait_for(lambda k: node.dra.registrations >= n and DRIVER in node.dra.plugins, 15)
    await wait_for(lambda: _set(plugin.registration.registered), 5, "the plugin told it is registered", 0.05)


async def _set(event: asyncio.Event) -> bool:
    return event.is_set()


async def slice_uids(node: Node) -> set[str]:
    return {s["metadata"]["uid"] for s in await node.dra_node.slices()}


async def _new_slices(node: Node, before: set[str]) -> bool:
    now = await slice_uids(node)
    return bool(now) and not now & before


def failed_with(node: Node, pod_uid: str, text: str) -> Callable[[KwokKubelet], bool]:
    return lambda _: text in node.dra.failures.get(pod_uid, "")


def conditions(pod: dict[str, Any]) -> set[str]:
    return {c["type"] for c in pod.get("status", {}).get("conditions") or [] if c.get("status") == "True"}


async def test_a_pod_runs_only_after_its_committed_claim_was_prepared_and_deleting_it_unprepares(
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    async with (
        running_allocator(nats_server.url),
        placement_with_claims(nats_server, admin_kubeconfig(control_plane)),
        dra_kubelet_node(control_plane, nats_server, binding_conditions=True) as node,
    ):
        await wait_for(lambda: ledger_of(nats_server, node.dra_node.name), 30, "the node in the ledger", 0.2)
        pod_uid = await node.claim_pod("app", "gpu")
        # Bound once the ledger committed the claim (PreBind), then held: no plugin has registered.
        await node.kubelet.wait_for(lambda k: "not registered" in node.dra.failures.get(pod_uid, ""), 40)
        assert node.dra.failures[pod_uid] == "prepare dynamic resources: DRA driver gpu.gpuledger.io is not registered"
        pod = await node.get("app")
        assert pod["spec"]["nodeName"] == node.dra_node.name and pod["status"]["phase"] == "Pending"
        assert ADMITTED not in conditions(pod) and not node.dra.prepare_calls

        async with running(node.plugin) as plugin:
            await registered(node, plugin)
            pod = await node.running("app")
            claim_uid = await node.claim_uid("gpu")
            assert node.dra.prepare_calls == [(claim_uid,)] and pod_uid not in node.dra.failures
            (cdi_id,) = node.dra.cdi_ids(pod, "app")
            assert cdi_id.startswith(f"k8s.gpu.gpuledger.io/claim={claim_uid}-gpu-")
            assert node.spec_ids() == {cdi_id}  # the spec the plugin wrote resolves it
            (event,) = [e for e in await node.events(pod_uid) if e["reason"] == FAILED_PREPARE]
            assert event["type"] == "Warning" and event["message"] == (
                "Failed to prepare dynamic resources: prepare dynamic resources:"
                " DRA driver gpu.gpuledger.io is not registered"
            )

            await node.delete("app")
            await node.kubelet.wait_for(lambda k: not node.dra.claims, 30)
            assert node.dra.unprepare_calls == [(claim_uid,)]
            assert node.specs() == {}


async def test_a_claim_the_plugin_refuses_keeps_its_pod_pending_until_the_ledger_holds_it(
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    # The allocator keeps the node's ledger; no claims controller records the claim in it (yet).
    async with (
        running_allocator(nats_server.url),
        dra_kubelet_node(control_plane, nats_server, binding_conditions=False) as node,
    ):
        await wait_for(lambda: ledger_of(nats_server, node.dra_node.name), 30, "the node in the ledger", 0.2)
        async with running(node.plugin) as plugin:
            await registered(node, plugin)
            pod_uid = await node.claim_pod("app", "gpu")
            await node.kubelet.wait_for(lambda k: node.dra.attempts.get(pod_uid, 0) >= 3, 30)
            failure = node.dra.failures[pod_uid]
            assert failure.startswith("prepare dynamic resources: NodePrepareResources failed for ResourceClaim gpu: ")
            assert "holds no entry for it" in failure, failure
            pod = await node.get("app")
            assert pod["status"]["phase"] == "Pending" and ADMITTED not in conditions(pod)
            assert node.specs() == {}
            (event,) = [e for e in await node.events(pod_uid) if e["reason"] == FAILED_PREPARE]
            assert event["message"] == f"Failed to prepare dynamic resources: {failure}"

            async with placement_with_claims(
                nats_server, admin_kubeconfig(control_plane)
            ):  # the controller mirrors the claim: prepared
                pod = await node.running("app", within=40)
            assert pod_uid not in node.dra.failures and len(node.dra.prepare_calls) >= 3
            assert node.spec_ids() == set(node.dra.cdi_ids(pod, "app"))


async def test_a_restart_registers_again_prepares_nothing_twice_and_a_shared_claim_goes_with_its_last_pod(
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    # kubelet deletes the node's slices at every start and a driver's a while after its plugin went;
    # the inventory reads them back every second.
    node_cm = dra_kubelet_node(
        control_plane, nats_server, binding_conditions=False, wipe_slices=True, wipe_delay_s=0.5, dra_resync_s=1.0
    )
    async with (
        running_allocator(nats_server.url),
        placement_with_claims(nats_server, admin_kubeconfig(control_plane)),
        node_cm as node,
    ):
        await wait_for(lambda: ledger_of(nats_server, node.dra_node.name), 30, "the node in the ledger", 0.2)
        await node.kubelet.wait_for(lambda k: node.dra.wipes == 1, 15)
        before = await wait_for(lambda: slice_uids(node), 15, "the slices published again", 0.1)
        async with running(node.plugin) as plugin:
            await registered(node, plugin)
            first = await node.claim_pod("first", "one")
            await node.running("first")
            one = await node.claim_uid("one")
            calls = [c for c in node.dra.prepare_calls if c == (one,)]
            assert calls, node.dra.prepare_calls

            await node.kubelet.restart()
            await registered(node, plugin, 2)
            await node.kubelet.wait_for(lambda k: k.lists >= 2 and node.dra.wipes == 2)
            assert node.dra.registrations == 2 and node.kubelet.restarts == 1
            await wait_for(lambda: _new_slices(node, before), 15, "the slices deleted and published again", 0.1)
            assert node.dra.claims[(node.ns, "one")].pods == {first}  # the checkpoint kept its user

            second = await node.claim_pod("second", "two")
            await node.running("second")
            third = await node.claim_pod("third", "two", create_claim=False)  # shares claim "two"
            await node.running("third")
            two = await node.claim_uid("two")
            assert [c for c in node.dra.prepare_calls if c == (one,)] == calls  # "one" not prepared again
            assert [c for c in node.dra.prepare_calls if c == (two,)], node.dra.prepare_calls
            assert node.dra.claims[(node.ns, "two")].pods == {second, third}
            assert len(node.specs()) == 2

            await node.delete("first")  # prepared before the restart, unprepared after it
            await node.kubelet.wait_for(lambda k: (node.ns, "one") not in node.dra.claims, 30)
            await node.delete("second")
            await node.kubelet.wait_for(lambda k: second not in node.dra.users(), 30)
            assert (one,) in node.dra.unprepare_calls and (two,) not in node.dra.unprepare_calls
            assert len(node.specs()) == 1  # "third" still uses "two"
            await node.delete("third")
            await node.kubelet.wait_for(lambda k: not node.dra.claims, 30)
            assert node.specs() == {}
            before = await slice_uids(node)
        # The plugin is gone: its registration socket too, so the kubelet deregisters it and then
        # deletes the driver's slices.
        await node.kubelet.wait_for(lambda k: DRIVER not in node.dra.plugins and node.dra.wipes == 3, 15)
        await wait_for(lambda: _new_slices(node, before), 15, "the driver's slices deleted and published again", 0.1)


async def test_a_claim_from_a_template_is_prepared_for_its_pod_and_unprepared_when_the_pod_finishes(
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    async with (
        running_allocator(nats_server.url),
        placement_with_claims(nats_server, admin_kubeconfig(control_plane)),
        dra_kubelet_node(control_plane, nats_server, binding_conditions=False) as node,
    ):
        await wait_for(lambda: ledger_of(nats_server, node.dra_node.name), 30, "the node in the ledger", 0.2)
        template = {"metadata": {"name": "gpu"}, "spec": {"spec": share_claim("unused", "1Gi", "5")["spec"]}}
        await node.api.create(f"/apis/resource.k8s.io/v1/namespaces/{node.ns}/resourceclaimtemplates", template)
        body = claim_pod("job", node.dra_node.name, "unused")
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
        async with running(node.plugin) as plugin:
            await registered(node, plugin)
            made = await node.api.create(f"/api/v1/namespaces/{node.ns}/pods", body)
            pod = await node.running("job")
            (status,) = pod["status"]["resourceClaimStatuses"]
            generated = status["resourceClaimName"]
            info = node.dra.claims[(node.ns, generated)]
            assert info.prepared and info.pods == {made["metadata"]["uid"]}
            assert node.spec_ids() == set(node.dra.cdi_ids(pod, "app")) and len(node.spec_ids()) == 1

            await node.api.patch(
                f"/api/v1/namespaces/{node.ns}/pods/job", {"metadata": {"annotations": {COMPLETE: "true"}}}
            )
            await node.kubelet.wait_for(lambda k: not node.dra.claims, 30)
            assert (await node.get("job"))["status"]["phase"] == "Succeeded"
            assert node.dra.unprepare_calls == [(info.uid,)] and node.specs() == {}


async def test_an_extended_resource_served_by_a_device_class_is_prepared_through_the_pods_special_claim(
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    async with (
        running_allocator(nats_server.url),
        placement_with_claims(nats_server, admin_kubeconfig(control_plane)),
        dra_kubelet_node(control_plane, nats_server, binding_conditions=False) as node,
    ):
        await wait_for(lambda: ledger_of(nats_server, node.dra_node.name), 30, "the node in the ledger", 0.2)
        resource = f"{node.dra_node.name}.example.com/gpu"  # the node advertises none: DRA serves it
        class_name = f"{node.dra_node.name}.example.com"
        device_class = {
            "metadata": {"name": class_name},
            "spec": {
                "extendedResourceName": resource,
                "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
            },
        }
        await node.api.create("/apis/resource.k8s.io/v1/deviceclasses", device_class)
        try:
            body = claim_pod("ext", node.dra_node.name, "unused")
            del body["spec"]["resourceClaims"]
            body["spec"]["containers"] = [{"name": "app", "image": "cuda", "resources": {"limits": {resource: "1"}}}]
            async with running(node.plugin) as plugin:
                await registered(node, plugin)
                made = await node.api.create(f"/api/v1/namespaces/{node.ns}/pods", body)
                pod = await node.running("ext")
                special = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
                info = node.dra.claims[(node.ns, special)]
                assert info.prepared and info.pods == {made["metadata"]["uid"]}
                (cdi_id,) = node.dra.cdi_ids(pod, "app")
                assert node.spec_ids() == {cdi_id}
                await node.delete("ext")
                await node.kubelet.wait_for(lambda k: not node.dra.claims, 30)
                assert node.specs() == {}
        finally:
            await node.api.delete(f"/apis/resource.k8s.io/v1/deviceclasses/{class_name}")


class FakeRegistration(reg.RegistrationBase):  # type: ignore[misc]
    def __init__(self, info: reg.PluginInfo) -> None:
        self.info, self.statuses, self.asked = info, list[reg.RegistrationStatus](), 0

    async def get_info(self, request: reg.InfoRequest) -> reg.PluginInfo:
        self.asked += 1
        return self.info

    async def notify_registration_status(self, status: reg.RegistrationStatus) -> reg.RegistrationStatusResponse:
        self.statuses.append(status)
        return reg.RegistrationStatusResponse()


class OldPlugin(dra_beta.DraPluginBase):  # type: ignore[misc]
    """A v1beta1-only DRA plugin: one device per claim."""

    async def node_prepare_resources(
        self, request: dra_beta.NodePrepareResourcesRequest
    ) -> dra_beta.NodePrepareResourcesResponse:
        device = dra_beta.Device(["gpu"], "pool", "gpu-0", ["example.com/gpu=0"])
        answers = {c.uid: dra_beta.NodePrepareResourceResponse(devices=[device]) for c in request.claims}
        return dra_beta.NodePrepareResourcesResponse(claims=answers)


async def test_the_plugin_watcher_refuses_what_kubelet_refuses_and_speaks_the_service_it_chose() -> None:
    work = Path(tempfile.mkdtemp(prefix="gl-pw-", dir="/tmp"))
    registry = work / "reg"
    registry.mkdir()
    plugins = {
        ".hidden.sock": reg.PluginInfo("DRAPlugin", "hidden.example.com", "", [V1BETA1]),
        "csi.sock": reg.PluginInfo("CSIPlugin", "csi.example.com", "", ["1.0.0"]),
        "future.sock": reg.PluginInfo("DRAPlugin", "future.example.com", "", ["v1alpha3.DRAPlugin"]),
        "old.sock": reg.PluginInfo("DRAPlugin", "old.example.com", str(work / "old.dra"), [V1BETA1, "v1.DRAPlugin"]),
    }  # fmt: skip
    fakes = {name: FakeRegistration(info) for name, info in plugins.items()}
    servers = [Server([fake]) for fake in fakes.values()] + [Server([OldPlugin()])]
    watcher = PluginWatcher(KwokDraSettings(str(registry), str(work / "cdi"), poll_s=0.02, retry_s=60), lambda: None)
    try:
        for server, name in zip(servers, [*plugins, "../old.dra"], strict=True):
            await server.start(path=str(registry / name))
        async with asyncio.TaskGroup() as group:
            watching = group.create_task(watcher.run())
            await wait_for(lambda: _registered(watcher, "old.example.com"), 10, "the old plugin registered", 0.02)
            await wait_for(lambda: _at_least(fakes["future.sock"].statuses, 1), 10, "the refusals told", 0.02)
            assert set(watcher.plugins) == {"old.example.com"} and watcher.registrations == 1
            old = watcher.plugins["old.example.com"]
            assert (old.service, old.endpoint) == (V1BETA1, str(work / "old.dra"))
            assert fakes[".hidden.sock"].asked == 0
            assert fakes["old.sock"].statuses == [reg.RegistrationStatus(plugin_registered=True)]
            (csi,) = fakes["csi.sock"].statuses
            assert not csi.plugin_registered and csi.error == (
                "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket"
                f" {registry}/csi.sock"
            )
            (future,) = fakes["future.sock"].statuses
            assert not future.plugin_registered
            refused = "RegisterPlugin error -- plugin validation failed with err: none of services supported"
            assert future.error.startswith(refused)
            assert sorted(watcher.refusals) == sorted([csi.error, future.error])

            answers = await old.prepare([("ns", "claim-1", "c")])  # over v1beta1: no share id
            assert answers["claim-1"].error == "" and answers["claim-1"].devices == (
                PreparedDevice(("gpu",), "pool", "gpu-0", ("example.com/gpu=0",)),
            )
            (registry / "old.sock").unlink()  # the plugin's socket goes: it is deregistered
            await wait_for(lambda: _registered(watcher, "old.example.com", False), 10, "deregistered", 0.02)
            watching.cancel()
    finally:
        watcher.forget()
        for server in servers:
            server.close()
            await server.wait_closed()
        shutil.rmtree(work, ignore_errors=True)


async def _registered(watcher: PluginWatcher, driver: str, wanted: bool = True) -> bool:
    return (driver in watcher.plugins) == wanted


async def _at_least(items: list[Any], n: int) -> bool:
    return len(items) >= n


class AnsweringPlugin(dra_v1.DraPluginBase):  # type: ignore[misc]
    """A DRA plugin of our driver written here, answering as ``mode`` says, for the claim's
    allocated ``device`` (pool, device, share id); ``good`` writes a CDI spec first."""

    def __init__(self, cdi_dir: Path) -> None:
        self.cdi_dir, self.mode, self.device = cdi_dir, "not yet", ("", "", "")
        self.unprepared: list[str] = []

    async def node_prepare_resources(
        self, request: dra_v1.NodePrepareResourcesRequest
    ) -> dra_v1.NodePrepareResourcesResponse:
        if self.mode == "skip":
            return dra_v1.NodePrepareResourcesResponse(claims={})
        answers = {c.uid: self._answer(c.uid) for c in request.claims}
        return dra_v1.NodePrepareResourcesResponse(claims=answers)

    def _answer(self, claim_uid: str) -> dra_v1.NodePrepareResourceResponse:
        pool, device, share = self.device
        name = f"{claim_uid}-{device}"
        if self.mode == "foreign":
            device = "gpu-7"
        elif self.mode == "good":
            spec = {"cdiVersion": "0.3.0", "kind": "example.com/claim", "devices": [{"name": name}]}
            self.cdi_dir.mkdir(parents=True, exist_ok=True)
            (self.cdi_dir / f"example.com-claim_{claim_uid}.json").write_text(json.dumps(spec))
        elif self.mode == "not yet":
            return dra_v1.NodePrepareResourceResponse(error="not yet")
        answer = dra_v1.Device(["gpu"], pool, device, [f"example.com/claim={name}"], share or None)
        return dra_v1.NodePrepareResourceResponse(devices=[answer])

    async def node_unprepare_resources(
        self, request: dra_v1.NodeUnprepareResourcesRequest
    ) -> dra_v1.NodeUnprepareResourcesResponse:
        for claim in request.claims:
            self.unprepared.append(claim.uid)
            (self.cdi_dir / f"example.com-claim_{claim.uid}.json").unlink(missing_ok=True)
        return dra_v1.NodeUnprepareResourcesResponse(
            claims={c.uid: dra_v1.NodeUnprepareResourceResponse() for c in request.claims}
        )


async def test_what_a_plugin_answers_is_checked_before_the_pod_may_run(
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    async with dra_kubelet_node(control_plane, nats_server, binding_conditions=False) as node:
        registry, cdi_dir = Path(node.plugin.registry_dir), Path(node.plugin.cdi_dir)
        endpoint = str(registry.parent / "answering.sock")
        info = reg.PluginInfo("DRAPlugin", DRIVER, endpoint, ["v1.DRAPlugin"])
        plugin = AnsweringPlugin(cdi_dir)
        servers = [Server([FakeRegistration(info)]), Server([plugin])]
        await asyncio.to_thread(registry.mkdir, parents=True, exist_ok=True)
        await servers[0].start(path=str(registry / f"{DRIVER}-reg.sock"))
        await servers[1].start(path=endpoint)
        try:
            await node.kubelet.wait_for(lambda k: DRIVER in node.dra.plugins, 15)
            pod_uid = await node.claim_pod("app", "gpu")
            claim = await allocated_claim(node.api, node.ns, "gpu")
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            plugin.device = (result["pool"], result["device"], result.get("shareID", ""))
            failures = {
                "skip": "NodePrepareResources skipped 1 ResourceClaims",
                "foreign": f"NodePrepareResources gave gpu devices not allocated to it: ['{result['pool']}/gpu-7 ",
                "unresolvable": f"unresolvable CDI devices example.com/claim={claim['metadata']['uid']}-",
            }
            for mode, expected in failures.items():
                plugin.mode = mode
                await node.kubelet.wait_for(failed_with(node, pod_uid, expected), 15)
                pod = await node.get("app")
                assert pod["status"]["phase"] == "Pending" and ADMITTED not in conditions(pod)
            plugin.mode = "good"
            pod = await node.running("app")
            assert node.dra.cdi_ids(pod, "app") == [f"example.com/claim={claim['metadata']['uid']}-{result['device']}"]
            await node.delete("app")
            await node.kubelet.wait_for(lambda k: not node.dra.claims, 30)
            assert plugin.unprepared == [claim["metadata"]["uid"]] and node.specs() == {}
        finally:
            for server in servers:
                server.close()
                await server.wait_closed()
