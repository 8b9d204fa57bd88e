"""A fake kubelet for device-plugin tests and the local stack, over real unix sockets.

It does what kubelet's device manager does, as far as a device plugin can tell:
- serves ``Registration`` on ``<dir>/kubelet.sock``; inside Register it checks the version and
  that the resource name is an extended resource name, dials the plugin back (10 s limit) and
  calls GetDevicePluginOptions, then consumes ListAndWatch, each message replacing that resource's
  device list; when the stream breaks every device of the resource turns unhealthy. Each resource
  has its own endpoint, device list and allocated devices, as in kubelet's device manager (one
  device ID may be listed under two resources);
- admits pods one at a time, containers one per Allocate call, init containers first, each
  container's devices from the endpoint of its resource (``FakeContainer.resource``, the
  kubelet's ``resource_name`` when empty); devices come first from the pod's reusable
  init-container devices of that resource, then from the healthy free ones, steered by
  GetPreferredAllocation (which it can be told to ignore, as kubelet may);
- serves PodResources ``List``/``GetAllocatableResources``/``Get`` on its own socket, listing the
  pod being admitted too (it is in kubelet's pod manager during admission);
- ``restart()`` deletes every socket in the directory and recreates ``kubelet.sock``; the pods'
  devices survive, as kubelet's checkpoint does, and the device list is empty (capacity 0) until
  the plugin registers again.

Refusals carry kubelet's wording: ``str(AdmissionError)`` is the device manager's error (a failed
RPC reads ``rpc error: code = … desc = …``, as Go's gRPC prints it), and ``pod_message`` is what
kubelet writes into the rejected pod's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import stat
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import StreamTerminatedError
from grpclib.server import Server

from gpuledger_proto import v1 as pr
from gpuledger_proto import v1beta1 as dp

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
DIAL_TIMEOUT_S = 10.0
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
# An extended resource name's name part, as kubelet's Register checks it (a qualified name).
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class FakeContainer:
    name: str
    gpus: int = 0  # devices of ``resource`` it asks for
    init: bool = False
    restartable: bool = False  # a sidecar: an init container that keeps running
    resource: str = ""  # the resource it asks for; empty: the kubelet's ``resource_name``


@dataclass(frozen=True, slots=True)
class FakePod:
    namespace: str
    name: str
    uid: str
    containers: tuple[FakeContainer, ...]

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def in_admission_order(self) -> list[FakeContainer]:
        return [c for c in self.containers if c.init] + [c for c in self.containers if not c.init]


@dataclass(slots=True)
class Admitted:
    pod: FakePod
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    answers: dict[str, dp.ContainerAllocateResponse] = field(default_factory=dict)
    hints: dict[str, list[str]] = field(default_factory=dict)

    def env(self, container: str) -> dict[str, str]:
        return dict(self.answers[container].envs)

    def visible(self, container: str) -> list[str]:
        """The cards the NVIDIA container toolkit would give ``container`` from its answer, as the
        toolkit reads them: ``/dev/null`` mounts under ``/var/run/nvidia-container-devices`` first,
        else the ``NVIDIA_VISIBLE_DEVICES`` list (an unprivileged container's only where the
        toolkit accepts the variable)."""
        answer = self.answers[container]
        root = "/var/run/nvidia-container-devices/"
        mounted = [
            m.container_path.removeprefix(root)
            for m in answer.mounts
            if m.host_path == "/dev/null" and m.container_path.startswith(root)
        ]
        if mounted:
            return mounted
        listed = answer.envs.get("NVIDIA_VISIBLE_DEVICES", "")
        return [d for d in listed.split(",") if d and not d.startswith("/")]


@dataclass(slots=True)
class Endpoint:
    """One registered resource: its plugin's connection, options and device list."""

    channel: Channel | None = None
    options: dp.DevicePluginOptions | None = None
    devices: dict[str, str] = field(default_factory=dict)  # device ID -> health, as the last ListAndWatch said
    numa: dict[str, list[int]] = field(default_factory=dict)
    registrations: int = 0
    consumer: asyncio.Task[None] | None = None

    def healthy(self) -> set[str]:
        return {i for i, h in self.devices.items() if h == HEALTHY}


class AdmissionError(Exception):
    """kubelet rejected the pod (UnexpectedAdmissionError); the message is the device manager's."""

    reason = UNEXPECTED_ADMISSION_ERROR

    @property
    def pod_message(self) -> str:
        """The rejected pod's ``status.message``, worded as kubelet words it."""
        return f"Pod was rejected: Allocate failed due to {self}, which is unexpected"


