"""The preemptor's ledger writes of the room (docs/preemption.md, "The fence", "The room held"):

- the fence (what it holds is ``gpuledger_core.room_fence``'s), written before the first
  eviction where the pod still fits the node once its victims go, and released where the victims
  were not all evicted;
- the hold: the victims' entries and the fence released and the pod's cards reserved, in one
  compare-and-set; a hold that fails releases the fence, which would otherwise keep the room from
  everyone until its lease ran out."""

from __future__ import annotations

import logging

from gpuledger_common.store import LedgerStore
from gpuledger_core.errors import Conflict, Exhausted, GpuledgerError, NotFound
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, release, reserve
from gpuledger_core.model import OwnerKind
from gpuledger_core.pods import PodAsk, reserve_pod
from gpuledger_core.preemption import Fit, Victims
from gpuledger_core.room_fence import fence
from gpuledger_placement.view import FleetView

log = logging.getLogger("gpuledger_placement.preemptor")  # the preemptor's records, under its name


async def write_fence(
    store: LedgerStore, view: FleetView, fit: Fit, pod: PodAsk, victims: Victims, now: float, lease_s: float
) -> AllocationId | None:
    """The part of the room that is free now held by a fence: its id, or None where the victims
    hold all of the room. ``Exhausted`` where the room is no longer there once the victims are
    gone (taken since the choice)."""
    node = victims.node
    fence_id = AllocationId(f"f-{pod.owner.id[:24]}-{int(now)}")
    gone = [v.id for v in victims.evict]

    def transition(ledger: NodeLedger | None) -> NodeLedger:
        if ledger is None:
            raise NotFound(f"node {node} is not in the ledger")
        if ledger.get(fence_id) is not None:
            return ledger  # written already (an answer lost on the way back)
        grants = fit.grants(ledger, pod, gone)
        if grants is None:
            raise Exhausted(f"the room on {node} is taken: the pod no longer fits there once {victims.describe()} go")
        found = fence(ledger, pod, grants, fence_id, now, lease_s)
        return ledger if found is None else reserve(ledger, found, mix_isolation=True)

    written = await store.mutate(node, transition)
    if written.new is not None:
        view.apply(node, written.new, written.revision)
    return fence_id if written.new is not None and written.new.get(fence_id) is not None else None


async def release_fence(
    store: LedgerStore, view: FleetView, node: NodeName, fence_id: AllocationId | None, now: float
) -> None:
    """The fence released: the victims were not all evicted, or the hold failed (it lapses after
    its lease anyway)."""
    if fence_id is None:
        return

    def transition(ledger: NodeLedger | None) -> NodeLedger:
        if ledger is None:
            raise NotFound(f"node {node} is not in the ledger")
        found = ledger.get(fence_id) is not None
        return release(ledger, fence_id, now, "preemption given up") if found else ledger

    try:
        written = await store.mutate(node, transition)
    except GpuledgerError as err:
        log.warning("preemption: the fence %s on %s not released (it lapses): %s", fence_id, node, err)
        return
    if written.new is not None:
        view.apply(node, written.new, written.revision)


async def write_hold(
    store: LedgerStore,
    view: FleetView,
    fit: Fit,
    pod: PodAsk,
    victims: Victims,
    holder: str,
    why: str,
    fenced: AllocationId | None,
    now: float,
    lease_s: float,
) -> None:
    """The victims' entries (released ``why``: preempted by, or moved for, the pod) and the fence
    (``fenced``) released and the pod's cards reserved, in one compare-and-set; ``holder``: the
    pod, as ``namespace/name``. ``Conflict`` where the room went to someone else meanwhile."""
    node = victims.node
    allocation_id = AllocationId(f"p-{pod.owner.id[:24]}-{int(now)}")

    def transition(ledger: NodeLedger | None) -> NodeLedger:
        if ledger is None:
            raise NotFound(f"node {node} is not in the ledger")
        if ledger.get(allocation_id) is not None:
            return ledger  # written already (an answer lost on the way back)
        for victim in victims.evict:
            if ledger.get(victim.id) is not None:
                ledger = release(ledger, victim.id, now, why)
        if fenced is not None and ledger.get(fenced) is not None:
            ledger = release(ledger, fenced, now, f"room held for pod {holder}")
        return reserve_pod(ledger, pod, fit.policy, allocation_id, now=now, lease_s=lease_s,
                           slots_per_card=view.slots_per_card, mix_isolation=fit.mix_isolation)  # fmt: skip

    try:
        written = await store.mutate(node, transition)
    except GpuledgerError as err:
        await release_fence(store, view, node, fenced, now)
        if isinstance(err, Exhausted):  # the room went to someone else meanwhile: the victims go anyway
            raise Conflict(f"the room on {node} was taken before it could be held: {err}") from err
        raise
    if written.new is not None:
        view.apply(node, written.new, written.revision)
    if pod.owner.kind is not OwnerKind.POD:
        return  # a claim's hold is found by its owner in the ledger (``ClaimAllocator``)
    if await store.claim_owner(pod.owner, allocation_id, node) is None:
        log.warning("preemption for %s: the owner record names another allocation", pod.owner.describe())
