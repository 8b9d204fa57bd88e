"""DRA ResourceClaims: which of a claim's allocated devices are ours, and the ledger entry they
make (pure).

kube-scheduler writes ``status.allocation.devices.results``: one result per allocated device, with
its driver, pool (the inventory publishes one pool per node, named after it), device (``gpu-<card
index>``), the share id of a shared device and what it consumed. The plugin takes the results of
its driver in its node's pool (``allocation_of``); placement's claims controller turns all of them
into one ledger allocation owned by the claim (``ledger_allocation``), so that classic pods, tools
and claims are counted against the same cards.

A device named as a MIG placement (``dra_mig``: ``gpu-<index>-mig-<profile>-<start>``) holds that
placement of its card (``CardShare.mig``). A card's device is held whole when its result has no
share id (the card takes one allocation) or when the share consumed the whole card: all of its
compute and all of the memory the slice publishes (the card's memory rounded down to whole
``memory_step_mib``). Otherwise it is a share of the memory (rounded up to whole MiB) and compute
(percent, as per-mille of the card) it consumed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuledger_core import dra_mig, mig
from gpuledger_core.errors import FailedPrecondition, InvalidArgument
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.model import (
    CORE_WHOLE,
    Allocation,
    AllocState,
    Card,
    CardShare,
    Grant,
    Isolation,
    Node,
    Owner,
    OwnerKind,
    Request,
)
from gpuledger_core.quantity import MIB, whole_up

MiB = MIB
DEVICE_PREFIX = "gpu-"  # the inventory names each card's device gpu-<index>
MEMORY_STEP_MIB = 256  # the slices' memory grid (the inventory's --dra-memory-step-mib)
SHARING_API = "gpuledger.io/v1alpha1"  # the opaque configuration a DeviceClass or claim passes our driver
SHARING_KIND = "SharingConfig"


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as kubelet (or a watch) names it."""

    namespace: str
    name: str
    uid: str

    def describe(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} (uid {self.uid})"

    @property
    def owner(self) -> Owner:
        return Owner(OwnerKind.CLAIM, self.uid, self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One allocation result of our driver: the device, the share and what it consumed."""

    request: str  # the claim's request (for a firstAvailable choice, the main request)
    pool: str
    device: str
    share_id: str | None = None
    memory_bytes: int | None = None  # consumedCapacity["memory"]; None: the device is not shared
    compute: int | None = None  # consumedCapacity["compute"], percent
    binding_conditions: tuple[str, ...] = ()  # what kube-scheduler waits for before it binds the pod
    chosen: str = ""  # the result's request as written (``main/sub`` for a firstAvailable choice)

    @property
    def key(self) -> tuple[str, str, str]:
        """How ``status.devices`` names the result (with the driver)."""
        return (self.pool, self.device, self.share_id or "")


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    pods: tuple[str, ...]  # the UIDs of the pods in status.reservedFor
    isolation: Isolation = Isolation.NONE  # from the opaque SharingConfig of the class or claim


def ref_of(raw: Mapping[str, Any]) -> ClaimRef:
    meta = raw.get("metadata") or {}
    return ClaimRef(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")))


def results_of(raw: Mapping[str, Any], driver: str) -> tuple[AllocatedDevice, ...]:
    """Every allocation result of ``driver`` in the claim (none: not allocated, or not ours)."""
    allocation = (raw.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    ref = ref_of(raw)
    return tuple(_device(r, ref) for r in results if r.get("driver") == driver)


def allocation_of(raw: Mapping[str, Any], ref: ClaimRef, driver: str, node: str) -> ClaimAllocation:
    """The claim's devices of ``driver`` in ``node``'s pool, or ``FailedPrecondition`` saying why not."""
    uid = raw.get("metadata", {}).get("uid")
    if uid != ref.uid:
        raise FailedPrecondition(f"{ref.describe()}: the API server has uid {uid} under that name (recreated?)")
    status = raw.get("status") or {}
    if not status.get("allocation"):
        raise FailedPrecondition(f"{ref.describe()} is not allocated")
    pods = tuple(
        str(r.get("uid")) for r in status.get("reservedFor") or [] if r.get("resource") == "pods" and r.get("uid")
    )
    if not pods:
        raise FailedPrecondition(f"{ref.describe()} is reserved for no pod")
    ours = results_of(raw, driver)
    here = tuple(d for d in ours if d.pool == node)
    if not here:
        pools = sorted({d.pool for d in ours})
        where = f" (its {driver} devices are in pools {', '.join(pools)})" if pools else ""
        raise FailedPrecondition(f"{ref.describe()} holds no {driver} device on node {node}{where}")
    return ClaimAllocation(ref, here, pods, isolation_of(raw, driver, here))


def _device(result: Mapping[str, Any], ref: ClaimRef) -> AllocatedDevice:
    consumed = result.get("consumedCapacity") or {}
    memory = consumed.get("memory")
    compute = consumed.get("compute")
    share = result.get("shareID")
    return AllocatedDevice(
        request=str(result.get("request", "")).split("/", 1)[0],  # a firstAvailable choice: main/sub
        pool=str(result.get("pool", "")),
        device=str(result.get("device", "")),
        share_id=str(share) if share else None,
        memory_bytes=None if memory is None else whole_up(memory, f"{ref.describe()} consumedCapacity memory"),
        compute=None if compute is None else whole_up(compute, f"{ref.describe()} consumedCapacity compute"),
        binding_conditions=tuple(str(c) for c in result.get("bindingConditions") or ()),
        chosen=str(result.get("request", "")),
    )


def isolation_of(raw: Mapping[str, Any], driver: str, devices: Sequence[AllocatedDevice]) -> Isolation:
    """The isolation the claim's devices get from the opaque configuration of our driver that
    applies to their requests (``status.allocation.devices.config``: the class's first, then the
    claim's, the later winning), ``none`` where none applies. The ledger holds one isolation per
    allocation, so a claim whose devices would get different ones is refused."""
    configs = ((raw.get("status") or {}).get("allocation") or {}).get("devices", {}).get("config") or []
    ordered = [c for c in configs if c.get("source") == "FromClass"] + [
        c for c in configs if c.get("source") != "FromClass"
    ]
    ref = ref_of(raw)
    found = {isolation_among(ordered, driver, {device.request, device.chosen} - {""}, ref) for device in devices}
    if len(found) > 1:
        raise InvalidArgument("config", f"{ref.describe()}: its devices ask for isolation none and mps at once")
    return found.pop() if found else Isolation.NONE


def isolation_among(configs: Sequence[Mapping[str, Any]], driver: str, names: set[str], ref: ClaimRef) -> Isolation:
    """The isolation a request known by ``names`` (its name, and ``main/sub`` for a firstAvailable
    choice) gets from ``configs`` in order: the last opaque ``SharingConfig`` of ``driver`` that
    applies to it (one naming no requests applies to all), ``none`` where none does."""
    chosen = Isolation.NONE
    for config in configs:
        opaque = config.get("opaque") or {}
        applies = config.get("requests") or []
        if opaque.get("driver") == driver and (not applies or names & set(applies)):
            chosen = sharing(opaque.get("parameters"), ref)
    return chosen


def sharing(parameters: Any, ref: ClaimRef) -> Isolation:
    """The isolation of one ``SharingConfig`` (``gpuledger.io/v1alpha1``)."""
    where = f"{ref.describe()}: opaque config of {SHARING_API}"
    if not isinstance(parameters, Mapping):
        raise InvalidArgument("config.opaque.parameters", f"{where} must be an object")
    if (parameters.get("apiVersion"), parameters.get("kind")) != (SHARING_API, SHARING_KIND):
        got = f"{parameters.get('apiVersion')!r} {parameters.get('kind')!r}"
        problem = f"{where}: apiVersion and kind must be {SHARING_API} {SHARING_KIND}, got {got}"
        raise InvalidArgument("config.opaque.parameters", problem)
    unknown = sorted(set(parameters) - {"apiVersion", "kind", "isolation"})
    if unknown:
        raise InvalidArgument("config.opaque.parameters", f"{where}: unknown field(s) {', '.join(unknown)}")
    raw = parameters.get("isolation", Isolation.NONE.value)
    try:
        return Isolation(raw)
    except ValueError:
        choices = "|".join(i.value for i in Isolation)
        problem = f"{where}: isolation must be {choices}, got {raw!r}"
        raise InvalidArgument("config.opaque.parameters.isolation", problem) from None


def node_of(ref: ClaimRef, devices: Sequence[AllocatedDevice]) -> NodeName:
    """The one node (pool) a claim's devices are on; a claim over several pools is refused."""
    pools = sorted({d.pool for d in devices})
    if len(pools) != 1:
        raise InvalidArgument("status.allocation", f"{ref.describe()} holds devices in pools {', '.join(pools)}")
    return NodeName(pools[0])


def allocation_id(ref: ClaimRef, devices: Sequence[AllocatedDevice]) -> AllocationId:
    """The same id for the same allocation of the same claim, whoever computes it: a second
    controller (or a retry after a lost answer) finds the entry written and adds none."""
    parts = [ref.uid, *sorted(f"{d.pool}/{d.device}/{d.share_id or ''}" for d in devices)]
    return AllocationId("c-" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:16])


def card_of(node: Node, device: AllocatedDevice) -> Card:
    """The card of a card's device (``gpu-<index>``) or of one of its MIG placements."""
    placement = dra_mig.parse(device.device)
    index = str(placement[0]) if placement else device.device.removeprefix(DEVICE_PREFIX)
    card = next((c for c in node.cards if str(c.index) == index), None) if index != device.device else None
    if card is None:
        raise InvalidArgument("device", f"{device.device} is no card of node {node.name}")
    return card


def share_of(card: Card, device: AllocatedDevice, memory_step_mib: int = MEMORY_STEP_MIB) -> CardShare:
    """What the device's result holds of its card (see the module's note on whole cards); a MIG
    placement's device holds that placement whole (``mig.share_of``)."""
    if dra_mig.is_mig_device(device.device):
        slot = dra_mig.slot_of(card, device.device)
        model = mig.model_of(card)
        profile = model.by_name(slot.profile) if model is not None else None
        assert profile is not None  # slot_of found it in this very model
        return mig.share_of(card, profile, slot.start)
    if device.share_id is None or device.memory_bytes is None:
        return CardShare(card.uuid, card.index, card.memory_mib, CORE_WHOLE, exclusive=True)
    mem_mib = -(-device.memory_bytes // MIB)
    core_milli = CORE_WHOLE if device.compute is None else min(CORE_WHOLE, device.compute * 10)
    published = card.memory_mib // memory_step_mib * memory_step_mib
    if mem_mib >= published and core_milli >= CORE_WHOLE:
        return CardShare(card.uuid, card.index, card.memory_mib, CORE_WHOLE, exclusive=True)
    return CardShare(card.uuid, card.index, mem_mib, core_milli)  # more than the card has: the ledger refuses


def ledger_allocation(
    ref: ClaimRef,
    devices: Sequence[AllocatedDevice],
    node: Node,
    now: float,
    memory_step_mib: int = MEMORY_STEP_MIB,
    isolation: Isolation = Isolation.NONE,
) -> Allocation:
    """The claim's allocation as the ledger holds it: bound (the claim's allocation is the
    scheduler's word; it lives until the allocation is cleared or the claim deleted, no lease),
    one grant per request of the claim, named after it."""
    if not devices:
        raise InvalidArgument("status.allocation", f"{ref.describe()} holds none of our devices")
    by_request: dict[str, list[CardShare]] = {}
    for device in devices:
        by_request.setdefault(device.request, []).append(share_of(card_of(node, device), device, memory_step_mib))
    grants = tuple(Grant(request, tuple(shares)) for request, shares in by_request.items())
    requests = tuple(_request(shares) for shares in by_request.values())
    return Allocation(
        allocation_id(ref, devices),
        ref.owner,
        node.name,
        grants,
        state=AllocState.BOUND,
        isolation=isolation,
        created_at=now,
        updated_at=now,
        requests=requests,
    )


def _request(shares: Sequence[CardShare]) -> Request:
    first = shares[0]
    if first.mig is not None:
        return Request(len(shares), mig=first.mig.profile)
    if first.exclusive:
        return Request(len(shares))
    return Request(len(shares), first.mem_mib, first.core_milli)
