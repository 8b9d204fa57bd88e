"""The claims controller's sweep of orphans: the ledger entries of claims that no longer hold an
allocation, released after every (re)listing and every ``resync_s`` (``ClaimsController.run``).
An entry younger than a grace period survives a listing that does not show its claim: another
replica may have written it for a claim allocated after the listing."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from gpuledger_core import claims
from gpuledger_core.claims import ClaimRef
from gpuledger_core.errors import FailedPrecondition, GpuledgerError, NotFound
from gpuledger_core.ids import NodeName
from gpuledger_core.model import Allocation, OwnerKind
from gpuledger_core.preemption import room_held
from gpuledger_placement.claim_fields import LIST
from gpuledger_placement.metrics import ORPHAN_RELEASE_FAILURES

if TYPE_CHECKING:
    from gpuledger_placement.claims import ClaimsController

log = logging.getLogger("gpuledger_placement.claims")  # the controller's records, under its name
GRACE_S = 30.0  # an entry younger than this survives a listing that does not show its claim


async def sweep(ctl: ClaimsController) -> None:
    """Every ``resync_s``, the claims listed again and the entries no claim holds released
    (``release_orphans``), as after each full listing: a watch that runs for hours lists
    nothing, and an entry whose release was missed (a deletion settled where the ledger was not
    yet known) would stay until the next failure of the watch."""
    while True:
        await asyncio.sleep(ctl.resync_s)
        try:
            started = ctl.clock()
            listed = await ctl.api.list_objects(LIST, {})
            await release_orphans(ctl, listed["items"], started)
        except (NotFound, FailedPrecondition):
            continue  # no ResourceClaims here (DRA not deployed): _follow says so
        except GpuledgerError as err:
            log.warning("claims: looking again for entries no claim holds failed (%s)", err)


async def release_orphans(ctl: ClaimsController, items: list[Any], listed_at: float) -> None:
    holding = {claims.ref_of(i).uid for i in items if claims.results_of(i, ctl.driver)}
    existing = {claims.ref_of(i).uid for i in items}
    for node, entry in list(ctl.view.entries.items()):
        for allocation in entry.ledger.live():
            owner = allocation.owner
            if owner.kind is not OwnerKind.CLAIM or owner.id in holding:
                continue
            if room_held(allocation) and owner.id in existing:
                continue  # the room preemption holds for an unallocated claim: it lapses by itself
            if allocation.created_at > listed_at - GRACE_S or owner.id in ctl._busy or owner.id in ctl.allocating:
                continue
            await _release_orphan(ctl, NodeName(node), ClaimRef(owner.namespace, owner.name, owner.id), allocation)


async def _release_orphan(ctl: ClaimsController, node: NodeName, ref: ClaimRef, allocation: Allocation) -> None:
    """Release an entry no claim holds; a failure is logged and counted, and the entry is
    looked at again after the next listing."""
    try:
        await ctl._release_on(node, ref, "no ResourceClaim holds it")
    except GpuledgerError as err:
        ORPHAN_RELEASE_FAILURES.labels(err.code).inc()
        log.warning(
            "claims: ledger allocation %s of %s on %s, which no ResourceClaim holds, was not released (%s); "
            "it is tried again after the next listing",
            allocation.id,
            ref.describe(),
            node,
            err,
        )
