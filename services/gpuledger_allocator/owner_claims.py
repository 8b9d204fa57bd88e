"""An Allocate's claim on its owner's record in the owner index, beside its reservation.

The reservation and the owner's record are written at once; ``OwnerClaims`` settles the two: it
answers with the allocation another live record of the owner names (rolling its own reservation
back), puts its record in place of a stale one, waits for an allocation whose record is written
and whose reservation is still on its way, and undoes a reservation that must not stay. It also
answers a retry from the view after the record expired (``_held``), and drops a record once its
allocation is released (``_forget``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gpuledger_allocator.reserving import release_fn
from gpuledger_allocator.view import ClusterView
from gpuledger_common.store import LedgerStore, OwnerRecord
from gpuledger_common.store.outage import time_left
from gpuledger_core.errors import GpuledgerError, Unavailable
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.model import Allocation, Owner

log = logging.getLogger(__name__)
MAX_OWNER_ROUNDS = 3
OWNER_POLL_S = 0.02


class OwnerClaims:
    """The owner index's side of an Allocate, over the service's state."""

    __slots__ = ()
    store: LedgerStore
    view: ClusterView
    clock: Callable[[], float]
    owner_ttl_s: float
    absent_grace_s: float

    async def _held(self, owner: Owner) -> Allocation | None:
        """The owner's live allocation as the view knows it, confirmed by a fresh read. This
        answers a retry after the owner's record expired."""
        allocation_id = self.view.owned_by(owner)
        node = self.view.node_of(allocation_id) if allocation_id else None
        if allocation_id is None or node is None:
            return None
        ledger, _ = await self.store.read(node)
        found = ledger.get(allocation_id) if ledger else None
        return found if found is not None and found.held_at(self.clock()) else None

    async def _settle(
        self,
        owner: Owner,
        claimed: int | BaseException | None,
        reserved: Allocation | BaseException,
        claimed_node: NodeName,
        started: float,
    ) -> tuple[Allocation, bool] | None:
        """Reconcile the two concurrent writes: (allocation, existing), or None to try again."""
        if isinstance(claimed, BaseException):  # the index cannot be written: nothing may stay
            await self._undo(reserved)
            raise claimed
        if claimed is None:
            return await self._contest(owner, reserved)
        if isinstance(reserved, BaseException):
            await self.store.forget_owner(owner, claimed)
            raise reserved
        if reserved.node != claimed_node:  # the claim named the first node tried; correct it
            claimed = await self.store.claim_owner(owner, reserved.id, reserved.node, claimed, self.owner_ttl_s)
        elif time.monotonic() - started > self.absent_grace_s / 2:
            # A write this slow may have let another request judge our record abandoned.
            record = await self.store.owner_record(owner)
            claimed = record.revision if record is not None and record.allocation == reserved.id else None
        if claimed is None:  # our record was taken over: ours must not stay
            await self._undo(reserved)
            return None
        return reserved, False

    async def _contest(self, owner: Owner, reserved: Allocation | BaseException) -> tuple[Allocation, bool] | None:
        """Another record for the owner was in the way of ours: answer with its allocation if it
        is live; put ours in its place if it is stale; if its allocation is still being written,
        give our room back and wait for it. None: start over."""
        for _ in range(MAX_OWNER_ROUNDS):
            record = await self.store.owner_record(owner)
            found = await self._find_anywhere(record.allocation, record.node) if record is not None else None
            if found is not None and found.held_at(self.clock()):
                await self._undo(reserved)
                return found, True
            young = (
                record is not None
                and found is None
                and not self.view.left_its_node(record.allocation)  # written, released, pruned: stale
                and self.clock() - record.at <= self.absent_grace_s
            )
            if young:  # its writer is at work: hold nothing meanwhile (it may need the room)
                await self._undo(reserved)
                holder = await self._holder(owner, record)
                return None if holder is None else (holder, True)
            if isinstance(reserved, BaseException):
                raise reserved
            revision = record.revision if record is not None else 0
            taken = await self.store.claim_owner(owner, reserved.id, reserved.node, revision, self.owner_ttl_s)
            if taken is not None:
                return reserved, False
        await self._undo(reserved)
        return None

    async def _holder(self, owner: Owner, record: OwnerRecord | None) -> Allocation | None:
        """The live allocation the owner's record names, or None if the record is stale. An
        allocation not in the ledger yet may be on its way (its record and reservation are written
        at once): it is waited for, up to ``absent_grace_s`` after the record was written, unless
        this view saw it leave its node's key (released and pruned: written, and gone for good)."""
        while record is not None:
            found = await self._find_anywhere(record.allocation, record.node)
            if found is not None:
                return found if found.held_at(self.clock()) else None
            if self.view.left_its_node(record.allocation) or self.clock() - record.at > self.absent_grace_s:
                return None
            if time_left(self.store.retry_s) <= OWNER_POLL_S:  # the caller hears why before its deadline
                raise Unavailable(
                    f"{owner.describe()}: an earlier request of this owner is still being written "
                    f"({record.allocation} on {record.node})"
                )
            await asyncio.sleep(OWNER_POLL_S)
            record = await self.store.owner_record(owner)
        return None

    async def _find_anywhere(self, allocation_id: AllocationId, node: NodeName) -> Allocation | None:
        """The allocation as its node's key holds it now: on ``node``, or where the view saw it."""
        for where in dict.fromkeys((node, self.view.node_of(allocation_id))):
            if where:
                ledger, _ = await self.store.read(where)
                found = ledger.get(allocation_id) if ledger else None
                if found is not None:
                    return found
        return None

    async def _undo(self, reserved: Allocation | BaseException) -> None:
        if isinstance(reserved, Allocation):
            undo = release_fn(reserved.node, reserved.id, self.clock(), "duplicate request")
            await self.store.mutate(reserved.node, undo)

    async def _forget(self, owner: Owner, allocation_id: AllocationId) -> None:
        try:
            await self.store.forget_owner_of(owner, allocation_id)
        except GpuledgerError as err:  # NATS away: the next bind or Allocate for this owner replaces it
            log.info("could not drop the owner record of %s yet: %s", owner.describe(), err)
