"""The node's ResourceSlices for DRA mode (driver ``gpu.gpuledger.io``): pure functions, raw JSON.

One device per card, named ``gpu-<index>``, in index order (kube-scheduler allocates first-fit in
slice and device order). Field names are those of ``resource.k8s.io/v1`` (k8s.io/api v0.36):

- attributes (unqualified names belong to the driver's domain): ``uuid``, ``index``, ``minor``, ``model``,
  ``productFamily``, ``memoryMiB``, ``computeCapability`` and ``driverVersion`` (semver),
  ``nvlinkGroup2``/``4``/``8`` (``gpuledger_core.nvlink.nvlink_groups``), and the standard
  ``resource.kubernetes.io/pciBusID``, ``pcieRoot`` and ``numaNode`` where known;
- capacities: ``memory`` (bytes, rounded down to the memory step), ``compute`` (0-100) and ``slots``
  (the most tenants a card takes). A shareable card (more than one slot) has
  ``allowMultipleAllocations`` and a ``requestPolicy`` on each capacity whose default is the whole
  card, so a claim that asks no capacity gets the card to itself;
- an unhealthy card keeps its place and carries the taint ``gpu.gpuledger.io/unhealthy``
  (NoSchedule), so the scheduler skips it and a person sees why;
- with ``binding_conditions`` every device carries ``gpuledger.io/committed`` and
  ``gpuledger.io/rejected`` (the ledger's answer, issue 11 item 2).

A card in MIG mode is no device of its own: it is published as partitionable devices, one per
MIG placement, consuming the counters of a counter set of its own (``slices_mig``); counter sets go
in counters-only slices after the devices' (the API forbids both in one slice).

Slices hold at most 64 devices (the API's limit once any device has a taint, which a card may get
at any time, or consumes counters) and 8 counter sets. The pool is the node; any change bumps the
generation of every slice in it, and
slices beyond the new count are deleted after the others are written (``plan``). What the API
server returns is checked field by field against what was sent (``differences``): a field dropped
by a disabled feature gate is an error that names it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuledger_core.errors import FailedPrecondition, InvalidArgument
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Card, MigSlot, Node, OwnerKind
from gpuledger_core.nvlink import GROUP_SIZES, nvlink_groups
from gpuledger_inventory import slice_fields, slices_mig
from gpuledger_inventory.labels import family
from gpuledger_inventory.slice_fields import (
    MiB,
    binary_quantity,
    held_taint,
    semver,
    string,
    unhealthy_taint,
)

DRIVER = slice_fields.DRIVER
API_VERSION = "resource.k8s.io/v1"
STANDARD = slice_fields.STANDARD
MAX_DEVICES_PER_SLICE = 64  # ResourceSliceMaxDevicesWithTaintsOrConsumesCounters: a card may get a taint
MAX_COUNTER_SETS_PER_SLICE = 8  # ResourceSliceMaxCounterSets
BINDING_CONDITION = "gpuledger.io/committed"
BINDING_FAILURE_CONDITION = "gpuledger.io/rejected"

# Which feature gate of kube-apiserver 1.36 drops which field of a device (resourceslice strategy.go).
GATE_OF_FIELD = {
    "allowMultipleAllocations": "DRAConsumableCapacity",
    "requestPolicy": "DRAConsumableCapacity",
    "taints": "DRADeviceTaints",
    "bindingConditions": "DRADeviceBindingConditions (with DRAResourceClaimDeviceStatus)",
    "bindingFailureConditions": "DRADeviceBindingConditions (with DRAResourceClaimDeviceStatus)",
    "sharedCounters": "DRAPartitionableDevices",
    "consumesCounters": "DRAPartitionableDevices",
}


@dataclass(frozen=True, slots=True)
class SliceConfig:
    """How the devices are published (from the inventory's settings)."""

    slots_per_card: int = 8
    memory_step_mib: int = 256
    binding_conditions: bool = False
    driver: str = DRIVER

    def __post_init__(self) -> None:
        if self.slots_per_card < 1:
            raise InvalidArgument("dra_slots_per_card", f"must be at least 1, got {self.slots_per_card}")
        if self.memory_step_mib < 1:
            raise InvalidArgument("dra_memory_step_mib", f"must be at least 1, got {self.memory_step_mib}")


@dataclass(frozen=True, slots=True)
class CardFacts:
    """What the device needs beyond the domain ``Card``: read by the inventory at scan time."""

    compute_capability: tuple[int, int] | None = None
    pcie_root: str | None = None  # e.g. pci0000:00, from sysfs; None where it cannot be read
    unhealthy_since: float | None = None  # when the card turned unhealthy (the taint's timeAdded)
    held_since: float | None = None  # since when the ledger has holders of the card that are not claims
    tenancy: str = "idle"  # the isolation tier of the card's holders: idle, none, mps or mixed
    mig_held: tuple[tuple[MigSlot, float], ...] = ()  # MIG placements pods or tools hold, each since when


@dataclass(frozen=True, slots=True)
class Plan:
    """What to write: every slice of the pool at ``generation`` (create or update), then deletes."""

    generation: int
    create: tuple[dict[str, Any], ...] = ()
    update: tuple[dict[str, Any], ...] = ()
    delete: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


@dataclass(frozen=True, slots=True)
class Slices:
    """The desired devices of one node, cut into slices (specs without their pool generation)."""

    node: str
    chunks: tuple[tuple[dict[str, Any], ...], ...] = field(default=())  # devices
    counters: tuple[tuple[dict[str, Any], ...], ...] = field(default=())  # counter sets (MIG cards)

    @property
    def count(self) -> int:
        """How many slices the pool has: the devices' first, then the counters-only ones."""
        return len(self.chunks) + len(self.counters)

    def body(self, number: int) -> dict[str, Any]:
        """What slice ``number`` holds: devices, or shared counters (never both: the API forbids it)."""
        if number < len(self.chunks):
            return {"devices": list(self.chunks[number])}
        return {"sharedCounters": list(self.counters[number - len(self.chunks)])}


# --- topology --------------------------------------------------------------------------------------


# --- devices ---------------------------------------------------------------------------------------


def held_outside_dra(ledger: NodeLedger | None) -> dict[str, float]:
    """The cards of which live allocations other than claims' hold some, each with the earliest
    such allocation's time (the taint's timeAdded, stable while they hold it)."""
    held: dict[str, float] = {}
    for allocation in ledger.live() if ledger is not None else ():
        if allocation.owner.kind is OwnerKind.CLAIM:
            continue
        for share in allocation.shares():
            held[share.uuid] = min(held.get(share.uuid, allocation.created_at), allocation.created_at)
    return held


def tenancy_of(ledger: NodeLedger | None) -> dict[str, str]:
    """Each held card's isolation tier, from every live holder (pods, tools, claims): ``none`` or
    ``mps`` when all holders are of that tier, ``mixed`` when both (``mix_isolation``); a card no
    one holds is absent (``idle``)."""
    if ledger is None:
        return {}
    found: dict[str, str] = {}
    for uuid, use in ledger.use().items():
        if use.holders:
            found[uuid] = "mixed" if len(use.tiers) > 1 else next(iter(use.tiers)).value
    return found


def device_name(card: Card) -> str:
    return f"gpu-{card.index}"


def device(
    card: Card,
    facts: CardFacts,
    driver_version: str | None,
    groups: Mapping[int, Mapping[int, int]],
    config: SliceConfig,
) -> dict[str, Any]:
    """The ``Device`` of one card (raw JSON as the API takes it)."""
    attributes = card_attributes(card, facts, driver_version)
    for size, of_size in groups.items():
        if card.index in of_size:
            attributes[f"nvlinkGroup{size}"] = {"int": of_size[card.index]}
    attributes["tenancy"] = string(facts.tenancy)  # DeviceClasses select on it (deploy/kubernetes/dra)
    out: dict[str, Any] = {"name": device_name(card), "attributes": attributes}
    out["capacity"] = capacities(card, config)
    if config.slots_per_card > 1:
        out["allowMultipleAllocations"] = True
    if not card.healthy:
        out["taints"] = [unhealthy_taint(card.health_reason, facts.unhealthy_since)]
    if facts.held_since is not None:
        out.setdefault("taints", []).append(held_taint(facts.held_since))
    out.update(binding(config))
    return out


def card_attributes(card: Card, facts: CardFacts, driver_version: str | None) -> dict[str, Any]:
    """What a device says of its card: the card's own device and each of its MIG placements'."""
    attributes: dict[str, Any] = {
        "uuid": string(card.uuid),
        "index": {"int": card.index},
        "model": string(card.model),
        "productFamily": string(family(facts.compute_capability)),
        "memoryMiB": {"int": card.memory_mib},
    }
    if card.minor is not None:
        attributes["minor"] = {"int": card.minor}  # /dev/nvidia<minor>, for the DRA plugin's CDI spec
    if facts.compute_capability is not None:
        major, minor = facts.compute_capability
        attributes["computeCapability"] = {"version": f"{major}.{minor}.0"}
    if driver_version and (version := semver(driver_version)):
        attributes["driverVersion"] = {"version": version}
    if card.pci_bus_id:
        attributes[f"{STANDARD}/pciBusID"] = string(sysfs_bus_id(card.pci_bus_id))
    if facts.pcie_root:
        attributes[f"{STANDARD}/pcieRoot"] = string(facts.pcie_root)
    if card.numa is not None:
        attributes[f"{STANDARD}/numaNode"] = {"int": card.numa}
    return attributes


def binding(config: SliceConfig) -> dict[str, Any]:
    """The binding conditions every device carries when the ledger commits claims (mode B)."""
    if not config.binding_conditions:
        return {}
    return {"bindingConditions": [BINDING_CONDITION], "bindingFailureConditions": [BINDING_FAILURE_CONDITION]}


def capacities(card: Card, config: SliceConfig) -> dict[str, Any]:
    """``memory`` in bytes (whole steps), ``compute`` 0-100, ``slots``; with request policies when the
    card is shared (the API forbids a policy on a device that takes one allocation)."""
    step = config.memory_step_mib
    memory_mib = card.memory_mib // step * step
    if memory_mib < 2 * step:
        problem = f"{step} MiB is too coarse for {card.uuid} ({card.memory_mib} MiB)"
        raise InvalidArgument("dra_memory_step_mib", problem)
    memory = binary_quantity(memory_mib * MiB)
    out: dict[str, Any] = {
        "memory": {"value": memory},
        "compute": {"value": "100"},
        "slots": {"value": str(config.slots_per_card)},
    }
    if config.slots_per_card > 1:
        step_q = binary_quantity(step * MiB)
        out["memory"]["requestPolicy"] = {"default": memory, "validRange": {"min": step_q, "step": step_q}}
        out["compute"]["requestPolicy"] = {"default": "100", "validRange": {"min": "1", "step": "1"}}
        out["slots"]["requestPolicy"] = {"default": "1", "validValues": ["1"]}
    return out


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` as the standard attribute wants it: ``0000:3b:00.0``."""
    domain, _, rest = bus_id.strip().partition(":")
    return f"{domain[-4:].zfill(4)}:{rest}".lower() if rest else bus_id.lower()


def desired(node: Node, facts: Mapping[str, CardFacts], driver_version: str | None, config: SliceConfig) -> Slices:
    """Every card of ``node`` as a device, or as its MIG placements and their counters
    (``slices_mig``) when it is in MIG mode, cut into slices of at most 64 devices and 8 counter
    sets."""
    groups = {size: nvlink_groups(node, size) for size in GROUP_SIZES}
    cards = sorted(node.cards, key=lambda c: c.index)
    devices = [
        device(card, facts.get(card.uuid, CardFacts()), driver_version, groups, config)
        for card in cards
        if not card.mig
    ]
    places = sorted((p for card in cards for p in slices_mig.placements(card)), key=lambda p: p.order())
    for place in places:
        known = facts.get(place.card.uuid, CardFacts())
        attributes = card_attributes(place.card, known, driver_version)
        item = slices_mig.device(place, attributes, known.unhealthy_since, known.mig_held)
        devices.append({**item, **binding(config)})
    sets = [found for card in cards if (found := slices_mig.counter_set(card)) is not None]
    return Slices(node.name, _cut(devices, MAX_DEVICES_PER_SLICE), _cut(sets, MAX_COUNTER_SETS_PER_SLICE))


def _cut(items: Sequence[dict[str, Any]], size: int) -> tuple[tuple[dict[str, Any], ...], ...]:
    return tuple(tuple(items[i : i + size]) for i in range(0, len(items), size))


# --- the pool --------------------------------------------------------------------------------------


def slice_name(node: str, number: int) -> str:
    return f"{node}-gpuledger-{number}"


def spec(slices: Slices, number: int, generation: int, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "driver": driver,
        "pool": {"name": slices.node, "generation": generation, "resourceSliceCount": slices.count},
        "nodeName": slices.node,
        **slices.body(number),
    }


def manifest(
    slices: Slices, number: int, generation: int, owner: Mapping[str, Any] | None = None, driver: str = DRIVER
) -> dict[str, Any]:
    """The whole ResourceSlice object (``owner``: the Node's ownerReference, so the slices go with it)."""
    metadata: dict[str, Any] = {
        "name": slice_name(slices.node, number),
        "labels": {"app.kubernetes.io/managed-by": "gpuledger"},
    }
    if owner:
        metadata["ownerReferences"] = [dict(owner)]
    body = spec(slices, number, generation, driver)
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": metadata, "spec": body}


def generation_of(found: Mapping[str, Any]) -> int:
    value = found.get("spec", {}).get("pool", {}).get("generation", 0)
    return value if isinstance(value, int) else 0


def plan(
    existing: Sequence[Mapping[str, Any]],
    slices: Slices,
    owner: Mapping[str, Any] | None = None,
    driver: str = DRIVER,
    last: int = 0,
) -> Plan:
    """What turns ``existing`` (this node's slices of the driver, as the API server sent them) into
    ``slices``: nothing when every slice already says it; else all of them at the next generation.
    Updates carry the existing object's resourceVersion (a concurrent writer makes them conflict).
    ``last``: the generation this publisher wrote last, so the generation never goes back when the
    slices were deleted behind its back."""
    by_name = {str(s.get("metadata", {}).get("name")): s for s in existing}
    current = max((generation_of(s) for s in existing), default=0)
    wanted = [manifest(slices, n, current, owner, driver) for n in range(slices.count)]
    names = {w["metadata"]["name"] for w in wanted}
    unchanged = set(by_name) == names and all(same_slice(w, by_name[w["metadata"]["name"]]) for w in wanted)
    if unchanged:
        return Plan(current)
    generation = max(current, last) + 1
    create: list[dict[str, Any]] = []
    update: list[dict[str, Any]] = []
    for n in range(slices.count):
        item = manifest(slices, n, generation, owner, driver)
        old = by_name.get(item["metadata"]["name"])
        if old is None:
            create.append(item)
        else:
            item["metadata"]["resourceVersion"] = old.get("metadata", {}).get("resourceVersion", "")
            update.append(item)
    delete = tuple(sorted(name for name in by_name if name not in names))
    return Plan(generation, tuple(create), tuple(update), delete)


def same_slice(wanted: Mapping[str, Any], found: Mapping[str, Any]) -> bool:
    """``found`` says exactly what ``wanted`` says (its owner and spec; fields the server adds do not
    count)."""
    return (
        not differences(wanted.get("spec", {}), found.get("spec", {}))
        and not differences(found.get("spec", {}), wanted.get("spec", {}))
        and _owners(wanted) == _owners(found)
    )


def _owners(item: Mapping[str, Any]) -> list[tuple[str, str]]:
    refs = item.get("metadata", {}).get("ownerReferences") or []
    return sorted((str(r.get("kind")), str(r.get("uid"))) for r in refs)


def differences(sent: Any, got: Any, path: str = "") -> list[str]:
    """The paths of ``sent`` that ``got`` lacks or holds differently (keys ``got`` adds are fine)."""
    if isinstance(sent, Mapping):
        if not isinstance(got, Mapping):
            return [path or "."]
        found: list[str] = []
        for key, value in sent.items():
            sub = f"{path}.{key}" if path else str(key)
            if key not in got:
                found.append(sub)
            else:
                found.extend(differences(value, got[key], sub))
        return found
    if isinstance(sent, list):
        if not isinstance(got, list) or len(got) != len(sent):
            return [path]
        return [d for i, (a, b) in enumerate(zip(sent, got, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if sent == got else [path]


def check_returned(sent: Mapping[str, Any], returned: Mapping[str, Any]) -> None:
    """Fail, naming every field, when the API server did not keep what was sent (a field of a
    disabled feature gate is dropped silently on write)."""
    missing = differences(sent.get("spec", {}), returned.get("spec", {}))
    if not missing:
        return
    gates = sorted({GATE_OF_FIELD[g] for m in missing for g in GATE_OF_FIELD if _last_key(m) == g})
    hint = f"; the API server's feature gates {', '.join(gates)} are probably off" if gates else ""
    name = sent.get("metadata", {}).get("name", "?")
    raise FailedPrecondition(
        f"ResourceSlice {name}: the API server did not keep {', '.join('spec.' + m for m in missing)}{hint}"
    )


def _last_key(path: str) -> str:
    return re.sub(r"\[\d+\]$", "", path.rsplit(".", 1)[-1])
