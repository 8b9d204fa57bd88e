"""What the kwok kubelet's DRA side reads from pods, ResourceClaims, plugin registrations and CDI
specs, and what it remembers of prepared claims (pure; kubelet's ``cm/dra`` at v1.36.3).

- A pod's claims (``pod_claims``): ``spec.resourceClaims[].resourceClaimName``, or for a template
  the name kube-controller-manager generated, from ``status.resourceClaimStatuses`` (a generated
  claim must be controlled by the pod). A template whose claim is not created yet is an error.
  A pod asking for an extended resource that a DeviceClass serves (``DRAExtendedResource``) uses
  the claim kube-scheduler made for it, ``status.extendedResourceClaimStatus``.
- A claim may be used (``claim_drivers``) when it is allocated and lists the pod's UID in
  ``status.reservedFor``; the drivers of its allocation's results are the plugins to call.
- A plugin registers with type ``DRAPlugin``; kubelet takes the first of its supported services
  that kubelet knows (``choose_service``).
- A CDI id ``vendor/class=name`` resolves when a spec of ``kind: vendor/class`` has a device of
  that name (``unresolved``); each container gets the CDI ids of the requests it names
  (``container_cdi_ids``).

Errors are ``PrepareError`` with kubelet's wording; the pod waits and kubelet tries again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuledger_dev import apiserver_quantity as quantity

PLUGIN_TYPE = "DRAPlugin"
FAILED_PREPARE = "FailedPrepareDynamicResources"  # the reason of kubelet's Event
V1, V1BETA1 = "v1.DRAPlugin", "v1beta1.DRAPlugin"
KUBELET_SERVICES = (V1, V1BETA1)  # the order kubelet prefers does not matter: the plugin's order does
_CDI_ID = re.compile(r"(?P<vendor>[A-Za-z0-9][A-Za-z0-9_.-]*)/(?P<class>[A-Za-z0-9][A-Za-z0-9_.-]*)=(?P<name>\S+)")


class PrepareError(Exception):
    """A pod's claims cannot be prepared (yet): the pod stays where it is and is tried again."""


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One of the pod's ``spec.resourceClaims`` with the ResourceClaim it names."""

    name: str  # the pod's name for it (containers' resources.claims[].name; "" for the extended-resource claim)
    claim: str  # the ResourceClaim object's name
    generated: bool  # from a template: the claim must be controlled by the pod


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a NodePrepareResources answer."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(slots=True)
class ClaimInfo:
    """kubelet's claim info cache entry (its checkpoint): which local pods use the claim, whether
    NodePrepareResources succeeded for it since kubelet started, and what it answered."""

    uid: str
    namespace: str
    name: str
    drivers: frozenset[str]
    pods: set[str] = field(default_factory=set)
    prepared: bool = False
    devices: dict[str, tuple[PreparedDevice, ...]] = field(default_factory=dict)  # driver -> devices

    def cdi_ids(self, request: str) -> list[str]:
        """kubelet's ``cdiDevicesAsList``: every device for an empty request, else those answered
        for that request (or for no request in particular)."""
        found: list[str] = []
        for devices in self.devices.values():
            for device in devices:
                if not request or not device.request_names or request in device.request_names:
                    found += device.cdi_ids
        return found


