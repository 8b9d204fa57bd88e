"""The kwok node's kubelet (``gpuledger_dev.kwok_kubelet``) on the real control plane, with a tiny
device plugin written here: node capacity, admission before Running, refusals, freeing, restarts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

from gpuledger_dev.controlplane.api import ApiError, KubeApi
from gpuledger_dev.controlplane.cluster import KWOK_NODE_LABEL, Access, ControlPlane
from gpuledger_dev.kubelet_pods import ADMITTED
from gpuledger_dev.kwok_kubelet import GPU, KwokKubelet, KwokKubeletSettings
from gpuledger_plugin.kubelet import KubeletLink, Registration
from gpuledger_proto import v1 as pr
from gpuledger_proto import v1beta1 as dp
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="session")]

DEVICES = ("dev-0", "dev-1", "dev-2")
CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "20"}


class TinyPlugin(dp.DevicePluginBase):  # type: ignore[misc]
    """Advertises a few devices; Allocate can be held (``hold``) or told to fail (``fail``)."""

    def __init__(self, ids: tuple[str, ...]) -> None:
        self.health = dict.fromkeys(ids, "Healthy")
        self.fail = ""
        self.hold: asyncio.Event | None = None
        self.allocated: list[list[str]] = []  # the device IDs of every Allocate call, in order
        self.called = asyncio.Event()  # set at each Allocate call
        self.in_flight = self.most_in_flight = 0
        self.streaming = True  # False: every ListAndWatch stream ends, as when the plugin exits
        self._pulse = asyncio.Event()

    def set_health(self, device: str, health: str) -> None:
        self.health[device] = health
        self._wake()

    def end_streams(self) -> None:
        self.streaming = False
        self._wake()

    def _wake(self) -> None:
        pulse, self._pulse = self._pulse, asyncio.Event()
        pulse.set()

    async def get_device_plugin_options(self, empty: dp.Empty) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(get_preferred_allocation_available=True)

    async def list_and_watch(self, empty: dp.Empty) -> AsyncIterator[dp.ListAndWatchResponse]:
        while self.streaming:
            pulse = self._pulse
            yield dp.ListAndWatchResponse(devices=[dp.Device(id=i, health=h) for i, h in self.health.items()])
            await pulse.wait()

    async def get_preferred_allocation(self, request: dp.PreferredAllocationRequest) -> dp.PreferredAllocationResponse:
        answers = [
            dp.ContainerPreferredAllocationResponse(device_i_ds=sorted(r.available_device_i_ds)[: r.allocation_size])
            for r in request.container_requests
        ]
        return dp.PreferredAllocationResponse(container_responses=answers)

    async def allocate(self, request: dp.AllocateRequest) -> dp.AllocateResponse:
        ids = [list(r.devices_ids) for r in request.container_requests]
        self.allocated.extend(ids)
        self.called.set()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.hold is not None:
                await self.hold.wait()
        finally:
            self.in_flight -= 1
        if self.fail:
            raise GRPCError(Status.INTERNAL, self.fail)
        envs = [dp.ContainerAllocateResponse(envs={"TINY_DEVICES": ",".join(sorted(i))}) for i in ids]
        return dp.AllocateResponse(container_responses=envs)


@dataclass
class Node:
    name: str
    namespace: str
    api: KubeApi
    kubelet: KwokKubelet
    plugin: TinyPlugin
    link: KubeletLink
    pod_resources: Path
    serving: asyncio.Task[None] | None = None

    def start_plugin(self) -> None:
        self.plugin.streaming = True
        self.serving = asyncio.create_task(self.link.run())

    async def stop_plugin(self) -> None:
        """The plugin exits: its streams end, its socket goes."""
        serving, self.serving = self.serving, None
        self.plugin.end_streams()
        if serving is not None:
            serving.cancel()
            await asyncio.wait([serving])

    async def pod(self, name: str, gpus: int = 0, **spec: Any) -> dict[str, Any]:
        limits = {"limits": {GPU: str(gpus)}} if gpus else {}
        body = {
            "metadata": {"name": name},
            "spec": {
                "nodeName": self.name,
                "containers": [{"name": "app", "image": "app", "resources": limits}],
                **spec,
            },
        }
        created: dict[str, Any] = await self.api.create(f"/api/v1/namespaces/{self.namespace}/pods", body)
        return created

    async def get(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = await self.api.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}")
        return found

    async def gone(self, name: str) -> bool:
        try:
            await self.get(name)
        except ApiError as err:
            return err.status == 404
        return False

    async def phase(self, name: str, phase: str) -> dict[str, Any]:
        async def reached() -> dict[str, Any] | None:
            pod = await self.get(name)
            return pod if pod.get("status", {}).get("phase") == phase else None

        found: dict[str, Any] = await wait_for(reached, 30, f"pod {name} {phase}", 0.1)
        return found

    async def node_counts(self) -> tuple[str, str]:
        node = await self.api.get(f"/api/v1/nodes/{self.name}")
        status = node.get("status", {})
        return status.get("capacity", {}).get(GPU, ""), status.get("allocatable", {}).get(GPU, "")

    async def listed(self) -> dict[str, list[str]]:
        """PodResources List: pod name -> the device IDs its containers hold."""
        channel = Channel(path=str(self.pod_resources))
        try:
            answer = await pr.PodResourcesListerStub(channel).list(pr.ListPodResourcesRequest(), timeout=5)
        finally:
            channel.close()
        return {
            p.name: sorted(i for c in p.containers for d in c.devices for i in d.device_ids)
            for p in answer.pod_resources
            if p.namespace == self.namespace
        }


async def until(check: Callable[[], Any], what: str, within: float = 30) -> None:
    async def reached() -> bool:
        return bool(await check())

    await wait_for(reached, within, what, 0.1)


@contextlib.asynccontextmanager
async def running_node(
    control_plane: ControlPlane, access: Access | None = None, settings: KwokKubeletSettings | None = None
) -> AsyncIterator[Node]:
    """A fresh kwok node (and namespace) with its kubelet (reaching the API server through
    ``access`` if given) and the tiny plugin registered."""
    assert control_plane.access is not None
    name = namespace = f"kk-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="gl-kk-", dir="/tmp"))  # unix socket paths must stay short
    (work / "dp").mkdir()
    plugin = TinyPlugin(DEVICES)
    options = dp.DevicePluginOptions(get_preferred_allocation_available=True)
    registration = Registration(str(work / "dp" / "kubelet.sock"), str(work / "dp" / "tiny.sock"), GPU, options, 0.05)
    async with KubeApi(control_plane.access) as api:
        await api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        meta = {"name": name, "labels": dict([KWOK_NODE_LABEL])}  # kwok plays it
        node = {"metadata": meta, "status": {"capacity": CAPACITY, "allocatable": CAPACITY}}
        await api.create("/api/v1/nodes", node)
        try:
            kubelet = KwokKubelet(name, work / "dp", work / "pr.sock", access or control_plane.access, settings)
            async with kubelet:
                here = Node(name, namespace, api, kubelet, plugin, KubeletLink(registration, plugin), work / "pr.sock")
                here.start_plugin()
                try:
                    await kubelet.wait_registered()
                    yield here
                finally:
                    await here.stop_plugin()
        finally:
            await api.delete(f"/api/v1/namespaces/{namespace}")
            await api.delete(f"/api/v1/nodes/{name}")
            shutil.rmtree(work, ignore_errors=True)


@pytest_asyncio.fixture(loop_scope="session")
async def node(control_plane: ControlPlane) -> AsyncIterator[Node]:
    async with running_node(control_plane) as here:
        yield here


class Forwarder:
    """A TCP forwarder on loopback in front of the API server that can be cut (its port closed and
    every connection dropped) and restored on the same port: an API server that is briefly away."""

    def __init__(self, target: str) -> None:
        address = urlsplit(target)
        self.host, self.target_port = address.hostname or "127.0.0.1", address.port or 443
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, upstream}
        try:
            await asyncio.gather(_copy(reader, upstream), _copy(upstream_reader, writer))
        finally:
            self._writers -= {writer, upstream}
            writer.close()
            upstream.close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
    writer.close()


async def test_the_node_advertises_every_device_and_allocatable_the_healthy_ones(
    node: Node, control_plane: ControlPlane
) -> None:
    shown = await asyncio.to_thread(control_plane.kubectl, "get", "node", node.name, "-o", "json")
    status = json.loads(shown.stdout)["status"]
    assert status["capacity"] == {**CAPACITY, GPU: "3"}
    assert status["allocatable"] == {**CAPACITY, GPU: "3"}
    assert {c["type"] for c in status["conditions"]} >= {"Ready"}  # kwok's conditions are kept

    node.plugin.set_health("dev-1", "Unhealthy")
    await until(lambda: _is(node.node_counts(), ("3", "2")), "allocatable 2 of 3")
    node.plugin.set_health("dev-1", "Healthy")
    await until(lambda: _is(node.node_counts(), ("3", "3")), "allocatable 3 of 3 again")


async def test_a_plugin_that_goes_away_leaves_nothing_allocatable(node: Node) -> None:
    await node.stop_plugin()  # the ListAndWatch stream breaks: every device is unhealthy
    await until(lambda: _is(node.node_counts(), ("3", "0")), "allocatable 0 of 3")
    node.start_plugin()
    await until(lambda: _is(node.node_counts(), ("3", "3")), "allocatable 3 after registering again")
    assert node.kubelet.registrations == 2


async def test_a_gpu_pod_runs_only_after_allocate_answered(node: Node) -> None:
    node.plugin.hold = asyncio.Event()
    made = await node.pod("held", gpus=2)
    await asyncio.wait_for(node.plugin.called.wait(), 30)
    pod = await node.get("held")
    assert pod["status"]["phase"] == "Pending"
    assert ADMITTED not in {c["type"] for c in pod["status"].get("conditions", [])}
    assert made["metadata"]["uid"] not in node.kubelet.admitted

    node.plugin.hold.set()
    await node.phase("held", "Running")
    held = node.kubelet.assignments[made["metadata"]["uid"]]["app"]
    assert sorted(held) == sorted(node.plugin.allocated[-1]) and len(held) == 2
    assert node.kubelet.container_envs(made["metadata"]["uid"]) == {"app": {"TINY_DEVICES": ",".join(sorted(held))}}
    assert (await node.listed())["held"] == sorted(held)

    await node.pod("plain")  # no devices: admitted at once, no Allocate
    await node.phase("plain", "Running")
    assert len(node.plugin.allocated) == 1


async def test_held_admissions_admit_nothing_until_resumed(node: Node) -> None:
    await node.pod("before-hold", gpus=1)  # the admitting loop is then waiting for the next pod
    await node.phase("before-hold", "Running")
    calls = len(node.plugin.allocated)
    node.kubelet.hold_admissions()
    made = await node.pod("while-held", gpus=1)
    await asyncio.sleep(2.0)  # kwok and the kubelet have seen the pod long since
    assert len(node.plugin.allocated) == calls
    assert made["metadata"]["uid"] not in node.kubelet.admitted
    node.kubelet.resume_admissions()
    await node.phase("while-held", "Running")
    assert len(node.plugin.allocated) == calls + 1


async def test_init_containers_first_one_allocate_per_container_and_one_pod_at_a_time(node: Node) -> None:
    node.plugin.hold = asyncio.Event()
    init = {"name": "setup", "image": "setup", "resources": {"limits": {GPU: "1"}}}
    first = await node.pod("first", gpus=1, initContainers=[init])
    second = await node.pod("second", gpus=2)
    await asyncio.wait_for(node.plugin.called.wait(), 30)
    node.plugin.hold.set()
    await node.phase("first", "Running")
    await node.phase("second", "Running")
    assert node.plugin.most_in_flight == 1  # kubelet admits one pod, one container, at a time
    setup, app = node.plugin.allocated[0], node.plugin.allocated[1]
    assert len(node.plugin.allocated) == 3 and setup == app  # the app container reuses the init's device
    held = node.kubelet.assignments
    assert held[first["metadata"]["uid"]] == {"setup": tuple(setup), "app": tuple(app)}
    assert not set(held[second["metadata"]["uid"]]["app"]) & set(app)
    assert (await node.listed())["first"] == app  # PodResources lists app containers only


async def test_a_pod_deleted_while_allocate_runs_keeps_nothing(node: Node) -> None:
    node.plugin.hold = asyncio.Event()
    made = await node.pod("brief", gpus=2)
    await asyncio.wait_for(node.plugin.called.wait(), 30)
    await node.api.delete(f"/api/v1/namespaces/{node.namespace}/pods/brief")
    await until(lambda: node.gone("brief"), "brief deleted (by kwok)")
    node.plugin.hold.set()
    await node.kubelet.wait_for(lambda k: made["metadata"]["uid"] not in k.assignments and not k.device_manager.active)
    assert "brief" not in await node.listed()
    await node.pod("next", gpus=3)
    await node.phase("next", "Running")


async def test_a_failed_allocate_fails_the_pod_as_kubelet_does(node: Node) -> None:
    node.plugin.fail = "card dev-0 is on fire"
    made = await node.pod("refused", gpus=1)
    pod = await node.phase("refused", "Failed")
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    assert pod["status"]["message"] == (
        "Pod was rejected: Allocate failed due to rpc error: code = Internal desc = card dev-0 is on fire,"
        " which is unexpected"
    )
    assert made["metadata"]["uid"] not in node.kubelet.assignments
    assert "refused" not in await node.listed()

    node.plugin.fail = ""
    await node.pod("greedy", gpus=4)
    pod = await node.phase("greedy", "Failed")
    assert (
        "requested number of devices unavailable for gpuledger.io/gpu. Requested: 4, Available: 3"
        in pod["status"]["message"]
    )


async def test_deleted_and_finished_pods_give_their_devices_back(node: Node) -> None:
    first = await node.pod("first", gpus=2)
    await node.phase("first", "Running")
    assert len((await node.listed())["first"]) == 2
    await node.api.delete(f"/api/v1/namespaces/{node.namespace}/pods/first")
    await until(lambda: _lacks(node.listed(), "first"), "first gone from PodResources")
    assert first["metadata"]["uid"] not in node.kubelet.assignments

    await node.pod("all", gpus=3)  # only fits because first's devices are free
    await node.phase("all", "Running")
    await node.api.patch(
        f"/api/v1/namespaces/{node.namespace}/pods/all",
        {"metadata": {"annotations": {"gpuledger.io/test-complete": "true"}}},
    )
    await node.phase("all", "Succeeded")
    await until(lambda: _lacks(node.listed(), "all"), "a finished pod gone from PodResources")
    await node.pod("after", gpus=3)
    await node.phase("after", "Running")


async def test_a_restart_keeps_assignments_and_the_plugin_registers_again(node: Node) -> None:
    made = await node.pod("kept", gpus=1)
    await node.phase("kept", "Running")
    before = node.kubelet.assignments[made["metadata"]["uid"]]
    calls = len(node.plugin.allocated)

    await node.kubelet.restart()
    await node.kubelet.wait_registered()
    assert node.kubelet.registrations == 2 and node.link.restarts == 1
    await node.kubelet.wait_for(lambda k: k.lists >= 2)
    assert node.kubelet.assignments[made["metadata"]["uid"]] == before
    assert len(node.plugin.allocated) == calls  # the running pod was not admitted again
    assert (await node.listed())["kept"] == sorted(before["app"])

    other = await node.pod("other", gpus=2)
    await node.phase("other", "Running")
    assert not set(node.kubelet.assignments[other["metadata"]["uid"]]["app"]) & set(before["app"])
    assert await node.node_counts() == ("3", "3")


async def test_the_kubelet_rides_out_an_api_server_outage(control_plane: ControlPlane) -> None:
    assert control_plane.access is not None
    forwarder = Forwarder(control_plane.access.server)
    await forwarder.start()
    through = Access(f"https://127.0.0.1:{forwarder.port}", control_plane.access.ca_pem, control_plane.access.token)
    quick = KwokKubeletSettings(call_timeout_s=2.0, watch_s=20, backoff_max_s=0.5)
    try:
        async with running_node(control_plane, through, quick) as node:
            before = await node.pod("before", gpus=1)
            await node.phase("before", "Running")

            await forwarder.cut()  # what happens now reaches the kubelet only once the API server is back
            node.plugin.set_health("dev-2", "Unhealthy")
            await node.kubelet.device_manager.wait_for(lambda k: len(k.healthy()) == 2)
            await node.api.delete(f"/api/v1/namespaces/{node.namespace}/pods/before")
            await until(lambda: node.gone("before"), "before deleted (by kwok)")
            await node.pod("during", gpus=2)
            assert await node.node_counts() == ("3", "3")  # the kubelet could not write its news

            await forwarder.start()
            await until(lambda: _is(node.node_counts(), ("3", "2")), "allocatable 2 written after the outage")
            await node.phase("during", "Running")  # needs before's device: it was freed
            assert before["metadata"]["uid"] not in node.kubelet.assignments
            assert set(await node.listed()) == {"during"}
    finally:
        await forwarder.cut()


async def _is(counts: Any, expected: tuple[str, str]) -> bool:
    return bool(await counts == expected)


async def _lacks(listed: Any, name: str) -> bool:
    return name not in await listed
