"""What the test kubelet reads from a pod's JSON and writes back to pods and nodes (pure).

A pod's request for a device-plugin resource is a count of device IDs per container (the limit,
or the request where no limit is given); init containers are admitted first, and an init container
with ``restartPolicy: Always`` is a sidecar that keeps its devices. Admission is told to kwok's
``pod-ready`` Stage by the condition ``gpuledger.io/KubeletAdmitted=True``; a refusal is written as
kubelet writes one (``phase: Failed`` with a reason and message).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from gpuledger_dev import apiserver_quantity as quantity
from gpuledger_dev.fake_kubelet import FakeContainer, FakePod

ADMITTED = "gpuledger.io/KubeletAdmitted"
TERMINAL = ("Succeeded", "Failed")


def fake_pod(pod: dict[str, Any], resource: str) -> FakePod:
    """The pod as the device manager sees it; ValueError if a count is not a quantity."""
    meta, spec = pod["metadata"], pod.get("spec", {})
    containers = [_container(c, resource, init=True) for c in spec.get("initContainers") or []]
    containers += [_container(c, resource, init=False) for c in spec.get("containers") or []]
    return FakePod(meta.get("namespace", ""), meta["name"], meta["uid"], tuple(containers))


def _container(container: dict[str, Any], resource: str, init: bool) -> FakeContainer:
    resources = container.get("resources") or {}
    raw = (resources.get("limits") or {}).get(resource) or (resources.get("requests") or {}).get(resource)
    restartable = init and container.get("restartPolicy") == "Always"
    return FakeContainer(container["name"], _count(raw, resource), init, restartable)


def _count(raw: object, resource: str) -> int:
    """As kubelet counts devices: the quantity's value rounded up (the API server writes 1000 as 1k
    and refuses fractions of an extended resource)."""
    if raw is None:
        return 0
    text = str(raw).strip()
    try:
        value = quantity.parse(text).value
    except ValueError:
        value = Decimal(-1)
    if value < 0:
        raise ValueError(f"{resource}: {text!r} is not a count of devices")
    return math.ceil(value)


def uid(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["uid"])


def is_terminal(pod: dict[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") in TERMINAL


def is_deleting(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def status_says_admitted(pod: dict[str, Any]) -> bool:
    """Admitted before (by us, or by a kubelet before a restart): running, or our condition set."""
    status = pod.get("status", {})
    if status.get("phase") == "Running":
        return True
    return any(c.get("type") == ADMITTED and c.get("status") == "True" for c in status.get("conditions") or [])


def admitted_patch(pod_uid: str, now: datetime | None = None) -> dict[str, Any]:
    """A strategic merge patch for ``pods/{name}/status``: the admission condition (conditions
    merge by type). The UID makes it fail (409) on a pod recreated under the same name."""
    stamp = _stamp(now)
    condition = {"type": ADMITTED, "status": "True", "lastTransitionTime": stamp}
    return {"metadata": {"uid": pod_uid}, "status": {"conditions": [condition]}}


def rejected_patch(pod_uid: str, reason: str, message: str) -> dict[str, Any]:
    """kubelet's rejection: the pod fails before any container starts."""
    return {"metadata": {"uid": pod_uid}, "status": {"phase": "Failed", "reason": reason, "message": message}}


def node_devices_patch(resource: str, capacity: int, allocatable: int) -> dict[str, Any]:
    """A patch for ``nodes/{name}/status`` that sets one resource and keeps everything else."""
    return {"status": {"capacity": {resource: str(capacity)}, "allocatable": {resource: str(allocatable)}}}


def _stamp(now: datetime | None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
