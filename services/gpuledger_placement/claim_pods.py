"""What mode C reads of a gated pod and of the DeviceClasses (pure): its scheduling gate, the
names of its claims, the classes of our driver, the configuration kube-scheduler copies into an
allocation, and the share IDs of a claim's results (docs/dra-mode-c.md)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from gpuledger_core.claims import ClaimRef

GATE = "gpuledger.io/allocate"
POD_CLAIM = "resource.kubernetes.io/pod-claim-name"  # on a claim made from a template: the pod's entry


def gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def gate_removal(pod: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The JSON patch that removes our gate and nothing else (its ``test`` fails if the gates
    moved meanwhile); None when the pod does not carry it."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    at = next((i for i, g in enumerate(gates) if g.get("name") == GATE), None)
    if at is None:
        return None
    return [
        {"op": "test", "path": f"/spec/schedulingGates/{at}/name", "value": GATE},
        {"op": "remove", "path": f"/spec/schedulingGates/{at}"},
    ]


def share_ids(ref: ClaimRef) -> Callable[[], str]:
    """The share IDs of the claim's results, in order: derived from the claim's uid, so that the
    same plan gives the same IDs (and the same ledger allocation id) however often it is made."""
    counter = itertools.count()
    return lambda: str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpuledger.io/claims/{ref.uid}/{next(counter)}"))


def claim_names(pod: Mapping[str, Any], made: Mapping[str, str] | None = None) -> list[str] | None:
    """The names of the pod's claims; None while a template's claim is not created yet. ``made``:
    the claims seen made from the pod's templates (pod claim name -> claim name, as
    kube-controller-manager marks them, ``POD_CLAIM``), for those the pod's status names not yet."""
    listed = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    statuses = {s.get("name"): s.get("resourceClaimName") for s in listed}
    names = []
    for claim in (pod.get("spec") or {}).get("resourceClaims") or []:
        if claim.get("resourceClaimName"):
            names.append(str(claim["resourceClaimName"]))
        elif claim.get("resourceClaimTemplateName"):
            generated = statuses.get(claim.get("name")) or (made or {}).get(str(claim.get("name")))
            if not generated:
                return None
            names.append(str(generated))
    return names


def of_driver(device_class: Mapping[str, Any], driver: str) -> bool:
    """Whether the class selects devices of ``driver`` (its CEL selectors name it)."""
    selectors = (device_class.get("spec") or {}).get("selectors") or []
    return any(f'device.driver == "{driver}"' in str((s.get("cel") or {}).get("expression", "")) for s in selectors)


def configs_of(raw: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]], driver: str) -> list[dict[str, Any]]:
    """The configuration kube-scheduler copies into the allocation: each request's class's
    (``FromClass``), then the claim's own (``FromClaim``), for our driver."""
    out: list[dict[str, Any]] = []
    devices = (raw.get("spec") or {}).get("devices") or {}
    for request in devices.get("requests") or []:
        names = [request["exactly"]["deviceClassName"]] if request.get("exactly") else [
            s.get("deviceClassName") for s in request.get("firstAvailable") or []]  # fmt: skip
        for name in dict.fromkeys(names):
            for config in ((classes.get(str(name)) or {}).get("spec") or {}).get("config") or []:
                if (config.get("opaque") or {}).get("driver") == driver:
                    out.append({"source": "FromClass", "requests": [request["name"]], "opaque": config["opaque"]})
    for config in devices.get("config") or []:
        if (config.get("opaque") or {}).get("driver") == driver:
            out.append({"source": "FromClaim", **({"requests": config["requests"]} if config.get("requests") else {}),
                        "opaque": config["opaque"]})  # fmt: skip
    return out


def describe(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"
