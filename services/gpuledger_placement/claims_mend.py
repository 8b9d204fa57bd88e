"""The claims controller's care of the claims mode C allocated (gpuledger's finalizer,
docs/dra-mode-c.md): once such a claim is deleted and reserved for no pod, its entry released and
the finalizer removed (``unfinalized``); once its last consumer went, the claim deallocated as
kube-controller-manager deallocates the claims kube-scheduler allocated (``unused``); where its
allocator could not write the finalizer, the finalizer added (``mend``)."""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuledger_core import claims
from gpuledger_core.errors import Conflict, NotFound
from gpuledger_core.preemption import preempted
from gpuledger_placement import claim_fields as fields
from gpuledger_placement.claim_fields import ALLOCATED_BY_LEDGER, DELETE_PROTECTION, claim_path
from gpuledger_placement.metrics import CLAIMS

if TYPE_CHECKING:
    from gpuledger_placement.claims import ClaimsController

log = logging.getLogger("gpuledger_placement.claims")  # the controller's records, under its name
WRITING_S = 30.0  # an entry of an unallocated claim this young may be a placement replica's, still writing the claim
UNUSED_AFTER_S = 10.0  # a mode-C claim reserved for no pod is deallocated no sooner after its allocation


async def unfinalized(ctl: ClaimsController, raw: Mapping[str, Any]) -> bool:
    """A claim allocated by the ledger (mode C: gpuledger's finalizer) that is being deleted and
    reserved for no pod: its ledger entry released and the finalizer removed, so that the API
    server deletes it (kube-controller-manager leaves the claims it did not allocate alone)."""
    meta = raw.get("metadata") or {}
    if not meta.get("deletionTimestamp") or ALLOCATED_BY_LEDGER not in (meta.get("finalizers") or []):
        return False
    if (raw.get("status") or {}).get("reservedFor"):
        return True  # still in use: the pod's end clears reservedFor, and the claim comes back
    ref = claims.ref_of(raw)
    await ctl.release(ref, "the claim was deleted", raw)
    body = copy.deepcopy(dict(raw))
    body["metadata"]["finalizers"] = [f for f in meta["finalizers"] if f != ALLOCATED_BY_LEDGER]
    with contextlib.suppress(NotFound):
        await ctl.api.replace_object(claim_path(ref), body)
    log.info("claims: %s deleted: its ledger entry released, gpuledger's finalizer removed", ref.describe())
    return True


async def unused(ctl: ClaimsController, raw: Mapping[str, Any]) -> bool:
    """A claim mode C allocated whose last consumer went: reserved for no pod (kube-controller-
    manager takes a pod out of ``reservedFor`` once it is done with the claim), and named by no
    pod waiting to be scheduled (one just created is on its way to kube-scheduler, which will
    reserve the claim for it). Its allocation is cleared and the finalizer removed (with the
    claim's resourceVersion: a reservation made meanwhile wins), then its ledger entry
    released. A claim allocated less than ``UNUSED_AFTER_S`` ago, or named by a waiting pod, is
    looked at again after ``UNUSED_AFTER_S`` (nothing about the claim itself may change)."""
    meta, status = raw.get("metadata") or {}, raw.get("status") or {}
    if ALLOCATED_BY_LEDGER not in (meta.get("finalizers") or []) or meta.get("deletionTimestamp"):
        return False
    if not status.get("allocation") or status.get("reservedFor"):
        return False
    ref = claims.ref_of(raw)
    if ref.uid in ctl.allocating:
        return False
    taken = _preempted(ctl, raw)  # a pod waiting for it waits gated until it is allocated again
    if not taken and (ctl.clock() - fields.allocated_at(raw) < UNUSED_AFTER_S or await awaited_by_a_pod(ctl, raw)):
        ctl._look_again(ref)
        return False
    body = copy.deepcopy(dict(raw))
    body["status"] = {k: v for k, v in status.items() if k != "allocation"}  # as kube-controller-manager does
    try:
        written = await ctl.api.replace_object(f"{claim_path(ref)}/status", body)
    except (Conflict, NotFound):
        return True  # changed meanwhile: its next version is settled
    await ctl.release(ref, "the claim's last consumer went", raw)
    written["metadata"]["finalizers"] = [f for f in written["metadata"].get("finalizers") or []
                                         if f != ALLOCATED_BY_LEDGER]  # fmt: skip
    with contextlib.suppress(Conflict, NotFound):
        await ctl.api.replace_object(claim_path(ref), written)
    CLAIMS.labels("deallocated").inc()
    log.info("claims: %s deallocated: no pod uses it any more; its ledger entry released", ref.describe())
    return True


async def mend(ctl: ClaimsController, raw: Mapping[str, Any]) -> None:
    """gpuledger's finalizer on a claim mode C allocated, where the allocator that wrote the
    allocation could not write it after (it stopped in between, or every try failed). Such a
    claim holds gpuledger's results with no binding condition and neither gpuledger's finalizer
    nor kube-scheduler's own (kube-scheduler writes its finalizer before any allocation it
    makes). One allocated less than ``WRITING_S`` ago is left to its allocator and looked at
    again later."""
    meta, ref = raw.get("metadata") or {}, claims.ref_of(raw)
    finalizers = meta.get("finalizers") or []
    if ALLOCATED_BY_LEDGER in finalizers or DELETE_PROTECTION in finalizers or meta.get("deletionTimestamp"):
        return
    if ref.uid in ctl.finalizing:
        return
    if ctl.clock() - fields.allocated_at(raw) < WRITING_S:
        ctl._look_again(ref)
        return
    body = copy.deepcopy(dict(raw))
    body["metadata"].setdefault("finalizers", []).append(ALLOCATED_BY_LEDGER)
    with contextlib.suppress(Conflict, NotFound):  # changed meanwhile: its next version is settled
        await ctl.api.replace_object(claim_path(ref), body)
        log.warning("claims: %s: gpuledger's finalizer added (its allocator did not)", ref.describe())


async def awaited_by_a_pod(ctl: ClaimsController, raw: Mapping[str, Any]) -> bool:
    meta = raw["metadata"]
    listed = await ctl.api.list_objects(f"/api/v1/namespaces/{meta['namespace']}/pods", {})
    return fields.awaited(listed.get("items") or [], str(meta["name"]), fields.pod_owner(raw))


def _preempted(ctl: ClaimsController, raw: Mapping[str, Any]) -> bool:
    """Whether the claim's allocation was taken back by preemption (its entry released so)."""
    ref, devices = claims.ref_of(raw), claims.results_of(raw, ctl.driver)
    entry = ctl.view.entries.get(claims.node_of(ref, devices)) if devices else None
    return entry is not None and preempted(entry.ledger.get(claims.allocation_id(ref, devices)))
