"""A ResourceClaim as the DRA plugin needs it: which of its allocated devices are ours (pure).

kubelet names a claim by namespace, name and UID; the plugin reads the claim from the API server
and takes from ``status.allocation.devices.results`` the devices of its driver in this node's pool
(the inventory publishes one pool per node, named after it). A claim that is not allocated, is
another object than kubelet meant (UID), reserved for no pod, or holds none of our devices on this
node is refused with a message that says which.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from gpuledger_core.errors import FailedPrecondition, InvalidArgument

MiB = 1024 * 1024
_QUANTITY = re.compile(r"([0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?")
_SUFFIX = {
    "": Decimal(1), "m": Decimal("0.001"), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18, "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as kubelet names it."""

    namespace: str
    name: str
    uid: str

    def describe(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One allocation result of our driver: the device, the share and what it consumed."""

    request: str  # the claim's request (for a firstAvailable choice, the main request)
    pool: str
    device: str
    share_id: str | None = None
    memory_bytes: int | None = None  # consumedCapacity["memory"]; None: the device is not shared
    compute: int | None = None  # consumedCapacity["compute"], percent


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    pods: tuple[str, ...]  # the UIDs of the pods in status.reservedFor


def quantity(raw: Any, what: str) -> int:
    """A Kubernetes quantity, rounded up to a whole number."""
    found = _QUANTITY.fullmatch(str(raw).strip())
    if found is None or isinstance(raw, bool):
        raise InvalidArgument(what, f"{raw!r} is not a Kubernetes quantity")
    value = Decimal(found.group(1)) * _SUFFIX[found.group(2) or ""]
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def allocation_of(raw: Mapping[str, Any], ref: ClaimRef, driver: str, node: str) -> ClaimAllocation:
    """The claim's devices of ``driver`` in ``node``'s pool, or ``FailedPrecondition`` saying why not."""
    uid = raw.get("metadata", {}).get("uid")
    if uid != ref.uid:
        raise FailedPrecondition(f"{ref.describe()}: the API server has uid {uid} under that name (recreated?)")
    status = raw.get("status") or {}
    allocation = status.get("allocation")
    if not allocation:
        raise FailedPrecondition(f"{ref.describe()} is not allocated")
    pods = tuple(
        str(r.get("uid")) for r in status.get("reservedFor") or [] if r.get("resource") == "pods" and r.get("uid")
    )
    if not pods:
        raise FailedPrecondition(f"{ref.describe()} is reserved for no pod")
    results = (allocation.get("devices") or {}).get("results") or []
    ours = [r for r in results if r.get("driver") == driver]
    here = tuple(_device(r, ref) for r in ours if r.get("pool") == node)
    if not here:
        pools = sorted({str(r.get("pool")) for r in ours})
        where = f" (its {driver} devices are in pools {', '.join(pools)})" if pools else ""
        raise FailedPrecondition(f"{ref.describe()} holds no {driver} device on node {node}{where}")
    return ClaimAllocation(ref, here, pods)


def _device(result: Mapping[str, Any], ref: ClaimRef) -> AllocatedDevice:
    consumed = result.get("consumedCapacity") or {}
    memory = consumed.get("memory")
    compute = consumed.get("compute")
    share = result.get("shareID")
    return AllocatedDevice(
        request=str(result.get("request", "")).split("/", 1)[0],  # a firstAvailable choice: main/sub
        pool=str(result["pool"]),
        device=str(result.get("device", "")),
        share_id=str(share) if share else None,
        memory_bytes=None if memory is None else quantity(memory, f"{ref.describe()} consumedCapacity memory"),
        compute=None if compute is None else quantity(compute, f"{ref.describe()} consumedCapacity compute"),
    )
