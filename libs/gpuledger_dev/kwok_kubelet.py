"""kubelet's device-manager side for one kwok node, against a real API server.

kwok plays a node's heartbeats and its pods' container lifecycle but has no device manager. This
kubelet adds one, built on ``FakeKubelet`` (registration on ``<plugin_dir>/kubelet.sock``,
ListAndWatch, Allocate, PodResources, restart) and tied to the API server as kubelet is:

- the node's ``status.capacity``/``status.allocatable`` for the resource are patched through
  ``nodes/{name}/status`` (all devices / healthy ones) whenever the device list changes, and again
  every ``resync_s``; everything else in the node's status stays as it is;
- the pods bound to the node are listed, then watched from the list's resourceVersion (listed again
  on 410 Gone); each new pod that is neither terminal nor being deleted nor admitted before is
  admitted, one pod at a time per node as kubelet's sync loop does, containers one Allocate each;
- an admitted pod gets the condition ``gpuledger.io/KubeletAdmitted=True``, which kwok's
  ``pod-ready`` Stage waits for before it runs the pod; a refused one gets ``phase: Failed``,
  ``reason: UnexpectedAdmissionError`` and kubelet's message;
- a pod that is deleted or reaches Succeeded/Failed gives its devices back;
- ``restart()`` does what a kubelet restart does: sockets deleted, ``kubelet.sock`` recreated, the
  devices assigned to pods kept (the checkpoint), the pods listed again (admitted ones stay so).

With ``dra`` (``KwokDraSettings``) the node also has kubelet's DRA side (``kwok_dra``): plugins
register through ``dra.registry_dir``, and an admitted pod with ``spec.resourceClaims`` gets its
condition only once its claims were prepared (a failed prepare is retried, never fails the pod);
its claims are unprepared when it is gone. Without it the node behaves as before.

Every API call has a deadline; the watch and the writes retry with back-off while the API server is
away. All background work runs in one task group, started on enter and closed on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.controlplane.cluster import Access
from gpuledger_dev.fake_kubelet import AdmissionError, Admitted, FakeKubelet
from gpuledger_dev.kubelet_pods import (
    admitted_patch,
    fake_pod,
    is_deleting,
    is_terminal,
    rejected_patch,
    status_says_admitted,
    uid,
)
from gpuledger_dev.kwok_dra import KwokDra, KwokDraSettings
from gpuledger_dev.kwok_sync import GPU, KwokKubeletSettings, patch_pod_status, watch_pods, write_node_devices

__all__ = ["GPU", "KwokDraSettings", "KwokKubelet", "KwokKubeletSettings"]

log = logging.getLogger(__name__)


class KwokKubelet:
    """``async with KwokKubelet(node, plugin_dir, pod_resources_socket, access) as kubelet``."""

    def __init__(
        self,
        node: str,
        plugin_dir: str | os.PathLike[str],
        pod_resources_socket: str | os.PathLike[str],
        access: Access,
        settings: KwokKubeletSettings | None = None,
        dra: KwokDraSettings | None = None,
    ) -> None:
        settings = settings or KwokKubeletSettings()
        self.node, self.settings = node, settings
        self.device_manager = FakeKubelet(
            os.fspath(plugin_dir),
            os.fspath(pod_resources_socket),
            settings.resource_name,
            rpc_timeout_s=settings.rpc_timeout_s,
        )
        self._api = KubeApi(access, timeout_s=settings.call_timeout_s)
        self.dra = None if dra is None else KwokDra(node, dra, self._api, settings, self._notify)
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> the pod as last seen
        self._admitted: set[str] = set()  # with the device manager's assignments: the checkpoint
        self.admissions: dict[str, Admitted] = {}  # uid -> what Allocate answered, per container
        self.rejections: dict[str, str] = {}  # uid -> the message written into the pod
        self.node_status: tuple[int, int] | None = None  # (capacity, allocatable) last written
        self.lists = 0  # how many times the pods were listed
        self.restarts = 0
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._pulse = asyncio.Event()
        self._admitting = asyncio.Event()
        self._admitting.set()
        self._runner: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._since = (0, 0)  # (registrations, device generation) at the last start

    # --- what tests look at ---

    @property
    def devices(self) -> dict[str, str]:
        """Device ID -> health, as the plugin's last ListAndWatch message said."""
        return dict(self.device_manager.devices)

    @property
    def assignments(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """Pod UID -> container -> the device IDs it holds."""
        found: dict[str, dict[str, tuple[str, ...]]] = {}
        for (pod_uid, container), ids in self.device_manager.pod_devices.items():
            found.setdefault(pod_uid, {})[container] = ids
        return found

    @property
    def admitted(self) -> frozenset[str]:
        return frozenset(self._admitted)

    @property
    def registrations(self) -> int:
        return self.device_manager.registrations

    @property
    def registered(self) -> bool:
        """The plugin has registered since the last start or restart."""
        return self.device_manager.registrations > self._since[0]

    def container_envs(self, pod_uid: str) -> dict[str, dict[str, str]]:
        """Container -> the environment its Allocate answer gave (empty for a pod not admitted)."""
        admitted = self.admissions.get(pod_uid)
        return {} if admitted is None else {c: admitted.env(c) for c in admitted.answers}

    async def wait_for(self, condition: Callable[[KwokKubelet], bool], within: float = 30.0) -> None:
        async with asyncio.timeout(within):
            while not condition(self):
                if self._failure is not None:
                    raise RuntimeError(f"the kubelet of {self.node} stopped") from self._failure
                pulse = self._pulse
                await pulse.wait()

    async def wait_registered(self, within: float = 30.0) -> None:
        """Until the plugin has registered since the last start, sent its devices, and the node's
        status shows them."""
        registrations, generation = self._since
        dm = self.device_manager
        await self.wait_for(
            lambda k: (
                dm.registrations > registrations
                and dm.generation > generation
                and k.node_status == (len(dm.devices), len(dm.healthy()))
            ),
            within,
        )

    # --- life cycle ---

    async def __aenter__(self) -> KwokKubelet:
        await self._api.__aenter__()
        try:
            await self.device_manager.start()
        except BaseException:
            await self._api.__aexit__()
            raise
        self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stop()
        if self.dra is not None:
            self.dra.close()
        await self.device_manager.stop()
        await self._api.__aexit__()
        if self._failure is not None and exc[0] is None:
            raise RuntimeError(f"the kubelet of {self.node} stopped") from self._failure

    async def restart(self) -> None:
        """As kubelet restarts: sockets deleted and served again, assignments kept, pods re-listed."""
        await self._stop()
        await self.device_manager.restart()
        self._pods.clear()
        self._queue, self._queued = asyncio.Queue(), set()
        self.node_status = None
        if self.dra is not None:
            self.dra.restart()
        self.restarts += 1
        self._start()

    def _start(self) -> None:
        self._since = (self.device_manager.registrations, self.device_manager.generation)
        self._runner = asyncio.create_task(self._run(), name=f"kwok-kubelet-{self.node}")

    async def _stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.cancel()
            await asyncio.wait([runner])

    async def _run(self) -> None:
        api, node, settings = self._api, self.node, self.settings
        try:
            async with asyncio.TaskGroup() as group:
                if self.dra is not None:
                    self.dra.begin(group)
                group.create_task(watch_pods(api, node, settings, self._listed, self._changed))
                group.create_task(self._admit_pods())
                group.create_task(
                    write_node_devices(api, node, settings, self.device_manager, self._notify, self._wrote)
                )
        except Exception as err:  # a bug: the loops retry everything they expect
            log.exception("the kubelet of node %s stopped", self.node)
            self._failure = err
            self._notify()
        finally:
            if self.dra is not None:
                self.dra.end()

    def _notify(self) -> None:
        pulse, self._pulse = self._pulse, asyncio.Event()
        pulse.set()

    def _wrote(self, counts: tuple[int, int]) -> None:
        if counts != self.node_status:
            log.info("node %s: %s capacity %d, allocatable %d", self.node, self.settings.resource_name, *counts)
            self.node_status = counts
            self._notify()

    # --- the node's pods ---

    def _listed(self, pods: list[dict[str, Any]]) -> None:
        """A fresh list: what we hold for pods not in it is freed (they went while we were away)."""
        listed = {uid(p) for p in pods}
        held = self.dra.users() if self.dra is not None else set()
        for gone in (set(self._pods) | self._admitted | set(self.assignments) | held) - listed:
            self._release(gone)
        for pod in pods:
            self._observe(pod)
        self.lists += 1
        self._notify()

    def _changed(self, kind: str, pod: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._release(uid(pod))
            self.rejections.pop(uid(pod), None)
        else:
            self._observe(pod)

    def _observe(self, pod: dict[str, Any]) -> None:
        pod_uid = uid(pod)
        if is_terminal(pod):
            self._release(pod_uid)
            return
        self._pods[pod_uid] = pod
        if pod_uid in self._queued or pod_uid in self.rejections or is_deleting(pod):
            return
        if status_says_admitted(pod):
            if pod_uid not in self._admitted:  # admitted before we saw it: active, with what it holds
                self._adopt(pod)
            return
        self._queued.add(pod_uid)  # to be admitted, or (admitted already) to have that written
        self._queue.put_nowait(pod_uid)

    def _adopt(self, pod: dict[str, Any]) -> None:
        with contextlib.suppress(ValueError):
            found = fake_pod(pod, self.settings.resource_name)
            self.device_manager.active[found.key] = found
        self._admitted.add(uid(pod))
        self._notify()

    def _release(self, pod_uid: str) -> None:
        self._pods.pop(pod_uid, None)
        if pod_uid in self._admitted or pod_uid in self.assignments:
            log.info("node %s: pod %s is gone or finished; its devices are free", self.node, pod_uid)
        self._admitted.discard(pod_uid)
        self.admissions.pop(pod_uid, None)
        self.device_manager.remove_uid(pod_uid)
        if self.dra is not None:
            self.dra.pod_gone(pod_uid)
        self._notify()

    # --- admission ---

    def hold_admissions(self) -> None:
        """Queue new pods without admitting them until ``resume_admissions`` (a benchmark measures
        binding alone: on a real cluster admission runs on the node, not beside the control plane)."""
        self._admitting.clear()

    def resume_admissions(self) -> None:
        self._admitting.set()

    async def _admit_pods(self) -> None:
        while True:
            pod_uid = await self._queue.get()
            await self._admitting.wait()  # after the pod arrives: a hold set while waiting for it counts
            self._queued.discard(pod_uid)
            pod = self._pods.get(pod_uid)
            if pod is None or is_deleting(pod):
                continue
            if pod_uid in self._admitted:  # its claims not prepared yet, or the condition not written
                await self._let_run(pod)
                continue
            await self._admit(pod)

    async def _admit(self, pod: dict[str, Any]) -> None:
        pod_uid, meta = uid(pod), pod["metadata"]
        try:
            try:
                found = fake_pod(pod, self.settings.resource_name)
            except ValueError as err:
                raise AdmissionError(str(err)) from err
            admitted = await self.device_manager.admit(found)
        except AdmissionError as err:
            log.info("node %s: pod %s/%s refused: %s", self.node, meta["namespace"], meta["name"], err)
            self.rejections[pod_uid] = err.pod_message
            self._notify()
            await self._patch_pod(pod, rejected_patch(pod_uid, err.reason, err.pod_message))
            return
        if pod_uid not in self._pods:  # deleted while it was being admitted
            self.device_manager.remove_uid(pod_uid)
            return
        self._admitted.add(pod_uid)
        self.admissions[pod_uid] = admitted
        self._notify()
        await self._let_run(pod)

    async def _let_run(self, pod: dict[str, Any]) -> None:
        """What kubelet does before the sandbox: the pod's claims prepared (on their own, retried),
        then the condition that lets kwok run it."""
        if self.dra is None or self.dra.ready(pod):
            await self._patch_pod(pod, admitted_patch(uid(pod)))
        else:
            self.dra.start(uid(pod), self._pods.get, self._started)

    async def _started(self, pod_uid: str) -> None:
        pod = self._pods.get(pod_uid)
        if pod is not None:
            await self._patch_pod(pod, admitted_patch(pod_uid))

    async def _patch_pod(self, pod: dict[str, Any], body: dict[str, Any]) -> None:
        pod_uid = uid(pod)
        await patch_pod_status(self._api, pod, body, self.settings, lambda: pod_uid in self._pods)
