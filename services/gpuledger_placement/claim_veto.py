"""A claim kube-scheduler allocated (DRA mode B) as a preemption victim: its allocation vetoed
before its pods are evicted (docs/preemption.md).

Evicting the pods of a mode-B claim frees its cards only once kube-controller-manager deallocates
the claim (it does so when no pod reserves it any more, the claim carrying kube-scheduler's
finalizer) or deletes it (a claim made from its pod's template goes with the pod). Until then the
claim stays allocated, and kube-scheduler may reserve it for another pod that names it (a
standalone claim a Deployment's next pod names, say): that pod would be bound onto cards the
preemptor now holds, its claim's devices already committed. So, before the first eviction, the
preemptor writes ``gpuledger.io/rejected`` (reason ``Preempted``) on the claim's devices in place
of ``committed``: kube-scheduler's Filter then finds the claim unusable on every node, its
PostFilter deallocates it once no other pod reserves it, and a pod that names it waits for a new
allocation, which the ledger decides as any. If an eviction is refused, the devices' status as it
was is written back. A claim whose devices carry no binding condition (mode A, mirrored only) has
no such veto and is never a victim.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from gpuledger_core import claims
from gpuledger_core.errors import Conflict, NotFound
from gpuledger_placement.claim_fields import COMMITTED, REJECTED, decided, device_status, ours

PREEMPTED = "Preempted"  # the reason of the rejected condition a veto writes
RESTORE_ROUNDS = 3


class StatusApi(Protocol):
    async def get_object(self, path: str) -> dict[str, Any]: ...
    async def replace_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


def mode_b(claim: Mapping[str, Any], driver: str) -> bool:
    """Whether kube-scheduler allocated the claim and the ledger committed it: each of its results
    of ``driver`` waits for gpuledger's binding condition, and the condition is written True."""
    devices = claims.results_of(claim, driver)
    return (
        bool(devices)
        and all(COMMITTED in d.binding_conditions for d in devices)
        and decided(claim, driver, devices) == COMMITTED
    )


def vetoed(claim: Mapping[str, Any], driver: str, message: str, now: float) -> dict[str, Any]:
    """The claim with ``gpuledger.io/rejected`` True (reason ``Preempted``) on each of its devices
    of ``driver``, in place of what they said; other drivers' entries kept."""
    devices = claims.results_of(claim, driver)
    body = copy.deepcopy(dict(claim))
    status = body.setdefault("status", {})
    condition = {
        "type": REJECTED,
        "status": "True",
        "reason": PREEMPTED,
        "message": message[:1000],
        "lastTransitionTime": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    keys = {d.key for d in devices}
    kept = [s for s in status.get("devices") or [] if not ours(s, driver, keys)]
    status["devices"] = kept + [device_status(driver, d, condition) for d in devices]
    return body


def is_vetoed(claim: Mapping[str, Any], driver: str) -> bool:
    """Whether a device of ``driver`` in the claim carries a preemption's veto."""
    for status in (claim.get("status") or {}).get("devices") or []:
        if status.get("driver") != driver:
            continue
        for condition in status.get("conditions") or []:
            if condition.get("type") == REJECTED and condition.get("reason") == PREEMPTED:
                return True
    return False


def _status_path(claim: Mapping[str, Any]) -> str:
    ref = claims.ref_of(claim)
    return f"/apis/resource.k8s.io/v1/namespaces/{ref.namespace}/resourceclaims/{ref.name}/status"


async def veto(api: StatusApi, listed: Sequence[Mapping[str, Any]], driver: str, message: str, now: float) -> bool:
    """Veto each claim as ``listed`` (its resourceVersion the precondition). False at the first
    that changed since or is gone, with the ones vetoed before it written back as they were."""
    done: list[Mapping[str, Any]] = []
    for claim in listed:
        try:
            await api.replace_object(_status_path(claim), vetoed(claim, driver, message, now))
        except (Conflict, NotFound):
            await restore(api, done, driver)
            return False
        done.append(claim)
    return True


async def restore(api: StatusApi, listed: Sequence[Mapping[str, Any]], driver: str) -> None:
    """Write back each vetoed claim's device status as ``listed`` had it (an eviction was refused:
    its pods keep running on the cards the ledger still holds for it). A claim that is gone, was
    allocated anew, or no longer carries the veto is left as it is; one that changed meanwhile is
    read again (a few times)."""
    for claim in listed:
        for _ in range(RESTORE_ROUNDS):
            if await _restore_one(api, claim, driver):
                break


async def _restore_one(api: StatusApi, claim: Mapping[str, Any], driver: str) -> bool:
    """True when done (or nothing to do); False when the claim changed between the read and the write."""
    try:
        fresh = await api.get_object(_status_path(claim).removesuffix("/status"))
    except NotFound:
        return True
    if claims.ref_of(fresh).uid != claims.ref_of(claim).uid or not is_vetoed(fresh, driver):
        return True
    if claims.results_of(fresh, driver) != claims.results_of(claim, driver):
        return True
    body = copy.deepcopy(fresh)
    body.setdefault("status", {})["devices"] = copy.deepcopy((claim.get("status") or {}).get("devices") or [])
    try:
        await api.replace_object(_status_path(claim), body)
    except NotFound:
        return True
    except Conflict:
        return False
    return True
