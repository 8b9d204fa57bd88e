"""The node's ResourceSlices for DRA mode (driver ``gpu.gpuledger.io``): pure functions, raw JSON.

One device per card, named ``gpu-<index>``, in index order (kube-scheduler allocates first-fit in
slice and device order). Field names are those of ``resource.k8s.io/v1`` (k8s.io/api v0.36):

- attributes (unqualified names belong to the driver's domain): ``uuid``, ``index``, ``minor``, ``model``,
  ``productFamily``, ``memoryMiB``, ``computeCapability`` and ``driverVersion`` (semver),
  ``nvlinkGroup2``/``4``/``8`` (see ``nvlink_groups``), and the standard
  ``resource.kubernetes.io/pciBusID``, ``pcieRoot`` and ``numaNode`` where known;
- capacities: ``memory`` (bytes, rounded down to the memory step), ``compute`` (0-100) and ``slots``
  (the most tenants a card takes). A shareable card (more than one slot) has
  ``allowMultipleAllocations`` and a ``requestPolicy`` on each capacity whose default is the whole
  card, so a claim that asks no capacity gets the card to itself;
- an unhealthy card keeps its place and carries the taint ``gpu.gpuledger.io/unhealthy``
  (NoSchedule), so the scheduler skips it and a person sees why;
- with ``binding_conditions`` every device carries ``gpuledger.io/committed`` and
  ``gpuledger.io/rejected`` (the ledger's answer, issue 11 item 2).

Slices hold at most 64 devices (the API's limit once any device has a taint, which a card may get
at any time). The pool is the node; any change bumps the generation of every slice in it, and
slices beyond the new count are deleted after the others are written (``plan``). What the API
server returns is checked field by field against what was sent (``differences``): a field dropped
by a disabled feature gate is an error that names it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuledger_core.errors import FailedPrecondition, InvalidArgument
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Card, Node, OwnerKind
from gpuledger_inventory.labels import family

DRIVER = "gpu.gpuledger.io"
API_VERSION = "resource.k8s.io/v1"
STANDARD = "resource.kubernetes.io"
MAX_DEVICES_PER_SLICE = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures: taints count as advanced
MAX_STRING = 64  # DeviceAttributeMaxValueLength
TAINT_UNHEALTHY = f"{DRIVER}/unhealthy"
TAINT_HELD = f"{DRIVER}/held"  # the ledger gave (some of) the card to pods or tools outside DRA
BINDING_CONDITION = "gpuledger.io/committed"
BINDING_FAILURE_CONDITION = "gpuledger.io/rejected"
NVLINK_GROUP_SIZES = (2, 4, 8)
MiB = 1024 * 1024

# Which feature gate of kube-apiserver 1.36 drops which field of a device (resourceslice strategy.go).
GATE_OF_FIELD = {
    "allowMultipleAllocations": "DRAConsumableCapacity",
    "requestPolicy": "DRAConsumableCapacity",
    "taints": "DRADeviceTaints",
    "bindingConditions": "DRADeviceBindingConditions (with DRAResourceClaimDeviceStatus)",
    "bindingFailureConditions": "DRADeviceBindingConditions (with DRAResourceClaimDeviceStatus)",
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
    chunks: tuple[tuple[dict[str, Any], ...], ...] = field(default=())


# --- quantities and values -------------------------------------------------------------------------

_BINARY = (("Ei", 1 << 60), ("Pi", 1 << 50), ("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10))


def binary_quantity(n_bytes: int) -> str:
    """A byte count in the API server's canonical form (``25769803776`` -> ``24Gi``), so what comes
    back is what was sent."""
    if n_bytes < 0:
        raise InvalidArgument("quantity", f"must not be negative, got {n_bytes}")
    for suffix, unit in _BINARY:
        if n_bytes and n_bytes % unit == 0:
            return f"{n_bytes // unit}{suffix}"
    return str(n_bytes)


_NUMBER = re.compile(r"\d+")


def semver(text: str) -> str | None:
    """NVIDIA's ``560.35.03`` or a compute capability ``8.6`` as a semantic version (``560.35.3``,
    ``8.6.0``): three numeric parts without leading zeros. None if the text has no number."""
    parts = [str(int(p)) for p in _NUMBER.findall(text)[:3]]
    if not parts:
        return None
    return ".".join(parts + ["0"] * (3 - len(parts)))


def _string(text: str) -> dict[str, str]:
    return {"string": text[:MAX_STRING]}


def _label_value(text: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")[:63].rstrip("-_.")
    return cleaned or "unhealthy"


def rfc3339(at: float) -> str:
    """A time as the API server writes a ``metav1.Time`` (whole seconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(at)))


# --- topology --------------------------------------------------------------------------------------