def has_claims(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return bool((pod.get("spec") or {}).get("resourceClaims") or status.get("extendedResourceClaimStatus"))


def pod_claims(pod: Mapping[str, Any]) -> list[PodClaim]:
    """The claims the pod uses (``resourceclaim.Name``); a template claim that was intentionally
    not created (a status entry without a name) is left out."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    found: list[PodClaim] = []
    for entry in spec.get("resourceClaims") or []:
        name = str(entry.get("name", ""))
        if entry.get("resourceClaimName"):
            found.append(PodClaim(name, str(entry["resourceClaimName"]), generated=False))
        elif entry.get("resourceClaimTemplateName"):
            if name not in statuses:
                raise PrepareError(f'pod "{meta["namespace"]}/{meta["name"]}": ResourceClaim not created yet')
            if statuses[name].get("resourceClaimName"):
                found.append(PodClaim(name, str(statuses[name]["resourceClaimName"]), generated=True))
        else:
            raise PrepareError(
                f'pod "{meta["namespace"]}/{meta["name"]}", spec.resourceClaim "{name}": '
                "none of the supported fields are set"
            )
    extended = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    if extended.get("resourceClaimName"):
        found.append(PodClaim("", str(extended["resourceClaimName"]), generated=False))
    return found


def claim_drivers(pod: Mapping[str, Any], claim: Mapping[str, Any], generated: bool) -> frozenset[str]:
    """The drivers to prepare ``claim`` with for ``pod``; PrepareError if the pod may not use it."""
    pod_meta, meta = pod["metadata"], claim["metadata"]
    status = claim.get("status") or {}
    if generated and not _controlled_by(claim, str(pod_meta["uid"])):
        raise PrepareError(
            f"ResourceClaim {meta['namespace']}/{meta['name']} was not created for Pod "
            f"{pod_meta['namespace']}/{pod_meta['name']} (Pod is not owner)"
        )
    if not any(r.get("uid") == pod_meta["uid"] for r in status.get("reservedFor") or []):
        raise PrepareError(
            f"pod {pod_meta['name']} ({pod_meta['uid']}) is not allowed to use ResourceClaim "
            f"{meta['name']} ({meta['uid']})"
        )
    allocation = status.get("allocation")
    if not allocation:
        raise PrepareError(f"ResourceClaim {meta['name']}: not allocated")
    return frozenset(str(r["driver"]) for r in (allocation.get("devices") or {}).get("results") or [])


def _controlled_by(claim: Mapping[str, Any], owner_uid: str) -> bool:
    refs = claim["metadata"].get("ownerReferences") or []
    return any(r.get("controller") and r.get("uid") == owner_uid for r in refs)


def foreign_devices(claim: Mapping[str, Any], driver: str, devices: Iterable[PreparedDevice]) -> list[str]:
    """Devices of a prepare answer that are not among the claim's allocation results for ``driver``."""
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    allocated = {(r.get("pool"), r.get("device"), r.get("shareID")) for r in results if r.get("driver") == driver}
    plain = {(pool, device) for pool, device, _ in allocated}
    wrong = []
    for d in devices:
        known = (d.pool, d.device, d.share_id) in allocated if d.share_id else (d.pool, d.device) in plain
        if not known:
            wrong.append(f"{d.pool}/{d.device}" + (f" (share {d.share_id})" if d.share_id else ""))
    return wrong


def choose_service(supported: Sequence[str]) -> str:
    """The first of the plugin's services that kubelet knows; ValueError if none (kubelet's words)."""
    if not supported:
        raise ValueError("empty list of supported gRPC services (aka supported versions)")
    for service in supported:
        if service in KUBELET_SERVICES:
            return service
    raise ValueError(
        f"none of services supported by the plugin ({list(supported)!r}) are supported by the kubelet "
        f"({list(KUBELET_SERVICES)!r})"
    )


def parse_cdi_id(cdi_id: str) -> tuple[str, str]:
    """``vendor/class=name`` -> (kind ``vendor/class``, name); ValueError if it is not one."""
    found = _CDI_ID.fullmatch(cdi_id)
    if found is None:
        raise ValueError(f"{cdi_id!r} is not a CDI device id (vendor/class=name)")
    return f"{found['vendor']}/{found['class']}", found["name"]


def cdi_devices(specs: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """(kind, device name) of every device in the given CDI specs."""
    return {(str(s.get("kind", "")), str(d.get("name", ""))) for s in specs for d in s.get("devices") or []}


def unresolved(cdi_ids: Iterable[str], specs: Iterable[Mapping[str, Any]]) -> list[str]:
    """The ids that no spec resolves (malformed ones included)."""
    known, missing = cdi_devices(specs), []
    for cdi_id in cdi_ids:
        try:
            if parse_cdi_id(cdi_id) in known:
                continue
        except ValueError:
            pass
        missing.append(cdi_id)
    return missing


def container_cdi_ids(pod: Mapping[str, Any], container: str, infos: Mapping[tuple[str, str], ClaimInfo]) -> list[str]:
    """kubelet's ``GetResources``: the CDI ids a container of the pod is given, by the claims (and
    requests) its ``resources.claims`` name, and by the extended resources it asks for that the
    pod's extended-resource claim maps to requests; ``infos`` by (namespace, claim name)."""
    spec = pod.get("spec") or {}
    every = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    wanted = next((c for c in every if c["name"] == container), None)
    if wanted is None:
        return []
    by_pod_name = {c.name: c.claim for c in pod_claims(pod) if c.name}
    requests = [(by_pod_name.get(r.get("name", "")), str(r.get("request") or "")) for r in _claims_of(wanted)]
    extended = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    asked = _extended_asked(wanted)
    for mapping in extended.get("requestMappings") or []:
        if mapping.get("containerName") == container and mapping.get("resourceName") in asked:
            requests.append((extended.get("resourceClaimName"), str(mapping.get("requestName", ""))))
    found: list[str] = []
    for claim, request in requests:
        info = None if claim is None else infos.get((pod["metadata"]["namespace"], claim))
        if info is not None:
            found += info.cdi_ids(request)
    return found


def _claims_of(container: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list((container.get("resources") or {}).get("claims") or [])


def _extended_asked(container: Mapping[str, Any]) -> set[str]:
    """The resources the container requests a non-zero amount of (requests, else limits)."""
    resources = container.get("resources") or {}
    amounts = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name for name, amount in amounts.items() if _positive(str(amount))}


def _positive(amount: str) -> bool:
    try:
        return quantity.parse(amount.strip()).value > 0
    except ValueError:
        return False


def failed_prepare_event(pod: Mapping[str, Any], node: str, message: str, now: datetime) -> dict[str, Any]:
    """kubelet's Warning Event on the pod: ``Failed to prepare dynamic resources: <message>``."""
    meta, stamp = pod["metadata"], now.strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {"apiVersion": "v1", "kind": "Pod", "namespace": meta["namespace"], "name": meta["name"]}
    return {
        "metadata": {"generateName": f"{meta['name']}."},
        "involvedObject": {**involved, "uid": meta["uid"]},
        "reason": FAILED_PREPARE,
        "message": f"Failed to prepare dynamic resources: {message}",
        "type": "Warning",
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "source": {"component": "kubelet", "host": node},
    }
