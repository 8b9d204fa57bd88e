"""The node policies by name, measured against the recent workload and rebuilt now and then.

``fgd`` and ``default`` score fragmentation against the typical pods of the recent asks; ``default``
also weighs the card models against the fleet's cards per model (``supply``: the models that pods
naming models press are left to them). A rebuilt policy gets a new generation, so answers cached
under the old one are not reused.

MIG asks are counted apart (``MigAsks``: the profiles recently asked for), never as typical pods
(they take no memory share); the MIG chooser (``mig_place.MigChooser``) is rebuilt with them, in the
same generation as the policies, and placement's filter, prioritize and bind choose MIG placements
with it (docs/mig.md, "How placement places MIG").
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping

from gpuledger_core.fit import ContainerAsk
from gpuledger_core.mig_place import MigAsks, MigChooser
from gpuledger_core.model import Allocation
from gpuledger_core.packing import Policy, WorkloadTracker, make_policy, typical
from gpuledger_core.pods import PodAsk

SEEN_OWNERS = 10_000  # pods remembered so a pod filtered again is counted once
PolicyKey = tuple[str, int]


class Policies:
    def __init__(
        self,
        tracker: WorkloadTracker,
        card_memory: Callable[[], int],
        refresh_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        supply: Callable[[], Mapping[str, int]] = dict,
        mig_asks: MigAsks | None = None,
    ) -> None:
        self.tracker, self.card_memory, self.refresh_s, self.clock = tracker, card_memory, refresh_s, clock
        self.supply = supply
        self.mig_asks = mig_asks if mig_asks is not None else MigAsks()
        self._chooser: MigChooser | None = None
        self._mig_version = 0
        self.generation = 0
        self._built: dict[str, Policy] = {}
        self._typical_version = 0
        self._refreshed_at = clock()
        self._owners: OrderedDict[str, None] = OrderedDict()
        self._memory = 0

    def get(self, name: str) -> tuple[PolicyKey, Policy]:
        """The policy called ``name`` (``InvalidArgument`` if there is none) and its cache key."""
        self._maybe_refresh()
        policy = self._built.get(name)
        if policy is None:
            typical_pods = self.tracker.seen() if name in ("fgd", "default") else ()
            supply = self.supply() if name == "default" else None
            policy = self._built[name] = make_policy(name, typical_pods, supply)
        return (name, self.generation), policy

    def mig_chooser(self) -> MigChooser:
        """The MIG chooser of this generation, weighing the MIG asks seen until its refresh."""
        self._maybe_refresh()
        if self._chooser is None:
            self._chooser = MigChooser(self.mig_asks.workload())
        return self._chooser

    def observe(self, pod: PodAsk) -> None:
        """Count the pod in the workload, once however often it is asked about: a pod with MIG
        asks in the MIG asks (each MIG container's instances), any other as a typical pod."""
        ask = pod.main()
        if ask is None or pod.owner.key in self._owners:
            return
        self._owners[pod.owner.key] = None
        if len(self._owners) > SEEN_OWNERS:
            self._owners.popitem(last=False)
        if pod.mig:
            for container in pod.containers:
                if container.request.mig:
                    self.mig_asks.observe(container.request)
            return
        if not self._memory:
            self._memory = self.card_memory()
        self.tracker.observe(typical(ask, self._memory))

    def seed(self, allocations: Iterable[Allocation]) -> int:
        """Count the live allocations in the ledger as the recent workload (oldest first) and
        rebuild the policies at once: after a restart ``fgd`` and ``default`` measure against what
        the cluster runs instead of nothing. The ledger keeps no pod CPU or memory, so these pods
        count their cards only, until asks seen afresh take their place. Returns how many."""
        counted = 0
        for allocation in sorted((a for a in allocations if a.live), key=lambda a: a.created_at):
            if len(allocation.requests) != len(allocation.grants):
                continue  # an allocation written without its requests: its shape is unknown
            containers = tuple(
                ContainerAsk(grant.container, request, grant.init)
                for grant, request in zip(allocation.grants, allocation.requests, strict=True)
            )
            before = (self.tracker.version, self.mig_asks.version)
            self.observe(PodAsk(allocation.owner, containers))
            counted += (self.tracker.version, self.mig_asks.version) != before
        self.refresh()
        return counted

    def refresh(self) -> None:
        """Take in the asks seen so far now (normally every ``refresh_s``)."""
        self._built.clear()
        self._chooser = None
        self.generation += 1
        self._typical_version = self.tracker.version
        self._mig_version = self.mig_asks.version
        self._refreshed_at = self.clock()
        self._memory = 0

    def _maybe_refresh(self) -> None:
        changed = self.tracker.version != self._typical_version or self.mig_asks.version != self._mig_version
        if changed and self.clock() - self._refreshed_at >= self.refresh_s:
            self.refresh()
