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

from gpuledger_core import mig
from gpuledger_dev import apiserver_quantity as quantity
from gpuledger_dev.fake_kubelet import FakeContainer, FakePod

ADMITTED = "gpuledger.io/KubeletAdmitted"
TERMINAL = ("Succeeded", "Failed")


def fake_pod(pod: dict[str, Any], resource: str) -> FakePod:
    """The pod as the device manager sees it; ValueError if a count is not a quantity, or if a
    container asks for more than one device plugin resource of ours. A container asks for
    ``resource`` (the kubelet's own, ``gpuledger.io/gpu``) or one MIG resource
    (``gpuledger.io/mig-<profile>``, ``gpuledger.io/mig``: the plugin's other resources)."""
    meta, spec = pod["metadata"], pod.get("spec", {})
    containers = [_container(c, resource, init=True) for c in spec.get("initContainers") or []]
    containers += [_container(c, resource, init=False) for c in spec.get("containers") or []]
    return FakePod(meta.get("namespace", ""), meta["name"], meta["uid"], tuple(containers))


def _container(container: dict[str, Any], resource: str, init: bool) -> FakeContainer:
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    asked = sorted({name for name in (*limits, *requests) if name == resource or mig.is_resource(name)})
    if len(asked) > 1:
        raise ValueError(f"container {container['name']} asks for {' and '.join(asked)}: one device resource each")
    name = asked[0] if asked else resource
    raw = limits.get(name) or requests.get(name)
    restartable = init and container.get("restartPolicy") == "Always"
    mine = "" if name == resource else name
    return FakeContainer(container["name"], _count(raw, name), init, restartable, mine)


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


def node_devices_patch(counts: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """A patch for ``nodes/{name}/status`` that sets each resource's (capacity, allocatable) and
    keeps everything else."""
    return {
        "status": {
            "capacity": {r: str(c) for r, (c, _) in counts.items()},
            "allocatable": {r: str(a) for r, (_, a) in counts.items()},
        }
    }


def _stamp(now: datetime | None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
