"""The extender's bind: reserve in the ledger, mirror onto the pod, create the Binding.

1. Know the pod: as this same caller's filter sent it moments ago (its assumption, made by the
   identified caller who now binds; filter takes only pods of our schedulers), or read afresh: its
   UID must be the one the scheduler names, its schedulerName one of ours, and it must not be
   bound yet, unless to this node by an earlier bind of ours (it holds its live reservation here:
   a retried bind succeeds again; any other bound pod is refused). An unidentified caller (plain
   HTTP) always gets the pod read afresh.
2. Reserve with ONE compare-and-set on the node's key: the cards filter chose for the pod while
   they still fit (else cards chosen again on the value being replaced; a MIG pod's instances are
   always chosen again there, by the MIG chooser: ``mig_fit.fit_mig``), kubelet device IDs
   assigned, ``reserve`` (a MIG instance's placement held in ``CardShare.mig``); the written
   value goes into placement's view at once; then claim the pod in the owner index. A pod that
   already holds a live reservation on this node (a retried bind) keeps it.
3. Create the Binding, carrying the allocation as its ``gpuledger.io/allocation`` annotation (the
   API server copies a Binding's annotations onto the pod in the same write). If the API server
   says the pod is bound already, to this node, the bind succeeded earlier: done. If the bind
   surely failed, release the reservation (no annotation was written).
   If it cannot be told (the API server stopped answering), the reservation stays: it expires with
   its lease unless kubelet admits the pod.
Either way the pod's assumption (filter's choice, ``assumed.py``) ends with the bind.
See docs/extender.md.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuledger_common.store import LedgerStore
from gpuledger_core.errors import Conflict, Exhausted, FailedPrecondition, GpuledgerError, NotFound, Unavailable
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, release
from gpuledger_core.model import Allocation, Owner, OwnerKind
from gpuledger_core.pods import Hint, PodAsk, hint_of, reserve_pod
from gpuledger_placement import convert
from gpuledger_placement.convert import BindArgs
from gpuledger_placement.hosts import HostUsage
from gpuledger_placement.kube import PodApi
from gpuledger_placement.metrics import ROLLBACKS
from gpuledger_placement.preemption_note import victim_left
from gpuledger_placement.service import PlacementService

log = logging.getLogger(__name__)
OWNER_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class Bound:
    allocation: Allocation | None  # None for a pod that wants no card
    again: bool  # the pod was bound to this node already (a retried bind)


@dataclass(slots=True)
class Binder:
    store: LedgerStore
    service: PlacementService
    pods: PodApi
    lease_s: float = 300.0
    clock: Callable[[], float] = time.time
    schedulers: frozenset[str] = frozenset({"gpuledger-scheduler"})  # the pods' schedulerName this binds
    hosts: HostUsage | None = None  # the guard's CPU and memory per node: a bound pod counts at once

    async def bind(self, args: BindArgs, caller: str) -> Bound:
        """Bind for ``caller`` (its client certificate's common name; '': unidentified)."""
        owner = Owner(OwnerKind.POD, args.uid)  # the key filter's assumption is under
        try:
            bound = await self._bind(args, caller)
        except BaseException:
            self.service.assumed.forget(owner, "failed")
            raise
        self.service.assumed.forget(owner, "bound")
        return bound

    async def _bind(self, args: BindArgs, caller: str) -> Bound:
        pod, bound_to = await self._pod(args, caller)
        if bound_to:
            return await self._bound_already(pod, args)
        if pod.owner.key in self.service.view.holders:  # its room may be held by a preemption
            await self._victims_gone(args)
        # A pod filter has just placed most likely holds nothing yet: its owner record is not
        # read first (the claim after the reservation finds one, should there be one).
        just_filtered = self.service.assumed.of(pod.owner) is not None
        just_filtered = just_filtered and pod.owner.key not in self.service.view.holders
        allocation = await self.reserve(pod, args.node, just_filtered) if pod.wants_cards else None
        annotations = None
        if allocation is not None:
            annotations = {convert.ALLOCATION_ANNOTATION: convert.allocation_annotation(allocation)}
        try:
            # The API server sets the node and the allocation annotation in one write.
            await self.pods.bind(args.namespace, args.name, args.uid, args.node, annotations)
        except GpuledgerError as err:
            if await self._bound_here(args):
                return Bound(allocation, again=True)
            if allocation is not None and not isinstance(err, Unavailable):
                await self.roll_back(allocation, f"bind failed: {err}")
            raise
        if self.hosts is not None:
            self.hosts.bound(args.uid, args.node, pod.cpu_milli, pod.memory_mib)
        return Bound(allocation, again=False)

    async def _pod(self, args: BindArgs, caller: str) -> tuple[PodAsk, str]:
        """What the pod asks, and the node it is bound to already ('' if none).

        A pod this caller's filter has just placed is taken as that filter read it from the
        caller's copy (its UID is the one bound, and the Binding itself refuses a pod bound
        meanwhile); any other pod (a retried bind, an assumption that expired, another replica's
        filter, another caller's filter, a caller without identity) is read afresh.
        """
        assumed = self.service.assumed.of(Owner(OwnerKind.POD, args.uid))
        if (
            assumed is not None
            and assumed.taken_by(caller)
            and (assumed.pod.owner.namespace, assumed.pod.owner.name) == (args.namespace, args.name)
        ):
            return assumed.pod, ""
        raw = await self.pods.get_pod(args.namespace, args.name)
        ref = convert.pod_ref_from(raw)
        if ref.uid != args.uid:
            raise Conflict(f"pod {args.namespace}/{args.name} is now uid {ref.uid}, not {args.uid}: it was recreated")
        if ref.node_name and ref.node_name != args.node:
            raise FailedPrecondition(f"pod {args.namespace}/{args.name} is bound to {ref.node_name} already")
        if ref.scheduler_name not in self.schedulers:
            raise FailedPrecondition(
                f"pod {args.namespace}/{args.name} names scheduler {ref.scheduler_name!r}; this extender binds "
                f"only pods of {', '.join(sorted(self.schedulers))}"
            )
        return self.service.resolve(convert.pod_ask_from(raw)), ref.node_name

    async def _victims_gone(self, args: BindArgs) -> None:
        """``Unavailable`` while a pod this one preempted still exists (in its grace period its
        containers may still use the cards held for this one): kube-scheduler tries again."""
        left = await victim_left(await self.pods.get_pod(args.namespace, args.name), self.pods.get_pod)
        if left:
            raise Unavailable(f"pod {left}, preempted for this one, has not ended yet")

    async def _bound_already(self, pod: PodAsk, args: BindArgs) -> Bound:
        """A pod bound to this node already. A retried bind of ours holds its live reservation here
        and succeeds again; a pod someone else bound is not gpuledger's to bind or to give cards to."""
        if not pod.wants_cards:
            return Bound(None, again=True)
        existing = await self._owned(pod.owner, args.node)
        if existing is None:
            raise FailedPrecondition(
                f"pod {args.namespace}/{args.name} is bound to {args.node} already, without a gpuledger "
                "reservation: someone else bound it, so gpuledger gives it no card"
            )
        return Bound(existing, again=True)

    async def reserve(self, pod: PodAsk, node: str, likely_new: bool = False) -> Allocation:
        """The pod's live reservation on ``node``: the one it has, or a new one (one CAS). With
        ``likely_new`` the first round does not look for one it has: a claim that finds the owner
        recorded already drops the new reservation and takes the recorded one, as for a race."""
        for round_no in range(OWNER_ROUNDS):
            existing = None if likely_new and round_no == 0 else await self._owned(pod.owner, node)
            if existing is not None:
                return existing
            allocation = await self._reserve_new(pod, node)
            if await self.store.claim_owner(pod.owner, allocation.id, node) is not None:
                return allocation
            # A concurrent bind of the same pod claimed it first: drop ours, take theirs.
            await self._release(allocation, "duplicate bind")
        raise Conflict(f"{pod.owner.describe()}: the owner index kept changing; retry")

    async def roll_back(self, allocation: Allocation, reason: str) -> None:
        """Release a reservation whose Binding surely failed (so its annotation was never written)."""
        log.warning("rolling back %s on %s: %s", allocation.id, allocation.node, reason)
        ROLLBACKS.inc()
        try:
            await self._release(allocation, reason)
            await self.store.forget_owner_of(allocation.owner, allocation.id)
        except GpuledgerError as err:  # the lease ends it anyway
            log.warning("roll-back of %s incomplete (%s); its lease will end it", allocation.id, err)

    async def _reserve_new(self, pod: PodAsk, node: str) -> Allocation:
        unreadable = self.service.view.unreadable.get(node)
        if unreadable is not None:
            raise Exhausted(f"{node}: its ledger value cannot be read ({unreadable}): nothing is placed here")
        if self.service.view.stale(node):
            raise Exhausted(f"{node}: node inventory is stale (no heartbeat)")
        key, policy = self.service.policies.get(pod.policy or self.service.policy)
        allocation_id = AllocationId(f"a-{secrets.token_hex(8)}")
        hint = self._hint(pod, node)
        chooser = self.service.policies.mig_chooser() if pod.mig else None

        def transition(ledger: NodeLedger | None) -> NodeLedger:
            if ledger is None:
                raise NotFound(f"node {node} is not in the ledger")
            if ledger.get(allocation_id) is not None:  # a write whose answer was lost went through
                return ledger
            return reserve_pod(
                ledger,
                pod,
                policy,
                allocation_id,
                now=self.clock(),
                lease_s=self.lease_s,
                slots_per_card=self.service.view.slots_per_card,
                hint=hint,
                mix_isolation=self.service.view.mix_isolation,
                chooser=chooser,
            )

        written = await self.store.mutate(node, transition)
        found = written.new.get(allocation_id) if written.new else None
        if found is None or written.new is None:
            raise Conflict(f"the reservation for {pod.owner.describe()} on {node} was not written")
        # Seen at once by filter (the watch brings the same revision later, and it is ignored).
        self.service.view.apply(NodeName(node), written.new, written.revision)
        log.info("reserved %s on %s for %s (policy %s)", allocation_id, node, pod.owner.describe(), key[0])
        return found

    def _hint(self, pod: PodAsk, node: str) -> Hint | None:
        """The cards filter chose for this very pod on this node, if it did."""
        assumed = self.service.assumed.of(pod.owner)
        if assumed is None or assumed.node != node or assumed.containers != pod.containers:
            return None
        return hint_of(assumed.allocation.grants)

    async def _owned(self, owner: Owner, node: str) -> Allocation | None:
        """The owner's live allocation on ``node``; one elsewhere, or a record of nothing, is dropped.
        With no record, the node's own ledger is asked too: a bind whose reservation was written but
        whose owner record was not (the owner stream had no leader yet) left one there, which the
        retry takes and records instead of reserving a second."""
        record = await self.store.owner_of(owner)
        if record is None:
            return await self._unrecorded(owner, node)
        allocation_id, where, revision = record
        ledger, _ = await self.store.read(where)
        found = ledger.get(allocation_id) if ledger else None
        if found is not None and not found.held_at(self.clock()):
            found = None  # released, or a lapsed reservation (the next write to its node releases it)
        if found is not None and where == node:
            return found
        if found is not None:
            await self._release(found, f"the scheduler bound the pod to {node} instead")
        await self.store.forget_owner(owner, revision)
        return None

    async def _unrecorded(self, owner: Owner, node: str) -> Allocation | None:
        if self.service.view.holders.get(owner.key) != node:  # the view knows of none: no read on the bind path
            return None
        ledger, _ = await self.store.read(node)
        found = ledger.of_owner(owner.key) if ledger is not None else None
        if found is None or await self.store.claim_owner(owner, found.id, node) is None:
            return None  # none there, or another bind of the pod recorded its own meanwhile
        log.info("took %s on %s for %s: reserved by an earlier bind, never recorded", found.id, node, owner.describe())
        return found

    async def _release(self, allocation: Allocation, reason: str) -> None:
        node, allocation_id = allocation.node, allocation.id

        def transition(ledger: NodeLedger | None) -> NodeLedger | None:
            if ledger is None or ledger.get(allocation_id) is None:
                return ledger
            return release(ledger, allocation_id, self.clock(), reason)

        await self.store.mutate(node, transition)

    async def _bound_here(self, args: BindArgs) -> bool:
        """Whether the pod is bound to the node now (a Binding that went through after all)."""
        try:
            ref = convert.pod_ref_from(await self.pods.get_pod(args.namespace, args.name))
        except GpuledgerError:
            return False
        return ref.uid == args.uid and ref.node_name == args.node
