"""The test kubelet's loops against the API server: the node's pods (list, then watch), the node's
device counts (patched into its status), and a pod status patch that outlasts a short outage.

Each loop runs until cancelled; every call has a deadline, and a call that gets no answer (or a 429
or 5xx) is tried again with jittered exponential back-off. What to do with what they see is the
caller's (``KwokKubelet``), passed in as plain callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from gpuledger_dev.controlplane.api import STRATEGIC, ApiError, KubeApi
from gpuledger_dev.fake_kubelet import FakeKubelet
from gpuledger_dev.kubelet_pods import node_devices_patch, uid

log = logging.getLogger(__name__)

GPU = "gpuledger.io/gpu"
UNREACHABLE = (aiohttp.ClientError, OSError, TimeoutError)  # no answer: try again later
PODS = "/api/v1/pods"


@dataclass(frozen=True, slots=True)
class KwokKubeletSettings:
    resource_name: str = GPU
    call_timeout_s: float = 10.0  # every API call
    watch_s: int = 60  # the server ends each pod watch after this; it is resumed at once
    rpc_timeout_s: float | None = 60.0  # Allocate and GetPreferredAllocation (kubelet: none)
    resync_s: float = 10.0  # the node's device counts are written again this often
    backoff_min_s: float = 0.1
    backoff_max_s: float = 5.0

    def __post_init__(self) -> None:
        if min(self.call_timeout_s, self.watch_s, self.resync_s, self.backoff_min_s) <= 0:
            raise ValueError("KwokKubeletSettings: call_timeout_s, watch_s, resync_s, backoff_min_s must be > 0")
        if self.backoff_max_s < self.backoff_min_s:
            raise ValueError("KwokKubeletSettings: backoff_max_s must be at least backoff_min_s")
        if self.rpc_timeout_s is not None and self.rpc_timeout_s <= 0:
            raise ValueError("KwokKubeletSettings: rpc_timeout_s must be > 0 (or None for no deadline)")


class Backoff:
    def __init__(self, settings: KwokKubeletSettings) -> None:
        self.low, self.high, self.delay = settings.backoff_min_s, settings.backoff_max_s, 0.0

    async def sleep(self) -> None:
        self.delay = min(max(self.delay * 2, self.low), self.high)
        await asyncio.sleep(self.delay * random.uniform(0.5, 1.0))

    def reset(self) -> None:
        self.delay = 0.0


def _retryable(err: ApiError) -> bool:
    return err.status == 429 or err.status >= 500


async def watch_pods(
    api: KubeApi,
    node: str,
    settings: KwokKubeletSettings,
    listed: Callable[[list[dict[str, Any]]], None],
    changed: Callable[[str, dict[str, Any]], None],
) -> None:
    """List the node's pods, then watch them from the list's resourceVersion; list again on 410 Gone
    (or any other refusal), watch again from where it stopped when the connection is lost."""
    backoff, version, selector = Backoff(settings), "", f"spec.nodeName={node}"
    while True:
        try:
            if not version:
                pods, version = await _list(api, selector)
                listed(pods)
            async for event in api.watch(PODS, version, settings.watch_s, fieldSelector=selector):
                version = _version_after(event, changed) or version
                backoff.reset()
        except ApiError as err:
            version = ""
            if err.status != 410:
                log.warning("node %s: watching pods failed, will list again: %s", node, err)
                await backoff.sleep()
        except UNREACHABLE as err:
            log.warning("node %s: the API server is unreachable, will watch again: %r", node, err)
            await backoff.sleep()


async def _list(api: KubeApi, selector: str) -> tuple[list[dict[str, Any]], str]:
    pods: list[dict[str, Any]] = []
    page_from: dict[str, str] = {}
    while True:
        page = await api.get(PODS, fieldSelector=selector, limit="500", **page_from)
        pods += page.get("items") or []
        meta = page.get("metadata") or {}
        if not meta.get("continue"):
            return pods, str(meta.get("resourceVersion", ""))
        page_from = {"continue": str(meta["continue"])}


def _version_after(event: dict[str, Any], changed: Callable[[str, dict[str, Any]], None]) -> str:
    kind, pod = str(event.get("type", "")), event.get("object") or {}
    if kind == "ERROR":  # a Status; 410 Gone when our resourceVersion is too old
        raise ApiError(int(pod.get("code") or 500), "WATCH", PODS, json.dumps(pod))
    if kind in ("ADDED", "MODIFIED", "DELETED"):
        changed(kind, pod)
    return str((pod.get("metadata") or {}).get("resourceVersion", ""))


async def write_node_devices(
    api: KubeApi,
    node: str,
    settings: KwokKubeletSettings,
    devices: FakeKubelet,
    seen: Callable[[], None],
    written: Callable[[tuple[int, int]], None],
) -> None:
    """Patch the node's capacity (all devices) and allocatable (healthy ones) of every resource the
    plugin registered (``resource_name``, and the MIG resources beside it) once it has registered
    ``resource_name``, whenever a device list changes and every ``resync_s``."""
    backoff, generation = Backoff(settings), -1
    path = f"/api/v1/nodes/{node}/status"

    def moved(k: FakeKubelet) -> bool:
        return k.generation != generation

    while True:
        if devices.generation != generation:
            generation = devices.generation
            seen()
        if devices.registrations:
            counts = (len(devices.devices), len(devices.healthy()))
            every = {settings.resource_name: counts} | {
                name: (len(e.devices), len(e.healthy()))
                for name, e in devices.endpoints.items()
                if e.registrations and name != settings.resource_name
            }
            try:
                await api.patch(path, node_devices_patch(every), STRATEGIC)
            except (ApiError, *UNREACHABLE) as err:
                log.warning("node %s: writing the device counts failed, will retry: %r", node, err)
                await backoff.sleep()
                continue
            backoff.reset()
            written(counts)
        with contextlib.suppress(TimeoutError):
            await devices.wait_for(moved, within=settings.resync_s)


async def patch_pod_status(
    api: KubeApi, pod: dict[str, Any], body: dict[str, Any], settings: KwokKubeletSettings, wanted: Callable[[], bool]
) -> None:
    """Patch ``pods/{name}/status``, trying again while the API server is away and ``wanted()``;
    a 404, or a 409 on the UID in ``body``, means the pod is not the one we mean any more."""
    meta, backoff = pod["metadata"], Backoff(settings)
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
    while wanted():
        try:
            await api.patch(path, body, STRATEGIC)
            return
        except ApiError as err:
            if not _retryable(err):
                log.info("pod %s/%s (%s) not patched: %s", meta["namespace"], meta["name"], uid(pod), err)
                return
            log.warning("patching pod %s/%s failed, will retry: %s", meta["namespace"], meta["name"], err)
        except UNREACHABLE as err:
            log.warning("patching pod %s/%s failed, will retry: %r", meta["namespace"], meta["name"], err)
        await backoff.sleep()
