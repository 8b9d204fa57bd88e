"""Reconciling the ledger with Kubernetes, every ``reconcile_interval_s``.

Each round lists every pod (through ``PodLister``) and, for each node whose ledger the listing
would change, applies ``reconcile.reconciled`` in one compare-and-set: allocations of deleted or
finished pods are released, allocations a lost bucket forgot are rebuilt from the pods'
annotations. A failed or partial listing changes nothing; the next round tries again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuledger_allocator.kube import PodLister
from gpuledger_allocator.metrics import LIST_FAILURES, REBUILD_CONFLICTS, REBUILT, RELEASED
from gpuledger_allocator.reconcile import Listing, Outcome, reconciled
from gpuledger_allocator.view import ClusterView
from gpuledger_common.store import LedgerStore, Written
from gpuledger_core.errors import GpuledgerError
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Owner

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Reconciler:
    store: LedgerStore
    view: ClusterView
    pods: PodLister
    grace_s: float
    clock: Callable[[], float] = time.time

    async def run(self, interval_s: float) -> None:
        while True:
            await self.round()
            await asyncio.sleep(interval_s)

    async def round(self) -> bool:
        """One listing and its repairs; False when the listing failed (nothing was changed)."""
        started = self.clock()
        try:
            listing = Listing.of(await self.pods.list_pods(), started)
        except GpuledgerError as err:
            LIST_FAILURES.inc()
            log.warning("cannot list pods, nothing reconciled this round: %s", err)
            return False
        for node, ledger in list(self.view.ledgers.items()):
            if _changes(reconciled(ledger, listing, self.grace_s, self.clock())):
                await self._node(node, listing)
        return True

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
