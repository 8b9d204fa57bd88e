"""Mode C's writes of a claim it allocated: the allocation, reserved for its pod, then gpuledger's
finalizer beside the pod's way on (docs/dra-mode-c.md, "Write the claim")."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Mapping
from typing import Any

from gpuledger_core import claims
from gpuledger_core.claims import ClaimRef
from gpuledger_core.errors import Conflict, GpuledgerError, NotFound
from gpuledger_core.model import Allocation
from gpuledger_placement.claims import ALLOCATED_BY_LEDGER, ClaimApi, ClaimsController, claim_path

log = logging.getLogger(__name__)
FINALIZER = ALLOCATED_BY_LEDGER
FINALIZE_TRIES = 5  # writes of a claim's finalizer before the claims controller is left to add it
RETRY_S = 5.0  # the longest wait between two tries of the finalizer


async def write_allocation(
    api: ClaimApi,
    controller: ClaimsController,
    ref: ClaimRef,
    raw: Mapping[str, Any],
    status: dict[str, Any],
    pod: Mapping[str, Any],
    held: Allocation,
) -> asyncio.Task[None]:
    """The claim's allocation, reserved for the pod as kube-scheduler's PreBind would reserve it
    (which then finds nothing to write), then gpuledger's finalizer beside the pod's way on
    (``finalize``), whose task is returned. kube-controller-manager keeps the reservation while
    the pod may still run, and drops it once the pod is gone or deleted before being scheduled.
    If the API server refuses the write, the claim as it is now decides (``ClaimsController.withdraw``): this
    entry is released unless the claim was allocated meanwhile (by another replica: the ledger
    then follows that allocation)."""
    try:
        body = copy.deepcopy(dict(raw))
        meta = pod["metadata"]
        reserved = [r for r in (body.get("status") or {}).get("reservedFor") or [] if r.get("uid") != meta["uid"]]
        reserved.append({"resource": "pods", "name": meta["name"], "uid": meta["uid"]})
        body["status"] = {**(body.get("status") or {}), "allocation": status, "reservedFor": reserved}
        written = await api.replace_object(f"{claim_path(ref)}/status", body)
    except GpuledgerError:
        await controller.withdraw(ref, held, "the claim's allocation could not be written")
        raise
    controller.finalizing.add(ref.uid)
    return asyncio.create_task(finalize(api, controller, ref, written))


async def finalize(api: ClaimApi, controller: ClaimsController, ref: ClaimRef, claim: Mapping[str, Any]) -> None:
    """gpuledger's finalizer on the claim it has just allocated, so that the claim is not deleted
    under an allocation the ledger holds while a pod may use it. It is written after the
    allocation (with its resourceVersion) while the pod goes on to kube-scheduler, not on the
    pod's way: the pod is scheduled a tenth of a second later at the earliest and starts later
    still; a claim deleted in between is simply gone (its entry released by the claims
    controller), and its pod cannot start without it. A claim changed meanwhile is read again;
    one no longer allocated by gpuledger gets none; where every try fails, the claims controller
    adds it (``claims_mend.mend``)."""
    path = claim_path(ref)
    try:
        for attempt in range(FINALIZE_TRIES):
            meta = claim.get("metadata") or {}
            if FINALIZER in (meta.get("finalizers") or []) or meta.get("deletionTimestamp"):
                return
            if claims.ref_of(claim).uid != ref.uid or not claims.results_of(claim, controller.driver):
                return  # deallocated meanwhile (kube-scheduler's PostFilter), or another claim of that name
            body = copy.deepcopy(dict(claim))
            body["metadata"].setdefault("finalizers", []).append(FINALIZER)
            try:
                await api.replace_object(path, body)
                return
            except Conflict:
                pass
            except GpuledgerError as err:
                log.warning("allocation: the finalizer of %s not written (%s); tried again", ref.describe(), err)
                await asyncio.sleep(min(RETRY_S, 0.2 * 2**attempt))
            claim = await api.get_object(path)
        log.error("allocation: the finalizer of %s could not be written; the claims controller adds it",
                  ref.describe())  # fmt: skip
    except NotFound:
        return
    except GpuledgerError as err:
        log.error("allocation: the finalizer of %s not written (%s); the claims controller adds it",
                  ref.describe(), err)  # fmt: skip
    finally:
        controller.finalizing.discard(ref.uid)
