"""Preemption for pods whose claims kube-scheduler allocates (DRA mode B; docs/preemption.md).

kube-scheduler has no preemption for devices (KEP-5690 is not merged): a pod whose claim finds no
device with room in its count of the slices stays ``Unschedulable`` however low the holders of
those devices are. The ledger knows each holder, so placement preempts for such a pod as it does
for a mode-C claim (``Preemptor.consider_claim``: the same victims, evicted through the Eviction
API, the mode-B victims' claims vetoed, the room held in the ledger for the claim).

For an unscheduled pod that kube-scheduler marked ``PodScheduled=False`` (reason
``Unschedulable``), not gated and naming claims, each claim not allocated yet that asks for the
driver's DeviceClasses (every one of them, mode B's too) is planned on the ledger as mode C
would place it: where it fits on no node the pod's host takes, the preemption is started for it.
Where it fits, kube-scheduler's refusal is not for cards and nothing is done. Once the victims'
claims are deallocated, kube-scheduler allocates the claim again, first fit: the freed room is
the only room for it, and the claims controller's commit of that allocation takes the held room
(``ClaimsController._reserve`` releases the claim's own entry first). Each pod is looked at once
every ``retry_s`` at most.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuledger_core.claim_asks import ClaimAsk, claim_ask
from gpuledger_core.claim_placement import Host, place_claim
from gpuledger_core.claims import ClaimRef
from gpuledger_core.errors import Exhausted, GpuledgerError, InvalidArgument, NotFound
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.packing import Policy
from gpuledger_placement.claim_classes import ModeCClasses
from gpuledger_placement.claim_pods import claim_names, describe
from gpuledger_placement.claims import ClaimsController, claim_path
from gpuledger_placement.convert import pod_ask_from
from gpuledger_placement.host_fit import host_refusal
from gpuledger_placement.hosts import HostUsage
from gpuledger_placement.unscheduled import follow_unscheduled
from gpuledger_placement.view import FleetView

log = logging.getLogger(__name__)
RETRY_S = 10.0  # a pod looked at again at most this often


class PodsApi(Protocol):
    async def get_object(self, path: str) -> dict[str, Any]: ...
    async def list_objects(self, path: str, params: Mapping[str, str]) -> dict[str, Any]: ...
    def watch(self, path: str, params: Mapping[str, str]) -> Any: ...


def unschedulable(pod: Mapping[str, Any]) -> bool:
    """Unbound, not gated, naming claims, and refused by kube-scheduler's last try."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName") or spec.get("schedulingGates") or not spec.get("resourceClaims"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in conditions
    )


@dataclass(slots=True)
class ModeBPreemption:
    api: PodsApi
    claims: ClaimsController
    view: FleetView
    policy: Callable[[], Policy]
    preempt: Callable[[Mapping[str, Any], ClaimAsk, list[str]], None]  # ``Preemptor.consider_claim``
    hosts: HostUsage | None = None
    clock: Callable[[], float] = time.time
    retry_s: float = RETRY_S
    _classes: ModeCClasses = field(init=False)
    _looked: dict[str, float] = field(default_factory=dict)  # pod uid -> when it was last looked at
    _busy: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._classes = ModeCClasses(self.api, self.claims.driver, self.clock, scheduler_too=True)

    async def run(self) -> None:
        """Follow the unscheduled pods (where mode C's allocator does not, which offers them)."""
        await self.view.ready.wait()
        await follow_unscheduled(self.api, lambda pod, gone: None if gone else self.offer(pod), RETRY_S, "preemption")

    def offer(self, pod: Mapping[str, Any]) -> None:
        """Look at the pod in the background if kube-scheduler refused it and it was not looked at
        within ``retry_s``."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        now = self.clock()
        if not uid or not unschedulable(pod) or uid in self._busy or now - self._looked.get(uid, -1e18) < self.retry_s:
            return
        self._looked[uid] = now
        for old in [u for u, at in self._looked.items() if now - at > 10 * self.retry_s]:
            del self._looked[old]
        self._busy[uid] = asyncio.create_task(self._look(pod))

    async def idle(self) -> None:
        while self._busy:
            await asyncio.gather(*list(self._busy.values()), return_exceptions=True)

    async def _look(self, pod: Mapping[str, Any]) -> None:
        uid = str(pod["metadata"]["uid"])
        try:
            host = host_refusal(pod, self.hosts, self.view)
            ask = await self._short(pod, host)
            if ask is not None:
                log.debug("preemption (mode B): %s of pod %s fits on no node", ask.ref.describe(), describe(pod))
                self.preempt(pod, ask, [n for n in sorted(self.view.entries) if not host(NodeName(n))])
        except GpuledgerError as err:
            log.warning("preemption (mode B): pod %s not looked at (%s)", describe(pod), err)
        finally:
            del self._busy[uid]

    async def _short(self, pod: Mapping[str, Any], host: Host) -> ClaimAsk | None:
        """The first of the pod's unallocated claims of the driver that fits on no node its host
        takes; None where every one fits (or none is the driver's)."""
        names = claim_names(pod)
        if not names:
            return None  # a template's claim is not made yet: kube-scheduler waits for it too
        namespace = str(pod["metadata"]["namespace"])
        classes = await self._classes.get()
        asked, now = pod_ask_from(pod), self.clock()
        for name in names:
            try:
                raw = self.claims.cache.seen(namespace, name) or await self.api.get_object(
                    claim_path(ClaimRef(namespace, name, ""))
                )
            except NotFound:
                return None  # kube-scheduler waits for it too
            if (raw.get("status") or {}).get("allocation"):
                continue
            try:
                ask = claim_ask(raw, classes, self.claims.driver, self.claims.memory_step_mib)
            except InvalidArgument:
                continue  # nothing the ledger would place: kube-scheduler's alone
            if ask is None:
                continue
            try:
                place_claim(
                    self.view.fresh_ledgers(), ask, self.policy(), AllocationId("b-planned"), now,
                    slots_per_card=self.view.slots_per_card, host=host, mix_isolation=self.view.mix_isolation,
                    cpu_milli=asked.cpu_milli, memory_mib=asked.memory_mib,
                )  # fmt: skip
            except Exhausted:
                return ask
        return None
