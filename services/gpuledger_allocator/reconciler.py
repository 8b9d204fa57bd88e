"""Reconciling the ledger with Kubernetes: every ``reconcile_interval_s``, and at once (at most
every ``MIN_GAP_S``) when a followed pod ends or goes away.

Each round compares every node's ledger with the pods in the watch's cache (``PodCache``; no API
request) and, for each node the comparison would change, applies ``reconcile.reconciled`` in one
compare-and-set: allocations of deleted or finished pods are released, allocations a lost bucket
forgot are rebuilt from the pods' annotations. A pod the ledger holds cards for that the cache does
not show (the watch selects pods by scheduler name; a pod of another scheduler, or one just created)
is read by name before its allocation is released: only a pod that is really gone, or finished,
loses its cards. A cache that is not synced, or a read that fails, changes nothing this round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuledger_allocator.kube import PodLister
from gpuledger_allocator.metrics import POD_READS, REBUILD_CONFLICTS, REBUILT, RELEASED, ROUNDS
from gpuledger_allocator.podcache import PodCache
from gpuledger_allocator.repairs import POD_DELETED, Listing, Outcome, PodSeen, reconciled, release_reason
from gpuledger_allocator.view import ClusterView
from gpuledger_common.store import LedgerStore, Written
from gpuledger_core.errors import GpuledgerError
from gpuledger_core.ids import AllocationId, NodeName, PodUid
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Owner

log = logging.getLogger(__name__)
MIN_GAP_S = 1.0


@dataclass(slots=True)
class Reconciler:
    store: LedgerStore
    view: ClusterView
    pods: PodLister
    cache: PodCache
    grace_s: float
    clock: Callable[[], float] = time.time
    _outside: set[PodUid] = field(default_factory=set)  # pods read by name, already logged

    async def run(self, interval_s: float) -> None:
        while True:
            await self.round()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):  # not wait_for: it can swallow a cancel
                    await self.cache.changed.wait()
            await asyncio.sleep(MIN_GAP_S)  # a burst of deletions makes one round, not many
            self.cache.changed.clear()

    async def round(self) -> bool:
        """One comparison and its repairs; False when the pods are not known now (nothing changed)."""
        if not self.cache.synced:
            log.debug("the pod watch is not synced: nothing reconciled this round")
            return False
        started = self.clock()
        listing = Listing.of(self.cache.pods.values(), started)
        try:
            listing = await self._confirmed(listing)
        except GpuledgerError as err:
            log.warning("cannot read a pod, nothing reconciled this round: %s", err)
            return False
        ROUNDS.inc()
        for node, ledger in list(self.view.ledgers.items()):
            if _changes(reconciled(ledger, listing, self.grace_s, self.clock())):
                await self._node(node, listing)
        return True

    async def _confirmed(self, listing: Listing) -> Listing:
        """The listing with the pods it lacks but the ledger holds cards for, read one by one: those
        that exist (another scheduler's, or not seen by the watch yet) are added."""
        missing = {
            allocation.owner
            for ledger in self.view.ledgers.values()
            for allocation in ledger.live()
            if release_reason(allocation, listing, self.grace_s) == POD_DELETED
        }
        found: list[PodSeen] = []
        for owner in missing:
            if not (owner.namespace and owner.name):
                continue  # nothing to read it by: the cache decides
            POD_READS.inc()
            pod = await self.pods.get_pod(owner.namespace, owner.name)
            if pod is None or pod.uid != owner.id:
                continue
            found.append(pod)
            if pod.uid not in self._outside:
                self._outside.add(pod.uid)
                log.warning(
                    "pod %s/%s holds cards but is not among the pods followed (reconcile_field_selector); "
                    "it is read by name each round",
                    owner.namespace,
                    owner.name,
                )
        if not found:
            return listing
        return Listing.of([*listing.pods.values(), *found], listing.started_at)

    async def _node(self, node: NodeName, listing: Listing) -> None:
        outcome: Outcome | None = None

        def transition(ledger: NodeLedger | None) -> NodeLedger | None:
            nonlocal outcome
            outcome = None if ledger is None else reconciled(ledger, listing, self.grace_s, self.clock())
            return ledger if outcome is None else outcome.ledger

        try:
            written = await self.store.mutate(node, transition)
        except GpuledgerError as err:  # NATS away or the key kept changing: next round
            log.warning("could not reconcile the ledger of %s: %s", node, err)
            return
        if outcome is not None:
            await self._report(node, outcome, written)

    async def _report(self, node: NodeName, outcome: Outcome, written: Written) -> None:
        for allocation_id, reason in outcome.released:
            RELEASED.labels(reason).inc()
            found = written.old.get(allocation_id) if written.old else None
            log.info("released %s on %s: %s", allocation_id, node, reason)
            if found is not None:
                await self._forget_owner(found.owner, allocation_id)
        for allocation_id in outcome.rebuilt:
            REBUILT.inc()
            log.info("rebuilt %s on %s from its pod's annotation", allocation_id, node)
        for allocation_id, problem in outcome.conflicts:
            REBUILD_CONFLICTS.inc()
            log.warning("cannot rebuild %s on %s: %s", allocation_id, node, problem)

    async def _forget_owner(self, owner: Owner, allocation_id: AllocationId) -> None:
        try:
            await self.store.forget_owner_of(owner, allocation_id)
        except GpuledgerError as err:  # the record then points at a released allocation: harmless
            log.warning("could not forget the owner record of %s: %s", allocation_id, err)


def _changes(outcome: Outcome) -> bool:
    return bool(outcome.released or outcome.rebuilt or outcome.conflicts)