def nvlink_groups(node: Node, size: int) -> dict[int, int]:
    """Card index -> group id for disjoint sets of ``size`` mutually NVLinked cards (greedy, lowest
    indexes first; the id is the group's lowest index). ``matchAttribute: gpu.gpuledger.io/nvlinkGroup4``
    on a 4-card request then asks for one such set. Cards left out of every full set get no id."""
    linked = {(ln.a, ln.b) for ln in node.links if ln.nvlinks > 0}

    def joined(a: int, b: int) -> bool:
        return (min(a, b), max(a, b)) in linked

    free = sorted(c.index for c in node.cards)
    groups: dict[int, int] = {}
    for start in list(free):
        if start in groups:
            continue
        members = [start]
        for other in free:
            if len(members) == size:
                break
            if other not in groups and other not in members and all(joined(other, m) for m in members):
                members.append(other)
        if len(members) == size:
            groups.update(dict.fromkeys(members, start))
    return groups


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
    attributes: dict[str, Any] = {
        "uuid": _string(card.uuid),
        "index": {"int": card.index},
        "model": _string(card.model),
        "productFamily": _string(family(facts.compute_capability)),
        "memoryMiB": {"int": card.memory_mib},
    }
    if card.minor is not None:
        attributes["minor"] = {"int": card.minor}  # /dev/nvidia<minor>, for the DRA plugin's CDI spec
    if facts.compute_capability is not None:
        major, minor = facts.compute_capability
        attributes["computeCapability"] = {"version": f"{major}.{minor}.0"}
    if driver_version and (version := semver(driver_version)):
        attributes["driverVersion"] = {"version": version}
    for size, of_size in groups.items():
        if card.index in of_size:
            attributes[f"nvlinkGroup{size}"] = {"int": of_size[card.index]}
    if card.pci_bus_id:
        attributes[f"{STANDARD}/pciBusID"] = _string(sysfs_bus_id(card.pci_bus_id))
    if facts.pcie_root:
        attributes[f"{STANDARD}/pcieRoot"] = _string(facts.pcie_root)
    if card.numa is not None:
        attributes[f"{STANDARD}/numaNode"] = {"int": card.numa}
    attributes["tenancy"] = _string(facts.tenancy)  # DeviceClasses select on it (deploy/kubernetes/dra)
    out: dict[str, Any] = {"name": device_name(card), "attributes": attributes}
    out["capacity"] = capacities(card, config)
    if config.slots_per_card > 1:
        out["allowMultipleAllocations"] = True
    if not card.healthy:
        taint = {"key": TAINT_UNHEALTHY, "value": _label_value(card.health_reason), "effect": "NoSchedule"}
        if facts.unhealthy_since is not None:
            taint["timeAdded"] = rfc3339(facts.unhealthy_since)
        out["taints"] = [taint]
    if facts.held_since is not None:
        held = {"key": TAINT_HELD, "value": "outside-dra", "effect": "NoSchedule"}
        out.setdefault("taints", []).append({**held, "timeAdded": rfc3339(facts.held_since)})
    if config.binding_conditions:
        out["bindingConditions"] = [BINDING_CONDITION]
        out["bindingFailureConditions"] = [BINDING_FAILURE_CONDITION]
    return out


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


def desired(
    node: Node, facts: Mapping[str, CardFacts], driver_version: str | None, config: SliceConfig
) -> Slices:
    """Every card of ``node`` as a device, cut into slices of at most 64."""
    groups = {size: nvlink_groups(node, size) for size in NVLINK_GROUP_SIZES}
    devices = [
        device(card, facts.get(card.uuid, CardFacts()), driver_version, groups, config)
        for card in sorted(node.cards, key=lambda c: c.index)
    ]
    chunks = tuple(
        tuple(devices[i : i + MAX_DEVICES_PER_SLICE]) for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)
    )
    return Slices(node.name, chunks)


# --- the pool --------------------------------------------------------------------------------------


def slice_name(node: str, number: int) -> str:
    return f"{node}-gpuledger-{number}"


def spec(slices: Slices, number: int, generation: int, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "driver": driver,
        "pool": {"name": slices.node, "generation": generation, "resourceSliceCount": len(slices.chunks)},
        "nodeName": slices.node,
        "devices": list(slices.chunks[number]),
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
    wanted = [manifest(slices, n, current, owner, driver) for n in range(len(slices.chunks))]
    names = {w["metadata"]["name"] for w in wanted}
    unchanged = set(by_name) == names and all(
        same_slice(w, by_name[w["metadata"]["name"]]) for w in wanted
    )
    if unchanged:
        return Plan(current)
    generation = max(current, last) + 1
    create: list[dict[str, Any]] = []
    update: list[dict[str, Any]] = []
    for n in range(len(slices.chunks)):
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
    return not differences(wanted.get("spec", {}), found.get("spec", {})) and not differences(
        found.get("spec", {}), wanted.get("spec", {})
    ) and _owners(wanted) == _owners(found)


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