def rpc_error(err: BaseException) -> str:
    """A failed device-plugin call as kubelet's Go gRPC client prints it."""
    if isinstance(err, GRPCError):
        return f"rpc error: code = {_go_code(err.status)} desc = {err.message or ''}"
    if isinstance(err, TimeoutError):
        return "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
    return f"rpc error: code = Unavailable desc = connection error: {err!r}"


def _go_code(status: Status) -> str:
    if status is Status.CANCELLED:
        return "Canceled"
    return "".join(part.capitalize() for part in status.name.split("_")) if status.value else "OK"


RPC_FAILURES = (GRPCError, OSError, StreamTerminatedError, TimeoutError)


class _Registration(dp.RegistrationBase):  # type: ignore[misc]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def register(self, request: dp.RegisterRequest) -> dp.Empty:
        await self.kubelet.on_register(request)
        return dp.Empty()


class _PodResources(pr.PodResourcesListerBase):  # type: ignore[misc]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def list(self, request: pr.ListPodResourcesRequest) -> pr.ListPodResourcesResponse:
        self.kubelet.pod_resources_calls += 1
        pods = [self.kubelet.pod_resources(p) for p in self.kubelet.active.values()]
        return pr.ListPodResourcesResponse(pod_resources=pods)

    async def get_allocatable_resources(
        self, request: pr.AllocatableResourcesRequest
    ) -> pr.AllocatableResourcesResponse:
        devices = [
            pr.ContainerDevices(resource_name=name, device_ids=[i])
            for name, endpoint in sorted(self.kubelet.endpoints.items())
            for i in sorted(endpoint.healthy())
        ]
        return pr.AllocatableResourcesResponse(devices=devices)

    async def get(self, request: pr.GetPodResourcesRequest) -> pr.GetPodResourcesResponse:
        pod = self.kubelet.active.get((request.pod_namespace, request.pod_name))
        if pod is None:
            raise GRPCError(Status.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")
        return pr.GetPodResourcesResponse(pod_resources=self.kubelet.pod_resources(pod))


class FakeKubelet:
    def __init__(
        self,
        plugin_dir: str,
        pod_resources_socket: str,
        resource_name: str = "gpuledger.io/gpu",
        follow_hints: bool = True,
        seed: int = 0,
        rpc_timeout_s: float | None = None,
    ) -> None:
        self.plugin_dir, self.pod_resources_socket = plugin_dir, pod_resources_socket
        self.resource_name, self.follow_hints = resource_name, follow_hints
        self.rpc_timeout_s = rpc_timeout_s  # kubelet sets none on Allocate/GetPreferredAllocation
        self.rng = random.Random(seed)
        self.endpoints: dict[str, Endpoint] = {resource_name: Endpoint()}  # by resource name
        self.generation = 0  # bumped whenever a device list is replaced
        self.pod_resources_calls = 0
        self.active: dict[tuple[str, str], FakePod] = {}
        self.pod_devices: dict[tuple[str, str], tuple[str, ...]] = {}  # (pod uid, container) -> IDs
        self.pod_resource: dict[tuple[str, str], str] = {}  # (pod uid, container) -> its resource
        self._changed = asyncio.Condition()
        self._servers: list[Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._admission = asyncio.Lock()

    # The kubelet's own resource (``resource_name``), as before it had several:
    @property
    def devices(self) -> dict[str, str]:
        return self.endpoints[self.resource_name].devices

    @property
    def numa(self) -> dict[str, list[int]]:
        return self.endpoints[self.resource_name].numa

    @property
    def options(self) -> dp.DevicePluginOptions | None:
        return self.endpoints[self.resource_name].options

    @property
    def registrations(self) -> int:
        return self.endpoints[self.resource_name].registrations

    def endpoint(self, resource: str) -> Endpoint:
        """The resource's endpoint (an empty one where it never registered)."""
        return self.endpoints.setdefault(resource, Endpoint())

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.plugin_dir, "kubelet.sock")

    async def __aenter__(self) -> FakeKubelet:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def start(self) -> None:
        os.makedirs(self.plugin_dir, exist_ok=True)
        registration = Server([_Registration(self)])
        await registration.start(path=self.kubelet_socket)
        pod_resources = Server([_PodResources(self)])
        await pod_resources.start(path=self.pod_resources_socket)
        self._servers = [registration, pod_resources]

    async def stop(self) -> None:
        await self._disconnect()
        for server in self._servers:
            server.close()
            await server.wait_closed()
        self._servers = []

    async def stop_pod_resources(self) -> None:
        """Only the PodResources API goes away (e.g. its directory is not mounted)."""
        server = self._servers.pop()
        server.close()
        await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.pod_resources_socket)

    async def restart(self) -> None:
        """What a kubelet restart does to the plugin: sockets deleted, kubelet.sock recreated."""
        await self.stop()
        for name in os.listdir(self.plugin_dir):
            path = os.path.join(self.plugin_dir, name)
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.pod_resources_socket)
        for endpoint in self.endpoints.values():  # from the checkpoint: the resources, with no devices yet
            await self._set_devices(endpoint, {})
        await self.start()

    # --- registration and the device list ---

    async def on_register(self, request: dp.RegisterRequest) -> None:
        if request.version != "v1beta1":
            raise GRPCError(Status.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        name = request.resource_name
        domain, slash, part = name.partition("/")
        if not slash or not domain or not _NAME_PART.match(part):
            raise GRPCError(Status.INVALID_ARGUMENT, f"invalid resource name {name!r}: not an extended resource name")
        channel = Channel(path=os.path.join(self.plugin_dir, request.endpoint))
        try:
            stub = dp.DevicePluginStub(channel)
            options = await stub.get_device_plugin_options(dp.Empty(), timeout=DIAL_TIMEOUT_S)
        except Exception as err:
            channel.close()
            raise GRPCError(Status.UNKNOWN, f"cannot dial device plugin: {err}") from err
        endpoint = self.endpoint(name)
        await self._disconnect(endpoint)
        endpoint.channel, endpoint.options = channel, options
        endpoint.registrations += 1
        endpoint.consumer = self._own(self._consume(name, endpoint, channel))
        async with self._changed:
            self._changed.notify_all()

    async def _consume(self, name: str, endpoint: Endpoint, channel: Channel) -> None:
        try:
            async for response in dp.DevicePluginStub(channel).list_and_watch(dp.Empty()):
                endpoint.numa.update({d.id: [n.id for n in d.topology.nodes] for d in response.devices if d.topology})
                await self._set_devices(endpoint, {d.id: d.health for d in response.devices})
        except Exception as err:  # any broken stream: kubelet disconnects the endpoint
            log.info("ListAndWatch for %s ended: %r", name, err)
        if channel is endpoint.channel:  # the plugin went away: its devices are unhealthy
            await self._set_devices(endpoint, dict.fromkeys(endpoint.devices, "Unhealthy"))

    async def _set_devices(self, endpoint: Endpoint, devices: dict[str, str]) -> None:
        async with self._changed:
            endpoint.devices = devices
            self.generation += 1
            self._changed.notify_all()

    async def _disconnect(self, endpoint: Endpoint | None = None) -> None:
        """One endpoint's connection closed (every endpoint's when None)."""
        for each in [endpoint] if endpoint is not None else list(self.endpoints.values()):
            channel, each.channel = each.channel, None
            if channel is not None:
                channel.close()
            consumer, each.consumer = each.consumer, None
            if consumer is not None:
                consumer.cancel()
                await asyncio.gather(consumer, return_exceptions=True)
        if endpoint is None:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _own(self, work: Coroutine[object, object, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def wait_for(self, condition: Callable[[FakeKubelet], bool], within: float = 10.0) -> None:
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(lambda: condition(self))

    def healthy(self, resource: str | None = None) -> set[str]:
        """The healthy devices of ``resource`` (the kubelet's own when None)."""
        return self.endpoint(resource or self.resource_name).healthy()

    # --- admission ---

    async def admit(self, pod: FakePod, follow_hints: bool | None = None) -> Admitted:
        """Admit a pod as kubelet does, or raise AdmissionError (the pod is then failed)."""
        follow = self.follow_hints if follow_hints is None else follow_hints
        async with self._admission:
            self.active[pod.key] = pod
            admitted = Admitted(pod)
            reusable: dict[str, set[str]] = {}  # per resource, as kubelet's devicesToReuse
            try:
                for container in pod.in_admission_order():
                    if container.gpus:
                        await self._admit_container(admitted, container, reusable, follow)
            except BaseException:  # refused, or cancelled halfway: nothing stays allocated
                self.remove(pod)
                raise
            return admitted

    async def _admit_container(
        self, admitted: Admitted, container: FakeContainer, reusable: dict[str, set[str]], follow: bool
    ) -> None:
        pod = admitted.pod
        resource = container.resource or self.resource_name
        of_resource = reusable.setdefault(resource, set())
        ids = await self._devices_to_allocate(admitted, container, resource, of_resource, follow)
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
        try:
            response = await self._stub(resource).allocate(request, timeout=self.rpc_timeout_s)
        except RPC_FAILURES as err:
            raise AdmissionError(rpc_error(err)) from err
        if not response.container_responses:
            raise AdmissionError(f"no containers return in allocation response {response}")
        self.pod_devices[(pod.uid, container.name)] = tuple(ids)
        self.pod_resource[(pod.uid, container.name)] = resource
        admitted.devices[container.name] = tuple(ids)
        admitted.answers[container.name] = response.container_responses[0]
        if container.init and not container.restartable:
            of_resource.update(ids)
        else:
            of_resource.difference_update(ids)

    async def _devices_to_allocate(
        self, admitted: Admitted, container: FakeContainer, resource: str, reusable: set[str], follow: bool
    ) -> list[str]:
        needed = container.gpus
        allocated = sorted(reusable)[:needed]
        if len(allocated) == needed:
            return allocated
        endpoint = self.endpoint(resource)
        in_use = {i for key, ids in self.pod_devices.items() if self._resource_of(key) == resource for i in ids}
        available = endpoint.healthy() - in_use
        if not endpoint.registrations:
            raise AdmissionError(f"cannot allocate unregistered device {resource}")
        if not endpoint.healthy():
            raise AdmissionError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
        if len(available) < needed - len(allocated):
            raise AdmissionError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed - len(allocated)}, Available: {len(available)}"
            )
        chosen = list(allocated)
        if endpoint.options is not None and endpoint.options.get_preferred_allocation_available:
            hint = await self._preferred(resource, sorted(available | set(allocated)), allocated, needed)
            admitted.hints[container.name] = hint
            if follow:
                chosen += [i for i in hint if i in available and i not in chosen][: needed - len(chosen)]
        rest = sorted(available - set(chosen))
        self.rng.shuffle(rest)
        return chosen + rest[: needed - len(chosen)]

    def _resource_of(self, key: tuple[str, str]) -> str:
        return self.pod_resource.get(key, self.resource_name)

    async def _preferred(self, resource: str, available: list[str], must: list[str], size: int) -> list[str]:
        ask = dp.ContainerPreferredAllocationRequest(
            available_device_i_ds=available, must_include_device_i_ds=must, allocation_size=size
        )
        try:
            response = await self._stub(resource).get_preferred_allocation(
                dp.PreferredAllocationRequest(container_requests=[ask]), timeout=self.rpc_timeout_s
            )
        except RPC_FAILURES as err:
            raise AdmissionError(f"device plugin GetPreferredAllocation rpc failed with err: {rpc_error(err)}") from err
        return list(response.container_responses[0].device_i_ds) if response.container_responses else []

    def _stub(self, resource: str) -> dp.DevicePluginStub:
        channel = self.endpoint(resource).channel
        if channel is None:
            raise AdmissionError(f"endpoint {resource} has been stopped")
        return dp.DevicePluginStub(channel)

    def remove(self, pod: FakePod) -> None:
        """The pod is gone: its devices are free again."""
        self.remove_uid(pod.uid)

    def remove_uid(self, uid: str) -> None:
        """The pod with this UID is gone (a pod recreated under its name is not)."""
        for key in [k for k, p in self.active.items() if p.uid == uid]:
            del self.active[key]
        for key in [k for k in self.pod_devices if k[0] == uid]:
            del self.pod_devices[key]
            self.pod_resource.pop(key, None)

    # --- PodResources ---

    def pod_resources(self, pod: FakePod) -> pr.PodResources:
        listed = [c for c in pod.containers if not c.init or c.restartable]
        return pr.PodResources(
            name=pod.name,
            namespace=pod.namespace,
            containers=[pr.ContainerResources(name=c.name, devices=self._devices_of(pod, c)) for c in listed],
        )

    def _devices_of(self, pod: FakePod, container: FakeContainer) -> list[pr.ContainerDevices]:
        key = (pod.uid, container.name)
        ids = self.pod_devices.get(key)
        if not ids:
            return []
        return [pr.ContainerDevices(resource_name=self._resource_of(key), device_ids=list(ids))]

    def give(self, pod: FakePod, container: str, ids: tuple[str, ...], resource: str = "") -> None:
        """Record devices for a container directly (a test's way to make kubelet disagree)."""
        self.active[pod.key] = pod
        self.pod_devices[(pod.uid, container)] = ids
        self.pod_resource[(pod.uid, container)] = resource or self.resource_name
