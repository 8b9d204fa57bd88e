"""A ResourceClaim's fields as the claims controller reads and writes them (pure): where a claim is
kept (its API path), the finalizers that guard it, what its device status says, the status entry
of one of our devices, when it was allocated, and whether a pod waiting to be scheduled names it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from gpuledger_core.claims import AllocatedDevice, ClaimRef
from gpuledger_placement.convert import epoch_of

RESOURCE = "/apis/resource.k8s.io/v1"
LIST = f"{RESOURCE}/resourceclaims"
ALLOCATED_BY_LEDGER = "gpuledger.io/allocation"  # the finalizer of the claims mode C allocated
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"  # kube-scheduler's, on the claims it allocates
COMMITTED = "gpuledger.io/committed"
REJECTED = "gpuledger.io/rejected"
DONE = ("Succeeded", "Failed")


def claim_path(ref: ClaimRef) -> str:
    return f"{RESOURCE}/namespaces/{ref.namespace}/resourceclaims/{ref.name}"


def key_of(raw: Mapping[str, Any]) -> tuple[str, str]:
    meta = raw.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def decided(raw: Mapping[str, Any], driver: str, devices: tuple[AllocatedDevice, ...]) -> str | None:
    """What the claim's device status says already: REJECTED if any of ours is rejected, COMMITTED
    if every one is committed, else None."""
    found: dict[tuple[str, str, str], set[str]] = {}
    for status in (raw.get("status") or {}).get("devices") or []:
        if status.get("driver") == driver:
            key = (str(status.get("pool")), str(status.get("device")), str(status.get("shareID") or ""))
            found[key] = {str(c.get("type")) for c in status.get("conditions") or [] if c.get("status") == "True"}
    if any(REJECTED in found.get(d.key, set()) for d in devices):
        return REJECTED
    if all(COMMITTED in found.get(d.key, set()) for d in devices):
        return COMMITTED
    return None


def ours(status: Mapping[str, Any], driver: str, keys: set[tuple[str, str, str]]) -> bool:
    key = (str(status.get("pool")), str(status.get("device")), str(status.get("shareID") or ""))
    return status.get("driver") == driver and key in keys


def device_status(driver: str, device: AllocatedDevice, condition: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"driver": driver, "pool": device.pool, "device": device.device}
    if device.share_id:
        out["shareID"] = device.share_id
    out["conditions"] = [dict(condition)]
    return out


def allocated_at(raw: Mapping[str, Any]) -> float:
    stamp = ((raw.get("status") or {}).get("allocation") or {}).get("allocationTimestamp")
    return epoch_of(stamp, time.time())


def pod_owner(claim: Mapping[str, Any]) -> str:
    """The uid of the pod that owns the claim (made from its template), or ""."""
    for ref in (claim.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Pod" and ref.get("controller"):
            return str(ref.get("uid") or "")
    return ""


def awaited(pods: Iterable[Mapping[str, Any]], claim: str, owner_uid: str = "") -> bool:
    """Whether a pod not scheduled yet, not ended and not being deleted names the claim, or owns it
    (``owner_uid``: the claim made from the pod's template, before the pod's status names it)."""
    for pod in pods:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
        if spec.get("nodeName") or status.get("phase") in DONE or deleting:
            continue
        named = {c.get("resourceClaimName") for c in spec.get("resourceClaims") or []}
        named |= {c.get("resourceClaimName") for c in status.get("resourceClaimStatuses") or []}
        if claim in named or (owner_uid and (pod.get("metadata") or {}).get("uid") == owner_uid):
            return True
    return False
