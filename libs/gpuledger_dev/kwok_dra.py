"""kubelet's DRA manager for one kwok node (``KwokKubelet(..., dra=KwokDraSettings(...))``).

For a pod with ``spec.resourceClaims`` that the node's kubelet has admitted, this is what runs
before the pod may start (kubelet's ``PrepareDynamicResources`` before the sandbox):

1. each claim's name is resolved (``resourceClaimName``, or a template's generated claim from
   ``status.resourceClaimStatuses``, which must be controlled by the pod), the claim is read from
   the API server and must be allocated and list the pod's UID in ``status.reservedFor``; every
   driver of its allocation must have a registered plugin;
2. the claims enter the claim cache with the pod as a user (before any call, so that a pod
   deleted meanwhile still gets its claims unprepared); claims already prepared are skipped;
3. one NodePrepareResources per driver (45 s): every claim must be answered without an error,
   every device must be one of the claim's allocation results, and every CDI id must resolve to a
   device of a spec in ``cdi_dir``. Then the claims are prepared and the pod may start.

Any failure is recorded (``failures[pod uid]``, and a Warning Event ``FailedPrepareDynamicResources``
per distinct message, worded as kubelet's) and the whole step is tried again with back-off; the
pod is never failed for it. A pod that is deleted, finished or gone from a listing stops using its
claims; a claim no local pod uses is unprepared (NodeUnprepareResources, retried until it works)
and leaves the cache. ``restart()`` keeps the cache (kubelet's checkpoint) but forgets which
claims were prepared and which plugins registered (kubelet's in-memory state): pods that had not
started are prepared again (a repeat the plugin answers idempotently), started ones are not.
With ``wipe_slices`` the node's ResourceSlices are deleted as kubelet deletes them (the drivers
publish them again): all at every start, a driver's ``wipe_delay_s`` after its plugin went.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from gpuledger_dev.controlplane.api import ApiError, KubeApi
from gpuledger_dev.kubelet_pods import is_deleting
from gpuledger_dev.kwok_dra_claims import (
    FAILED_PREPARE,
    ClaimInfo,
    PodClaim,
    PrepareError,
    claim_drivers,
    container_cdi_ids,
    failed_prepare_event,
    foreign_devices,
    has_claims,
    pod_claims,
    unresolved,
)
from gpuledger_dev.kwok_dra_plugins import DraPlugin, KwokDraSettings, PluginWatcher
from gpuledger_dev.kwok_sync import UNREACHABLE, Backoff, KwokKubeletSettings

__all__ = ["FAILED_PREPARE", "KwokDra", "KwokDraSettings"]

log = logging.getLogger(__name__)

CLAIM = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"

PodOf = Callable[[str], dict[str, Any] | None]
Started = Callable[[str], Awaitable[None]]


class KwokDra:
    def __init__(
        self,
        node: str,
        settings: KwokDraSettings,
        api: KubeApi,
        kubelet: KwokKubeletSettings,
        changed: Callable[[], None],
    ) -> None:
        self.node, self.settings, self._api, self._kubelet, self._changed = node, settings, api, kubelet, changed
        self.watcher = PluginWatcher(settings, changed, self._plugin_moved)
        self.claims: dict[tuple[str, str], ClaimInfo] = {}  # (namespace, name) -> kubelet's claim info
        self.failures: dict[str, str] = {}  # pod uid -> why its claims are not prepared (the last try)
        self.attempts: dict[str, int] = {}  # pod uid -> how many times its claims were tried
        self.prepare_calls: list[tuple[str, ...]] = []  # the claim UIDs of every NodePrepareResources
        self.unprepare_calls: list[tuple[str, ...]] = []  # and of every NodeUnprepareResources
        self.wipes = 0  # how many times (some of) the node's ResourceSlices were deleted
        self._ready: set[str] = set()  # pods whose claims were prepared since the last start
        self._events: dict[str, str] = {}  # pod uid -> the last message written as an Event
        self._tasks: dict[str, asyncio.Task[None]] = {}  # pod uid -> its prepare loop
        self._group: asyncio.TaskGroup | None = None
        self._locks: dict[str, asyncio.Lock] = {}  # claim uid -> held across its plugin calls
        self._idle = asyncio.Event()  # a claim may have lost its last user
        self._wipes: dict[str, asyncio.Task[None]] = {}  # driver -> its slices' pending deletion

    # --- what tests look at ---

    @property
    def plugins(self) -> dict[str, DraPlugin]:
        return dict(self.watcher.plugins)

    @property
    def registrations(self) -> int:
        return self.watcher.registrations

    def ready(self, pod: dict[str, Any]) -> bool:
        """The pod may start as far as DRA goes: it uses no claim, or its claims were prepared."""
        return not has_claims(pod) or str(pod["metadata"]["uid"]) in self._ready

    def users(self) -> set[str]:
        """Every pod uid the claim cache holds as a user."""
        return {uid for info in self.claims.values() for uid in info.pods}

    def cdi_ids(self, pod: dict[str, Any], container: str) -> list[str]:
        """The CDI ids the container would be started with."""
        return container_cdi_ids(pod, container, self.claims)

    # --- life cycle (inside the kubelet's task group) ---

    def begin(self, group: asyncio.TaskGroup) -> None:
        """Start watching the registration directory and unpreparing, in the kubelet's task group."""
        self._group = group
        group.create_task(self.watcher.run(), name=f"kwok-dra-plugins-{self.node}")
        group.create_task(self._unprepare_idle(), name=f"kwok-dra-unprepare-{self.node}")
        if self.settings.wipe_slices:
            group.create_task(self._wipe_slices(), name=f"kwok-dra-wipe-{self.node}")

    def end(self) -> None:
        """The kubelet's task group is done (its tasks are cancelled)."""
        self._group = None
        self._tasks.clear()
        self._wipes.clear()

    def restart(self) -> None:
        """After the kubelet's task group ended: kubelet's memory goes, its checkpoint (the cache) stays."""
        self.watcher.forget()
        for info in self.claims.values():
            info.prepared = False
        self._ready.clear()

    def close(self) -> None:
        self.watcher.forget()

    # --- pods ---

    def start(self, pod_uid: str, pod_of: PodOf, started: Started) -> None:
        """Prepare the pod's claims (again and again until it works), then ``await started(uid)``."""
        if pod_uid in self._tasks or self._group is None:
            return
        task = self._group.create_task(self._prepare_until_done(pod_uid, pod_of, started))
        self._tasks[pod_uid] = task

    def pod_gone(self, pod_uid: str) -> None:
        """The pod was deleted or finished: it uses its claims no more."""
        task = self._tasks.pop(pod_uid, None)
        if task is not None:
            task.cancel()
        self._ready.discard(pod_uid)
        self.failures.pop(pod_uid, None)
        self._events.pop(pod_uid, None)
        for info in self.claims.values():
            if pod_uid in info.pods:
                info.pods.discard(pod_uid)
                self._idle.set()

    async def _prepare_until_done(self, pod_uid: str, pod_of: PodOf, started: Started) -> None:
        backoff = Backoff(self._kubelet)
        try:
            while (pod := pod_of(pod_uid)) is not None and not is_deleting(pod):
                self.attempts[pod_uid] = self.attempts.get(pod_uid, 0) + 1
                try:
                    await self._prepare(pod)
                except PrepareError as err:
                    await self._failed(pod, f"prepare dynamic resources: {err}")
                    await backoff.sleep()
                    continue
                self.failures.pop(pod_uid, None)
                self._ready.add(pod_uid)
                self._changed()
                await started(pod_uid)
                return
        finally:
            if self._tasks.get(pod_uid) is asyncio.current_task():
                del self._tasks[pod_uid]

    async def _failed(self, pod: dict[str, Any], message: str) -> None:
        meta = pod["metadata"]
        log.info("node %s: pod %s/%s cannot start yet: %s", self.node, meta["namespace"], meta["name"], message)
        self.failures[meta["uid"]] = message
        self._changed()
        if self._events.get(meta["uid"]) != message:
            self._events[meta["uid"]] = message
            await self._event(pod, message)

    async def _event(self, pod: dict[str, Any], message: str) -> None:
        body = failed_prepare_event(pod, self.node, message, datetime.now(UTC))
        try:
            await self._api.create(f"/api/v1/namespaces/{pod['metadata']['namespace']}/events", body)
        except (ApiError, *UNREACHABLE) as err:  # events are best effort, as kubelet's are
            log.info("node %s: event for pod %s not written: %r", self.node, pod["metadata"]["name"], err)

    def _plugin_moved(self, driver: str, registered: bool) -> None:
        """kubelet deletes a driver's slices ``wipe_delay_s`` after its plugin went, unless it is back."""
        pending = self._wipes.pop(driver, None)
        if pending is not None:
            pending.cancel()
        if not registered and self.settings.wipe_slices and self._group is not None:
            self._wipes[driver] = self._group.create_task(self._wipe_later(driver))

    async def _wipe_later(self, driver: str) -> None:
        await asyncio.sleep(self.settings.wipe_delay_s)
        del self._wipes[driver]
        await self._wipe_slices(driver)

    async def _wipe_slices(self, driver: str = "") -> None:
        """Delete the node's ResourceSlices (of one driver, or all: kubelet's start); the drivers
        publish them again."""
        selector = f"spec.nodeName={self.node}" + (f",spec.driver={driver}" if driver else "")
        backoff = Backoff(self._kubelet)
        while True:
            try:
                await self._api.call("DELETE", SLICES, params={"fieldSelector": selector})
            except (ApiError, *UNREACHABLE) as err:
                log.info("node %s: deleting ResourceSlices (%s) failed, will retry: %r", self.node, selector, err)
                await backoff.sleep()
                continue
            self.wipes += 1
            log.info("node %s: ResourceSlices deleted (%s)", self.node, selector)
            self._changed()
            return

    # --- prepare ---

    async def _prepare(self, pod: dict[str, Any]) -> None:
        """One try at kubelet's ``prepareResources``; PrepareError says why it did not work."""
        wanted: list[tuple[dict[str, Any], frozenset[str]]] = []
        for pod_claim in pod_claims(pod):
            claim = await self._claim(pod, pod_claim)
            drivers = claim_drivers(pod, claim, pod_claim.generated)
            missing = sorted(drivers - set(self.watcher.plugins))
            if missing:
                raise PrepareError(f"DRA driver {missing[0]} is not registered")
            wanted.append((claim, drivers))
        infos = [(self._enter(pod, claim, drivers), claim) for claim, drivers in wanted]
        async with self._locked(i.uid for i, _ in infos):
            fresh = {i.uid: claim for i, claim in infos if not i.prepared}
            batches: dict[str, list[ClaimInfo]] = {}
            for info, _ in infos:
                for driver in sorted(info.drivers) if info.uid in fresh else ():
                    batches.setdefault(driver, []).append(info)
            for driver, batch in batches.items():
                await self._prepare_batch(driver, batch, fresh)
            for info, _ in infos:
                info.prepared = True

    @contextlib.asynccontextmanager
    async def _locked(self, uids: Iterable[str]) -> AsyncIterator[None]:
        """The claims' locks, in one order: a claim is never prepared and unprepared at once."""
        async with contextlib.AsyncExitStack() as stack:
            for claim_uid in sorted(set(uids)):
                await stack.enter_async_context(self._locks.setdefault(claim_uid, asyncio.Lock()))
            yield

    async def _claim(self, pod: dict[str, Any], pod_claim: PodClaim) -> dict[str, Any]:
        path = CLAIM.format(ns=pod["metadata"]["namespace"], name=pod_claim.claim)
        try:
            found: dict[str, Any] = await self._api.get(path)
        except (ApiError, *UNREACHABLE) as err:
            raise PrepareError(f"fetch ResourceClaim {pod_claim.claim}: {err}") from err
        return found

    def _enter(self, pod: dict[str, Any], claim: dict[str, Any], drivers: frozenset[str]) -> ClaimInfo:
        meta = claim["metadata"]
        info = self.claims.get(_key(claim))
        if info is None:
            info = ClaimInfo(str(meta["uid"]), str(meta["namespace"]), str(meta["name"]), drivers)
            self.claims[_key(claim)] = info
        elif info.uid != meta["uid"]:
            raise PrepareError(
                f"old ResourceClaim with same name {meta['name']} and different UID {info.uid} still exists"
                " (previous pod force-deleted?!)"
            )
        info.pods.add(str(pod["metadata"]["uid"]))
        return info

    async def _prepare_batch(self, driver: str, infos: list[ClaimInfo], claims: dict[str, dict[str, Any]]) -> None:
        plugin = self.watcher.plugins.get(driver)
        if plugin is None:
            raise PrepareError(f"DRA driver {driver} is not registered")
        refs = [(i.namespace, i.uid, i.name) for i in infos]
        self.prepare_calls.append(tuple(i.uid for i in infos))
        answers = await plugin.prepare(refs)
        names = {i.uid: i.name for i in infos}
        for claim_uid, answer in answers.items():
            if claim_uid not in names:
                raise PrepareError(f"NodePrepareResources returned result for unknown claim UID {claim_uid}")
            if answer.error:
                raise PrepareError(f"NodePrepareResources failed for ResourceClaim {names[claim_uid]}: {answer.error}")
            wrong = foreign_devices(claims[claim_uid], driver, answer.devices)
            if wrong:
                raise PrepareError(f"NodePrepareResources gave {names[claim_uid]} devices not allocated to it: {wrong}")
        if len(answers) != len(infos):
            raise PrepareError(f"NodePrepareResources skipped {len(infos) - len(answers)} ResourceClaims")
        ids = [cdi for a in answers.values() for d in a.devices for cdi in d.cdi_ids]
        missing = unresolved(ids, await asyncio.to_thread(_specs, self.settings.cdi_dir))
        if missing:
            raise PrepareError(f"unresolvable CDI devices {', '.join(missing)} (no spec in {self.settings.cdi_dir})")
        for info in infos:
            info.devices[driver] = answers[info.uid].devices

    # --- unprepare ---

    async def _unprepare_idle(self) -> None:
        backoff = Backoff(self._kubelet)
        while True:
            idle = [info for info in self.claims.values() if not info.pods]
            if not idle:
                self._idle.clear()
                await self._idle.wait()
                continue
            try:
                await self._unprepare(idle)
            except PrepareError as err:
                log.warning("node %s: unprepare dynamic resources failed, will retry: %s", self.node, err)
                await backoff.sleep()
                continue
            backoff.reset()

    async def _unprepare(self, idle: list[ClaimInfo]) -> None:
        async with self._locked(i.uid for i in idle):
            infos = [i for i in idle if not i.pods and self.claims.get((i.namespace, i.name)) is i]
            batches: dict[str, list[ClaimInfo]] = {}
            for info in infos:
                info.prepared = False  # a pod that comes now prepares it again, after this
                for driver in info.drivers:
                    batches.setdefault(driver, []).append(info)
            for driver, batch in sorted(batches.items()):
                await self._unprepare_batch(driver, batch)
            for info in infos:
                if not info.pods:
                    del self.claims[(info.namespace, info.name)]
                    self._locks.pop(info.uid, None)
                    log.info("node %s: claim %s/%s unprepared", self.node, info.namespace, info.name)
        self._changed()

    async def _unprepare_batch(self, driver: str, batch: list[ClaimInfo]) -> None:
        plugin = self.watcher.plugins.get(driver)
        if plugin is None:
            raise PrepareError(f"DRA driver {driver} is not registered")
        self.unprepare_calls.append(tuple(i.uid for i in batch))
        errors = await plugin.unprepare([(i.namespace, i.uid, i.name) for i in batch])
        for info in batch:
            if info.uid not in errors:
                raise PrepareError(f"NodeUnprepareResources skipped ResourceClaim {info.name}")
            if errors[info.uid]:
                raise PrepareError(f"NodeUnprepareResources failed for ResourceClaim {info.name}: {errors[info.uid]}")


def _key(claim: dict[str, Any]) -> tuple[str, str]:
    return str(claim["metadata"]["namespace"]), str(claim["metadata"]["name"])


def _specs(directory: str) -> list[dict[str, Any]]:
    """The CDI specs (JSON) in ``directory``; unreadable ones are left out, as a runtime would."""
    found: list[dict[str, Any]] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            if entry.name.endswith(".json") and entry.is_file():
                with contextlib.suppress(OSError, ValueError):
                    with open(entry.path, encoding="utf-8") as file:
                        spec = json.load(file)
                    if isinstance(spec, dict):
                        found.append(spec)
    return found
